#include "fabric/rendezvous/prefix_store.h"

namespace cofab {

StatusOr<std::string> PrefixStore::full(std::string_view key) const {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  return prefix_ + std::string(key);
}

StatusOr<std::vector<std::string>> PrefixStore::fullKeys(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    COFAB_ASSIGN_OR_RETURN(std::string f, full(k));
    out.push_back(std::move(f));
  }
  return out;
}

Status PrefixStore::set(std::string_view key, const Bytes& value) {
  COFAB_ASSIGN_OR_RETURN(std::string k, full(key));
  return base_->set(k, value);
}

Status PrefixStore::setBy(std::string_view key, const Bytes& value, Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(std::string k, full(key));
  return base_->setBy(k, value, deadline);
}

StatusOr<Bytes> PrefixStore::get(std::string_view key, Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(std::string k, full(key));
  return base_->get(k, deadline);
}

StatusOr<int64_t> PrefixStore::add(std::string_view key, int64_t delta) {
  COFAB_ASSIGN_OR_RETURN(std::string k, full(key));
  return base_->add(k, delta);
}

Status PrefixStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(auto k, fullKeys(keys));
  return base_->wait(k, deadline);
}

StatusOr<Bytes> PrefixStore::compareSet(std::string_view key, const Bytes& expected,
                                        const Bytes& desired) {
  COFAB_ASSIGN_OR_RETURN(std::string k, full(key));
  return base_->compareSet(k, expected, desired);
}

StatusOr<bool> PrefixStore::remove(std::string_view key) {
  COFAB_ASSIGN_OR_RETURN(std::string k, full(key));
  return base_->remove(k);
}

StatusOr<bool> PrefixStore::check(const std::vector<std::string>& keys) {
  COFAB_ASSIGN_OR_RETURN(auto k, fullKeys(keys));
  return base_->check(k);
}

}  // namespace cofab
