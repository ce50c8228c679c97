// The loopback Context and Listener, and the process-wide address table they meet through.
#include <atomic>
#include <map>
#include <thread>

#include "fabric/transport/accept_queue.h"
#include "fabric/transport/loopback/factory.h"
#include "fabric/transport/loopback/loopback_connection.h"

namespace cofab::transport::loopback {
namespace {

constexpr std::string_view kScheme = "loopback:";

class ContextState;

class ListenerImpl {
 public:
  ListenerImpl(std::string address, std::shared_ptr<ContextState> ctx,
               std::shared_ptr<Worker> worker)
      : address_(std::move(address)),
        ctx_(std::move(ctx)),
        queue_("loopback " + address_,
               [worker](std::function<void()> fn) { return worker->post(std::move(fn)); }) {}
  const std::string& address() const { return address_; }
  AcceptQueue& queue() { return queue_; }
  const std::shared_ptr<ContextState>& ctx() const { return ctx_; }
  void close();

 private:
  const std::string address_;
  std::shared_ptr<ContextState> ctx_;
  AcceptQueue queue_;
};

// The in-process analogue of the kernel's port table: addresses are unique per process.
struct AddressTable {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<ListenerImpl>, std::less<>> listeners;
  uint64_t next = 1;
};
AddressTable& addressTable() {
  static AddressTable* t = new AddressTable();  // never destroyed: used from static dtors
  return *t;
}

class ContextState {
 public:
  ContextOptions options;
  LoopbackOptions loopback;
  std::shared_ptr<Worker> worker = std::make_shared<Worker>();

  bool track(const std::shared_ptr<Endpoint>& ep) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    std::erase_if(endpoints_, [](const auto& w) { return w.expired(); });
    endpoints_.push_back(ep);
    return true;
  }
  bool track(const std::shared_ptr<ListenerImpl>& l) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    std::erase_if(listeners_, [](const auto& w) { return w.expired(); });
    listeners_.push_back(l);
    return true;
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  bool closeAll() {
    std::vector<std::weak_ptr<Endpoint>> eps;
    std::vector<std::weak_ptr<ListenerImpl>> ls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      closed_ = true;
      eps.swap(endpoints_);
      ls.swap(listeners_);
    }
    for (auto& w : ls) {
      if (auto l = w.lock()) l->close();
    }
    for (auto& w : eps) {
      if (auto e = w.lock()) e->close();
    }
    return true;
  }

 private:
  mutable std::mutex mu_;
  bool closed_ = false;
  std::vector<std::weak_ptr<Endpoint>> endpoints_;
  std::vector<std::weak_ptr<ListenerImpl>> listeners_;
};

void ListenerImpl::close() {
  queue_.close();
  auto& t = addressTable();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.listeners.find(address_);
  if (it != t.listeners.end() && (it->second.expired() || it->second.lock().get() == this)) {
    t.listeners.erase(it);
  }
}

class LoopbackListener final : public Listener {
 public:
  explicit LoopbackListener(std::shared_ptr<ListenerImpl> impl) : impl_(std::move(impl)) {}
  ~LoopbackListener() override { impl_->close(); }
  const std::string& address() const override { return impl_->address(); }
  StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline) override {
    return impl_->queue().accept(deadline);
  }
  void acceptAsync(AcceptCallback done) override { impl_->queue().acceptAsync(std::move(done)); }
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<ListenerImpl> impl_;
};

class LoopbackContext final : public Context {
 public:
  explicit LoopbackContext(std::shared_ptr<ContextState> state) : state_(std::move(state)) {}
  ~LoopbackContext() override { join(); }

  const std::string& name() const override { return name_; }
  bool isViable() const override { return !state_->closed(); }

  StatusOr<std::unique_ptr<Listener>> listen(const ListenOptions& options) override {
    if (state_->closed()) return FailedPrecondition("loopback: listen on a closed context");
    auto& t = addressTable();
    std::string address = options.address;
    std::shared_ptr<ListenerImpl> impl;
    {
      std::lock_guard<std::mutex> lock(t.mu);
      if (address.empty()) address = std::string(kScheme) + std::to_string(t.next++);
      if (address.rfind(kScheme, 0) != 0 || address.size() == kScheme.size()) {
        return InvalidArgument("loopback listen: address '" + address +
                               "' must look like 'loopback:<name>'");
      }
      auto it = t.listeners.find(address);
      if (it != t.listeners.end() && !it->second.expired()) {
        return Unavailable("loopback listen: address '" + address + "' is already in use");
      }
      impl = std::make_shared<ListenerImpl>(address, state_, state_->worker);
      t.listeners[address] = impl;
    }
    if (!state_->track(impl)) {
      impl->close();
      return FailedPrecondition("loopback: listen on a closed context");
    }
    return std::unique_ptr<Listener>(std::make_unique<LoopbackListener>(std::move(impl)));
  }

  StatusOr<std::shared_ptr<Connection>> connect(const std::string& address,
                                                const ConnectOptions& options,
                                                Deadline deadline) override {
    if (state_->closed()) return FailedPrecondition("loopback: connect on a closed context");
    if (address.rfind(kScheme, 0) != 0) {
      return InvalidArgument("loopback connect: address '" + address +
                             "' must look like 'loopback:<name>'");
    }
    auto backoff = std::chrono::milliseconds(1);
    while (true) {
      std::shared_ptr<ListenerImpl> listener;
      {
        auto& t = addressTable();
        std::lock_guard<std::mutex> lock(t.mu);
        auto it = t.listeners.find(address);
        if (it != t.listeners.end()) listener = it->second.lock();
      }
      if (listener && !listener->queue().closed()) return connectTo(*listener, address, options);
      if (deadline.expired()) {
        return DeadlineExceeded("loopback connect to " + address +
                                ": no listener there by the deadline");
      }
      std::this_thread::sleep_for(std::min<Duration>(backoff, deadline.remaining()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
    }
  }

  StatusOr<std::unique_ptr<MemoryRegion>> registerMemory(void* data, size_t size) override {
    if (data == nullptr && size > 0) {
      return InvalidArgument("registerMemory: null pointer with " + std::to_string(size) +
                             " bytes");
    }
    return std::make_unique<MemoryRegion>(data, size);
  }

  void close() override {
    if (state_->closeAll()) state_->worker->stop();
  }
  void join() override {
    close();
    std::lock_guard<std::mutex> lock(joinMu_);
    state_->worker->join();
  }

 private:
  StatusOr<std::shared_ptr<Connection>> connectTo(ListenerImpl& listener,
                                                  const std::string& address,
                                                  const ConnectOptions& options) {
    const auto& server = listener.ctx();
    Endpoint::Params cp;
    cp.worker = state_->worker;
    cp.peerId = server->options.localId;
    cp.peerAddress = address;
    cp.maxPayload = state_->options.maxPayload;
    cp.faults = state_->loopback.faults;
    Endpoint::Params sp;
    sp.worker = server->worker;
    sp.peerId = options.localId;
    sp.peerAddress = "loopback:client-of-" + address.substr(kScheme.size());
    sp.maxPayload = server->options.maxPayload;
    sp.faults = server->loopback.faults;
    auto client = std::make_shared<Endpoint>(std::move(cp));
    auto srv = std::make_shared<Endpoint>(std::move(sp));
    client->setPeer(srv);
    srv->setPeer(client);
    if (!state_->track(client)) return FailedPrecondition("loopback: connect on a closed context");
    if (!server->track(srv)) {
      client->close();
      return Unavailable("loopback connect to " + address + ": the listener's context is closed");
    }
    auto clientConn = std::make_shared<LoopbackConnection>(std::move(client));
    listener.queue().deliver(std::make_shared<LoopbackConnection>(std::move(srv)));
    return std::shared_ptr<Connection>(std::move(clientConn));
  }

  const std::string name_ = "loopback";
  std::shared_ptr<ContextState> state_;
  std::mutex joinMu_;
};

}  // namespace

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const LoopbackOptions& loopback) {
  auto state = std::make_shared<ContextState>();
  state->options = options;
  state->loopback = loopback;
  return std::shared_ptr<Context>(std::make_shared<LoopbackContext>(std::move(state)));
}

Status injectFaults(Connection& conn, const FaultPlan& faults) {
  auto* lc = dynamic_cast<LoopbackConnection*>(&conn);
  if (lc == nullptr) {
    return InvalidArgument("injectFaults: " + conn.describe() + " is not a loopback connection");
  }
  lc->endpoint().setFaults(faults);
  return OkStatus();
}

}  // namespace cofab::transport::loopback
