// PrefixStore: a view of another Store in which every key is prefixed with "<prefix>/", so
// that independent groups (sub-communicators, jobs, daemons) share one store without collisions.
// Does not own the underlying store; it must outlive the view.
#pragma once

#include "fabric/rendezvous/store.h"

namespace cofab {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store* base) : prefix_(std::move(prefix) + "/"), base_(base) {}

  Status set(std::string_view key, const Bytes& value) override;
  Status setBy(std::string_view key, const Bytes& value, Deadline deadline) override;
  StatusOr<Bytes> get(std::string_view key, Deadline deadline) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<Bytes> compareSet(std::string_view key, const Bytes& expected,
                             const Bytes& desired) override;
  StatusOr<bool> remove(std::string_view key) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  std::string describe() const override { return base_->describe() + " prefix '" + prefix_ + "'"; }

 private:
  // The prefixed key; an empty key stays invalid (it must not become "<prefix>/").
  StatusOr<std::string> full(std::string_view key) const;
  StatusOr<std::vector<std::string>> fullKeys(const std::vector<std::string>& keys) const;

  std::string prefix_;
  Store* base_;
};

}  // namespace cofab
