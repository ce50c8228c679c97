#include "fabric/rendezvous/prefix_store.h"

namespace cofab {

std::vector<std::string> PrefixStore::fullKeys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

Status PrefixStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  return base_->wait(fullKeys(keys), deadline);
}

StatusOr<bool> PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(fullKeys(keys));
}

}  // namespace cofab
