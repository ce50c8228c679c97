#include "fabric/transfer/ordering_policy.h"

#include <tuple>

namespace cofab::transfer {

bool FifoPolicy::before(const UnitInfo& a, const UnitInfo& b) const {
  return std::tie(a.seq, a.chunk) < std::tie(b.seq, b.chunk);
}

bool PriorityPolicy::before(const UnitInfo& a, const UnitInfo& b) const {
  return std::tie(a.priority, a.seq, a.chunk) < std::tie(b.priority, b.seq, b.chunk);
}

bool DeadlinePolicy::before(const UnitInfo& a, const UnitInfo& b) const {
  return std::tie(a.deadline, a.seq, a.chunk) < std::tie(b.deadline, b.seq, b.chunk);
}

StatusOr<std::shared_ptr<const OrderingPolicy>> makeOrderingPolicy(std::string_view name) {
  if (name == "fifo") return std::shared_ptr<const OrderingPolicy>(new FifoPolicy);
  if (name == "priority") return std::shared_ptr<const OrderingPolicy>(new PriorityPolicy);
  if (name == "deadline") return std::shared_ptr<const OrderingPolicy>(new DeadlinePolicy);
  return InvalidArgument("unknown ordering policy '" + std::string(name) +
                         "' (choices: fifo, priority, deadline)");
}

}  // namespace cofab::transfer
