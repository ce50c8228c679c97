// ForwardingStore: a Store that passes every call on to another one. Tests derive from it and
// override only the calls they change (an injected failure), or use it as is to hand several
// clients a view of one in-memory store.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fabric/rendezvous/store.h"

namespace cofab::testing {

class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store* to) : to_(to) {}
  Status set(std::string_view k, const Bytes& v) override { return to_->set(k, v); }
  StatusOr<Bytes> get(std::string_view k, Deadline d) override { return to_->get(k, d); }
  StatusOr<int64_t> add(std::string_view k, int64_t x) override { return to_->add(k, x); }
  Status wait(const std::vector<std::string>& k, Deadline d) override { return to_->wait(k, d); }
  StatusOr<Bytes> compareSet(std::string_view k, const Bytes& e, const Bytes& d) override {
    return to_->compareSet(k, e, d);
  }
  StatusOr<bool> remove(std::string_view k) override { return to_->remove(k); }
  StatusOr<bool> check(const std::vector<std::string>& k) override { return to_->check(k); }
  std::string describe() const override { return to_->describe(); }

 protected:
  Store* to_;
};

}  // namespace cofab::testing
