// Placeholder so the API header can be built against while the implementation lands.
#include "fabric/ps/push_pull.h"

#include <condition_variable>
#include <mutex>

namespace cofab::ps {

namespace detail {
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};
}  // namespace detail

bool PushPullHandle::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}
Status PushPullHandle::wait(Deadline deadline) const {
  if (!state_) return FailedPrecondition("wait() on an invalid PushPullHandle");
  std::unique_lock<std::mutex> lock(state_->mu);
  while (!state_->done) {
    if (state_->cv.wait_until(lock, deadline.when()) == std::cv_status::timeout && !state_->done)
      return DeadlineExceeded("push-pull still in progress");
  }
  return state_->status;
}
Status PushPullHandle::status() const {
  if (!state_) return FailedPrecondition("status() on an invalid PushPullHandle");
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done ? state_->status : Unavailable("in progress");
}

class PushPullClient::Impl {};

StatusOr<std::unique_ptr<PushPullClient>> PushPullClient::connect(Store&, int, int,
                                                                  const ClientOptions&) {
  return Unimplemented("PushPullClient is being implemented");
}
StatusOr<std::unique_ptr<PushPullClient>> PushPullClient::connect(int, int, const ClientOptions&) {
  return Unimplemented("PushPullClient is being implemented");
}
PushPullClient::PushPullClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PushPullClient::~PushPullClient() = default;
PushPullHandle PushPullClient::pushPull(uint64_t, TensorView, TensorView, const PushPullOptions&) {
  auto s = std::make_shared<detail::OpState>();
  s->done = true;
  s->status = Unimplemented("PushPullClient is being implemented");
  return PushPullHandle(s);
}
Status PushPullClient::waitAll(Deadline) { return Unimplemented("not yet"); }
Status PushPullClient::status() const { return Unimplemented("not yet"); }
void PushPullClient::close() {}
int PushPullClient::rank() const { return 0; }
int PushPullClient::worldSize() const { return 0; }
int PushPullClient::numServers() const { return 0; }
size_t PushPullClient::chunkBytes() const { return 0; }
ClientStats PushPullClient::stats() const { return {}; }

}  // namespace cofab::ps
