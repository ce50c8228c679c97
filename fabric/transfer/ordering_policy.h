// OrderingPolicy: which queued transfer unit (a chunk of a large update, or a bucket of fused
// small ones) the TransferManager hands to the transport next. The manager asks at every chunk
// boundary (whenever a slot in its in-flight window frees up), so a more urgent update enqueued
// later overtakes the rest of a less urgent one at the next boundary: preemption at chunk
// boundaries.
//
// Policies are pure comparators over the unit's description; any thread, no state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/status.h"

namespace cofab::transfer {

// What a policy sees of a queued unit.
struct UnitInfo {
  uint64_t seq = 0;    // enqueue order of its (first) update, unique per manager
  uint32_t chunk = 0;  // chunk index within the update (0 for a bucket)
  int priority = 0;    // smaller = more urgent (bucket: its most urgent member)
  Clock::time_point deadline = Clock::time_point::max();  // earliest member deadline
};

class OrderingPolicy {
 public:
  virtual ~OrderingPolicy() = default;
  // True if `a` should go before `b`. A strict weak order; ties must be broken by (seq, chunk)
  // so that the order is total and every worker sends the same sequence from the same queue.
  virtual bool before(const UnitInfo& a, const UnitInfo& b) const = 0;
  virtual std::string_view name() const = 0;
};

// Enqueue order, chunks of one update in index order.
class FifoPolicy final : public OrderingPolicy {
 public:
  bool before(const UnitInfo& a, const UnitInfo& b) const override;
  std::string_view name() const override { return "fifo"; }
};

// P3 / ByteScheduler: the smallest priority (layer index: the layer the next forward pass needs
// first) first, FIFO among equals.
class PriorityPolicy final : public OrderingPolicy {
 public:
  bool before(const UnitInfo& a, const UnitInfo& b) const override;
  std::string_view name() const override { return "priority"; }
};

// Earliest deadline first; updates without a deadline after all with one, FIFO among equals.
class DeadlinePolicy final : public OrderingPolicy {
 public:
  bool before(const UnitInfo& a, const UnitInfo& b) const override;
  std::string_view name() const override { return "deadline"; }
};

// "fifo", "priority" or "deadline"; InvalidArgument naming the choices otherwise.
StatusOr<std::shared_ptr<const OrderingPolicy>> makeOrderingPolicy(std::string_view name);

}  // namespace cofab::transfer
