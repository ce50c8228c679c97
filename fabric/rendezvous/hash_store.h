// HashStore: an in-process Store (a map under a mutex with a condition variable), for threads
// acting as ranks in tests and for embedding.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "fabric/rendezvous/store.h"

namespace cofab {

class HashStore final : public Store {
 public:
  Status set(std::string_view key, const Bytes& value) override;
  StatusOr<Bytes> get(std::string_view key, Deadline deadline) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<Bytes> compareSet(std::string_view key, const Bytes& expected,
                             const Bytes& desired) override;
  StatusOr<bool> remove(std::string_view key) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  std::string describe() const override { return "hash://(in-process)"; }

 private:
  // Waits on cv_ until all keys exist; returns the missing ones on timeout.
  std::vector<std::string> waitLocked(std::unique_lock<std::mutex>& lock,
                                      const std::vector<std::string>& keys, Deadline deadline);

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes, std::less<>> data_;
};

// "DeadlineExceeded: store <where>: timed out waiting for key(s) 'a', 'b'" — shared wording.
Status storeWaitTimeout(const std::string& where, const std::vector<std::string>& missing);

}  // namespace cofab
