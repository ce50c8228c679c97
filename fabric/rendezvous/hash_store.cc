#include "fabric/rendezvous/hash_store.h"

namespace cofab {

Status storeWaitTimeout(const std::string& where, const std::vector<std::string>& missing) {
  std::string m = "store " + where + ": timed out waiting for key";
  m += missing.size() == 1 ? " " : "s ";
  for (size_t i = 0; i < missing.size(); ++i) {
    if (i) m += ", ";
    m += "'" + missing[i] + "'";
  }
  return DeadlineExceeded(std::move(m));
}

std::vector<std::string> HashStore::waitLocked(std::unique_lock<std::mutex>& lock,
                                               const std::vector<std::string>& keys,
                                               Deadline deadline) {
  auto missing = [&] {
    std::vector<std::string> out;
    for (const auto& k : keys) {
      if (data_.find(k) == data_.end()) out.push_back(k);
    }
    return out;
  };
  while (true) {
    auto m = missing();
    if (m.empty() || deadline.expired()) return m;
    if (deadline.isNever()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, deadline.when());
    }
  }
}

Status HashStore::set(std::string_view key, const Bytes& value) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  COFAB_RETURN_IF_ERROR(validateStoreValue(value));
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_.insert_or_assign(std::string(key), value);
  }
  cv_.notify_all();
  return OkStatus();
}

StatusOr<Bytes> HashStore::get(std::string_view key, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  auto missing = waitLocked(lock, keys, deadline);
  if (!missing.empty()) return storeWaitTimeout(describe(), missing);
  return data_.find(key)->second;
}

StatusOr<int64_t> HashStore::add(std::string_view key, int64_t delta) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  int64_t result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    COFAB_ASSIGN_OR_RETURN(result,
                           addToCounter(key, it == data_.end() ? nullptr : &it->second, delta));
    data_.insert_or_assign(std::string(key), toBytes(std::to_string(result)));
  }
  cv_.notify_all();
  return result;
}

Status HashStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  for (const auto& k : keys) COFAB_RETURN_IF_ERROR(validateStoreKey(k));
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = waitLocked(lock, keys, deadline);
  if (!missing.empty()) return storeWaitTimeout(describe(), missing);
  return OkStatus();
}

StatusOr<Bytes> HashStore::compareSet(std::string_view key, const Bytes& expected,
                                      const Bytes& desired) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  COFAB_RETURN_IF_ERROR(validateStoreValue(expected));
  COFAB_RETURN_IF_ERROR(validateStoreValue(desired));
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    bool matches = it == data_.end() ? expected.empty() : it->second == expected;
    if (!matches) return it == data_.end() ? Bytes{} : it->second;
    data_.insert_or_assign(std::string(key), desired);
    result = desired;
  }
  cv_.notify_all();
  return result;
}

StatusOr<bool> HashStore::remove(std::string_view key) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  data_.erase(it);
  return true;
}

StatusOr<bool> HashStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) COFAB_RETURN_IF_ERROR(validateStoreKey(k));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

}  // namespace cofab
