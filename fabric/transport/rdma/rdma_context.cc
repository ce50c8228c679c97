// The rdma Context and Listener (contracts: fabric/transport/context.h, listener.h). Connection
// set-up runs over the context's private tcp context (the side channel):
//   client: tcp connect → create QP (INIT, RECVs posted) → send its QpInfo
//   server: receive QpInfo → create QP → RTR → RTS → send its QpInfo
//   client: receive QpInfo → RTR → RTS → send "ready"
//   server: receive "ready" → the connection is accepted.
// So neither side sends RDMA traffic before the other's QP can receive it (RTR).
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "core/log.h"
#include "core/param.h"
#include "fabric/transport/accept_queue.h"
#include "fabric/transport/rdma/factory.h"
#include "fabric/transport/rdma/qp_info.h"
#include "fabric/transport/rdma/rdma_connection.h"
#include "fabric/transport/rdma/rdma_endpoint.h"
#include "fabric/transport/rdma/rdma_memory_region.h"
#include "fabric/transport/rdma/rdma_worker.h"
#include "fabric/transport/tcp/factory.h"

namespace cofab::transport::rdma {
namespace {

COFAB_PARAM_INT(kIbSlots, "COFAB_IB_SLOTS", 32, 2, 4096,
                "rdma: receive slots per connection (the credit window)");
COFAB_PARAM_INT(kIbSlotBytes, "COFAB_IB_SLOT_BYTES", 65536, 4096, 16 << 20,
                "rdma: bytes per receive slot (largest RDMA WRITE; larger messages are chunked)");
COFAB_PARAM_INT(kIbSetupTimeoutMs, "COFAB_IB_SETUP_TIMEOUT_MS", 10000, 1, 3600000,
                "rdma: an accepted connection's set-up (the peer's QP information, then its "
                "ready) must end within this, or its side channel is closed");

// A set-up the accepting side waits for (the connector's QP information, then its ready):
// polled by the worker, it closes the side channel at the deadline, which fails the pending
// receive and releases what the set-up holds (a QP, a CQ, the pinned slots). A connector that
// stalled (stopped, hung, or something else that spoke to the port) held them until the side
// channel ended, possibly never.
class SetUpDeadline final : public Pollable {
 public:
  SetUpDeadline(std::weak_ptr<Connection> conn, Deadline deadline)
      : conn_(std::move(conn)), deadline_(deadline) {}
  // Ends the wait; false when the deadline had ended it first (the side channel is closing).
  bool claim() { return !over_.exchange(true); }
  bool poll() override {
    if (!deadline_.expired() || over_.exchange(true)) return false;
    if (auto c = conn_.lock()) {
      COFAB_LOG(kWarn, "rdma") << "set-up with '" << c->peerId() << "' (" << c->peerAddress()
                               << ") did not end in time (COFAB_IB_SETUP_TIMEOUT_MS): closed";
      c->close();
    }
    return true;
  }
  bool finished() const override { return over_.load(); }
  void shutdown() override { over_.store(true); }

 private:
  std::weak_ptr<Connection> conn_;
  Deadline deadline_;
  std::atomic<bool> over_{false};
};

std::atomic<const VerbsApi*> gRegistryVerbs{nullptr};

wire::Header setupHeader(uint8_t opcode) {
  wire::Header h;
  h.type = wire::MessageType::kControl;
  h.opcode = opcode;
  return h;
}

// What the context, its listeners and their set-up callbacks share.
struct Shared {
  std::shared_ptr<RdmaDevice> device;
  std::shared_ptr<Worker> worker;
  std::shared_ptr<Context> tcp;
  EndpointOptions endpoint;
  int64_t setupTimeoutMs = 0;  // read once, at createContext (a malformed value fails it)
};

class RdmaListener : public Listener {
 public:
  struct Core : std::enable_shared_from_this<Core> {
    std::shared_ptr<Shared> shared;
    std::unique_ptr<Listener> tcp;
    std::unique_ptr<AcceptQueue> queue;

    void acceptNext() {
      auto self = shared_from_this();
      tcp->acceptAsync([self](const Status& s, std::shared_ptr<Connection> conn) {
        if (!s.ok()) return;  // the listener closed
        self->setUp(std::move(conn));
        self->acceptNext();
      });
    }

    // Server side of the set-up, driven by the side channel's callbacks (tcp I/O thread).
    void setUp(std::shared_ptr<Connection> conn) {
      auto self = shared_from_this();
      auto deadline =
          std::make_shared<SetUpDeadline>(conn, Deadline::afterMs(shared->setupTimeoutMs));
      shared->worker->add(deadline);
      conn->recvOwned([self, conn, deadline](const Status& s, const wire::Header& h,
                                             std::vector<uint8_t>&& bytes) {
        if (!s.ok()) {
          deadline->claim();
          return conn->close();
        }
        Status st = self->answer(conn, h, bytes, deadline);
        if (!st.ok()) {
          deadline->claim();
          COFAB_LOG(kWarn, "rdma") << "set-up with '" << conn->peerId() << "' ("
                                  << conn->peerAddress() << ") failed: " << st;
          // The connecting side gets the reason (an ibv_* call that failed here), not only a
          // closed side channel; closed once it is sent (a close cancels pending sends).
          const std::string& text = st.message();
          auto why = std::make_shared<std::vector<uint8_t>>(text.size() + 1);
          (*why)[0] = static_cast<uint8_t>(st.code());
          std::copy(text.begin(), text.end(), why->begin() + 1);
          wire::Header eh = setupHeader(kOpcodeSetupError);
          eh.dtype = DType::kU8;
          conn->send(eh, why->data(), why->size(), [why, conn](const Status&) { conn->close(); });
        }
      });
    }

    Status answer(const std::shared_ptr<Connection>& conn, const wire::Header& h,
                  const std::vector<uint8_t>& bytes,
                  const std::shared_ptr<SetUpDeadline>& deadline) {
      if (h.type != wire::MessageType::kControl || h.opcode != kOpcodeQpInfo) {
        return InvalidArgument("expected QP information, got " + h.describe());
      }
      COFAB_ASSIGN_OR_RETURN(QpInfo remote, decodeQpInfo(bytes));
      COFAB_ASSIGN_OR_RETURN(auto ep, Endpoint::create(shared->device, shared->worker,
                                                      shared->endpoint));
      Status s = ep->connectQp(remote);
      if (!s.ok()) {
        ep->abandon();
        return s;
      }
      const auto info = encodeQpInfo(ep->localInfo());
      auto infoBytes = std::make_shared<std::vector<uint8_t>>(info);
      conn->send(setupHeader(kOpcodeQpInfo), infoBytes->data(), infoBytes->size(),
                 [infoBytes](const Status&) {});
      auto self = shared_from_this();
      conn->recvOwned([self, conn, ep, deadline](const Status& st, const wire::Header& rh,
                                                 std::vector<uint8_t>&&) {
        if (!deadline->claim() || !st.ok() || rh.type != wire::MessageType::kControl ||
            rh.opcode != kOpcodeReady) {
          ep->abandon();
          conn->close();
          return;
        }
        ep->start(conn->peerId(), conn->peerAddress(), conn);
        self->queue->deliver(std::make_shared<RdmaConnection>(ep));
      });
      return OkStatus();
    }
  };

  explicit RdmaListener(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~RdmaListener() override { close(); }

  const std::string& address() const override { return core_->tcp->address(); }
  StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline) override {
    return core_->queue->accept(deadline);
  }
  void acceptAsync(AcceptCallback done) override { core_->queue->acceptAsync(std::move(done)); }
  void close() override {
    core_->queue->close();
    core_->tcp->close();
  }

 private:
  std::shared_ptr<Core> core_;
};

class RdmaContext : public Context {
 public:
  explicit RdmaContext(std::shared_ptr<Shared> shared, ContextOptions options)
      : shared_(std::move(shared)), options_(std::move(options)) {
    // Side channels close only after every endpoint's goodbye is out (worker exit).
    auto tcp = shared_->tcp;
    shared_->worker->setExitHook([tcp] { tcp->close(); });
  }
  ~RdmaContext() override { join(); }

  const std::string& name() const override { return name_; }
  bool isViable() const override { return !closed_.load(); }

  StatusOr<std::unique_ptr<Listener>> listen(const ListenOptions& options) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return FailedPrecondition("rdma: listen on a closed transport context");
    COFAB_ASSIGN_OR_RETURN(auto tcpListener, shared_->tcp->listen(options));
    auto core = std::make_shared<RdmaListener::Core>();
    core->shared = shared_;
    std::weak_ptr<Worker> worker = shared_->worker;
    core->queue = std::make_unique<AcceptQueue>(tcpListener->address(),
                                                [worker](std::function<void()> fn) {
                                                  auto w = worker.lock();
                                                  return w && w->post(std::move(fn));
                                                });
    core->tcp = std::move(tcpListener);
    core->acceptNext();
    listeners_.push_back(core);
    return std::unique_ptr<Listener>(new RdmaListener(core));
  }

  StatusOr<std::shared_ptr<Connection>> connect(const std::string& address,
                                                const ConnectOptions& options,
                                                Deadline deadline) override {
    if (closed_) return FailedPrecondition("rdma: connect on a closed transport context");
    COFAB_ASSIGN_OR_RETURN(auto conn, shared_->tcp->connect(address, options, deadline));
    auto r = clientSetUp(conn, deadline);
    if (!r.ok()) conn->close();
    return r;
  }

  StatusOr<std::unique_ptr<MemoryRegion>> registerMemory(void* data, size_t size) override {
    COFAB_ASSIGN_OR_RETURN(auto mr, RdmaMemoryRegion::create(shared_->device, data, size,
                                                             IBV_ACCESS_REMOTE_WRITE));
    return std::unique_ptr<MemoryRegion>(std::move(mr));
  }

  void close() override {
    std::vector<std::shared_ptr<RdmaListener::Core>> listeners;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_.exchange(true)) return;
      listeners.swap(listeners_);
    }
    for (auto& l : listeners) {
      l->queue->close();
      l->tcp->close();
    }
    shared_->worker->stop();
  }

  void join() override {
    close();
    shared_->worker->join();
    shared_->tcp->join();
  }

 private:
  StatusOr<std::shared_ptr<Connection>> clientSetUp(const std::shared_ptr<Connection>& conn,
                                                    Deadline deadline) {
    COFAB_ASSIGN_OR_RETURN(auto ep, Endpoint::create(shared_->device, shared_->worker,
                                                    shared_->endpoint));
    auto fail = [&](Status s) {
      ep->abandon();
      return s.withContext("rdma set-up with '" + conn->peerId() + "' (" + conn->peerAddress() +
                           ")");
    };
    struct Reply {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      Status status;
      wire::Header header;
      std::vector<uint8_t> bytes;
    };
    auto reply = std::make_shared<Reply>();
    conn->recvOwned([reply](const Status& s, const wire::Header& h, std::vector<uint8_t>&& b) {
      std::lock_guard<std::mutex> lock(reply->mu);
      reply->status = s;
      reply->header = h;
      reply->bytes = std::move(b);
      reply->done = true;
      reply->cv.notify_all();
    });
    auto info = std::make_shared<std::vector<uint8_t>>(encodeQpInfo(ep->localInfo()));
    conn->send(setupHeader(kOpcodeQpInfo), info->data(), info->size(), [info](const Status&) {});
    {
      std::unique_lock<std::mutex> lock(reply->mu);
      if (!reply->cv.wait_until(lock, deadline.when(), [&] { return reply->done; })) {
        return fail(DeadlineExceeded("no QP information from the peer before the deadline"));
      }
    }
    if (!reply->status.ok()) return fail(reply->status);
    if (reply->header.type == wire::MessageType::kControl &&
        reply->header.opcode == kOpcodeSetupError && !reply->bytes.empty()) {
      const uint8_t code = reply->bytes[0];
      const std::string text(reply->bytes.begin() + 1, reply->bytes.end());
      return fail(Status(code > 0 && code <= static_cast<uint8_t>(StatusCode::kInternal)
                             ? static_cast<StatusCode>(code)
                             : StatusCode::kRemoteError,
                         "the accepting side could not set up its end: " + text));
    }
    if (reply->header.type != wire::MessageType::kControl ||
        reply->header.opcode != kOpcodeQpInfo) {
      return fail(InvalidArgument("expected QP information, got " + reply->header.describe()));
    }
    auto remote = decodeQpInfo(reply->bytes);
    if (!remote.ok()) return fail(remote.status());
    if (Status s = ep->connectQp(*remote); !s.ok()) return fail(s);
    // The server's QP is in RTS (it answered); ours is now too. "ready" lets it start sending.
    conn->send(setupHeader(kOpcodeReady), nullptr, 0, [](const Status&) {});
    ep->start(conn->peerId(), conn->peerAddress(), conn);
    return std::shared_ptr<Connection>(std::make_shared<RdmaConnection>(ep));
  }

  const std::string name_ = "rdma";
  std::shared_ptr<Shared> shared_;
  const ContextOptions options_;
  std::mutex mu_;
  std::atomic<bool> closed_{false};
  std::vector<std::shared_ptr<RdmaListener::Core>> listeners_;
};

}  // namespace

void setVerbsForRegistryTesting(const VerbsApi* verbs) { gRegistryVerbs.store(verbs); }

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const RdmaOptions& rdma) {
  const VerbsApi* verbs = rdma.verbs != nullptr ? rdma.verbs : gRegistryVerbs.load();
  if (verbs == nullptr) {
    COFAB_ASSIGN_OR_RETURN(verbs, loadRealVerbs());
  }
  auto shared = std::make_shared<Shared>();
  COFAB_ASSIGN_OR_RETURN(shared->device, RdmaDevice::open(*verbs, rdma.device));
  int64_t slots = rdma.slots;
  if (slots == 0) {
    COFAB_ASSIGN_OR_RETURN(slots, kIbSlots.get());
  }
  int64_t slotBytes = rdma.slotBytes;
  if (slotBytes == 0) {
    COFAB_ASSIGN_OR_RETURN(slotBytes, kIbSlotBytes.get());
  }
  shared->setupTimeoutMs = rdma.setupTimeoutMs;
  if (shared->setupTimeoutMs < 0) {
    return InvalidArgument(
        "rdma: setupTimeoutMs must be >= 0 (0: COFAB_IB_SETUP_TIMEOUT_MS), got " +
        std::to_string(shared->setupTimeoutMs));
  }
  if (shared->setupTimeoutMs == 0) {
    COFAB_ASSIGN_OR_RETURN(shared->setupTimeoutMs, kIbSetupTimeoutMs.get());
  }
  if (slots < 2 || slotBytes < 4096) {
    return InvalidArgument("rdma: need at least 2 slots of 4096 bytes (got " +
                           std::to_string(slots) + " x " + std::to_string(slotBytes) + ")");
  }
  shared->endpoint.slots = static_cast<uint32_t>(slots);
  shared->endpoint.slotBytes = static_cast<uint32_t>(slotBytes);
  shared->endpoint.maxPayload = options.maxPayload;
  COFAB_ASSIGN_OR_RETURN(shared->tcp, tcp::createContext(options, {.loops = 1}));
  shared->worker = std::make_shared<Worker>();
  return std::shared_ptr<Context>(std::make_shared<RdmaContext>(shared, options));
}

}  // namespace cofab::transport::rdma
