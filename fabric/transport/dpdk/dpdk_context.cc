// The dpdk Context and Listener facades, the application side of DpdkConnection, and the
// factory functions of factory.h.
#include <arpa/inet.h>

#include <thread>

#include "core/param.h"
#include "fabric/transport/dpdk/dpdk_connection.h"
#include "fabric/transport/dpdk/engine.h"
#include "fabric/transport/dpdk/factory.h"

namespace cofab::transport::dpdk {
namespace {

COFAB_PARAM_STRING(kPortName, "COFAB_DPDK_PORT", "",
                   "DPDK port a dpdk context uses (e.g. net_memif0); empty: the first free one");
COFAB_PARAM_STRING(kIp, "COFAB_DPDK_IP", "",
                   "IPv4 address of dpdk frames; empty: 10.<last three MAC bytes>");
COFAB_PARAM_INT(kUdpPort, "COFAB_DPDK_UDP_PORT", 47000, 1, 65000,
                "UDP port of a dpdk context's connections (listeners take the next ones)");
COFAB_PARAM_DOUBLE(kDropRate, "COFAB_DPDK_DROP_RATE", 0.0, 0.0, 0.9,
                   "fraction of received dpdk frames dropped on purpose (loss injection)");
COFAB_PARAM_INT(kDropSeed, "COFAB_DPDK_DROP_SEED", 1, 0, INT64_MAX,
                "seed of COFAB_DPDK_DROP_RATE's generator");
COFAB_PARAM_INT(kPeerTimeoutMs, "COFAB_DPDK_PEER_TIMEOUT_MS", 3000, 50, 3600000,
                "a dpdk connection fails with RemoteError after this long without a frame");
COFAB_PARAM_INT(kIdleSpinUs, "COFAB_DPDK_IDLE_SPIN_US", 50, -1, 10'000'000,
                "dpdk poller: microseconds of spinning without work before it naps; -1: "
                "busy-poll forever (lowest latency, one core per context)");
COFAB_PARAM_INT(kIdleNapUs, "COFAB_DPDK_IDLE_NAP_US", 100, 1, 100'000,
                "dpdk poller: length of a nap on a PMD port (memif, af_packet, NIC) when idle");
COFAB_PARAM_INT(kPipeFrames, "COFAB_DPDK_PIPE_FRAMES", 128, 1, 1024,
                "dpdk connection: data frames sent past the newest one the peer acknowledged "
                "(keeps the rings short so retransmissions are not queued behind them)");

class DpdkListener final : public Listener {
 public:
  DpdkListener(std::shared_ptr<Engine> engine, std::shared_ptr<ListenerState> state)
      : engine_(std::move(engine)), state_(std::move(state)) {}
  ~DpdkListener() override { close(); }
  const std::string& address() const override { return state_->address(); }
  StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline) override {
    return state_->queue().accept(deadline);
  }
  void acceptAsync(AcceptCallback done) override { state_->queue().acceptAsync(std::move(done)); }
  void close() override { engine_->closeListener(state_); }

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<ListenerState> state_;
};

class DpdkContext final : public Context {
 public:
  explicit DpdkContext(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  ~DpdkContext() override { join(); }

  const std::string& name() const override { return name_; }
  bool isViable() const override { return engine_->running(); }
  StatusOr<std::unique_ptr<Listener>> listen(const ListenOptions& options) override {
    COFAB_ASSIGN_OR_RETURN(auto state, engine_->listen(options.address));
    return std::unique_ptr<Listener>(new DpdkListener(engine_, std::move(state)));
  }
  StatusOr<std::shared_ptr<Connection>> connect(const std::string& address,
                                                const ConnectOptions& options,
                                                Deadline deadline) override {
    COFAB_ASSIGN_OR_RETURN(auto conn, engine_->connect(address, options.localId, deadline));
    return std::shared_ptr<Connection>(std::make_shared<DpdkConnection>(engine_, conn));
  }
  StatusOr<std::unique_ptr<MemoryRegion>> registerMemory(void* data, size_t size) override {
    // Frames are built by copying into mbufs, so registration only records the range.
    if (data == nullptr) return InvalidArgument("registerMemory: null pointer");
    return std::make_unique<MemoryRegion>(data, size);
  }
  void close() override { engine_->stop(); }
  void join() override { engine_->join(); }

  Engine& engine() const { return *engine_; }

 private:
  const std::string name_ = "dpdk";
  std::shared_ptr<Engine> engine_;
};

StatusOr<uint32_t> parseIp(const std::string& text) {
  in_addr a;
  if (inet_pton(AF_INET, text.c_str(), &a) != 1) {
    return InvalidArgument("'" + text + "' is not an IPv4 address (COFAB_DPDK_IP)");
  }
  return ntohl(a.s_addr);
}

}  // namespace

Status DpdkConnection::stoppedStatus(const char* op) const {
  Status s = conn_->statusSnapshot();
  if (!s.ok()) return s;
  return FailedPrecondition(std::string(op) + " on " + conn_->describe() +
                            ": the dpdk context is closed");
}

void DpdkConnection::send(const wire::Header& header, ConstSlices payload, SendCallback done) {
  std::vector<ConstSlice> slices(payload.begin(), payload.end());
  auto cb = std::make_shared<SendCallback>(std::move(done));
  if (!engine_->post([c = conn_, header, slices = std::move(slices), cb]() mutable {
        c->send(header, std::move(slices), std::move(*cb));
      })) {
    offLoop_->post([cb, s = stoppedStatus("send")] {
      if (*cb) (*cb)(s);
    });
  }
}

void DpdkConnection::recv(MutableSlices dest, RecvCallback done) {
  std::vector<MutableSlice> slices(dest.begin(), dest.end());
  auto cb = std::make_shared<RecvCallback>(std::move(done));
  if (!engine_->post([c = conn_, slices = std::move(slices), cb]() mutable {
        c->recv(std::move(slices), std::move(*cb));
      })) {
    offLoop_->post([cb, s = stoppedStatus("recv")] {
      if (*cb) (*cb)(s, wire::Header{});
    });
  }
}

void DpdkConnection::recvOwned(RecvOwnedCallback done) { recvRouted(nullptr, std::move(done)); }

void DpdkConnection::recvRouted(RecvRoute route, RecvOwnedCallback done) {
  auto cb = std::make_shared<RecvOwnedCallback>(std::move(done));
  if (!engine_->post([c = conn_, route = std::move(route), cb]() mutable {
        c->recvRouted(std::move(route), std::move(*cb));
      })) {
    offLoop_->post([cb, s = stoppedStatus("recv")] {
      if (*cb) (*cb)(s, wire::Header{}, {});
    });
  }
}

void DpdkConnection::close() {
  conn_->noteClosedByApp();
  engine_->post([c = conn_] { c->close(); });  // after stop the engine closed it already
}

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const DpdkOptions& dpdk) {
  EngineOptions e;
  e.localId = options.localId;
  e.maxPayload = options.maxPayload;
  if (dpdk.port.empty()) {
    COFAB_ASSIGN_OR_RETURN(e.port, kPortName.get());
  } else {
    e.port = dpdk.port;
  }
  std::string ip = dpdk.ip;
  if (ip.empty()) {
    COFAB_ASSIGN_OR_RETURN(ip, kIp.get());
  }
  if (!ip.empty()) {
    COFAB_ASSIGN_OR_RETURN(e.ip, parseIp(ip));
  }
  int64_t udp = dpdk.udpPort;
  if (udp == 0) {
    COFAB_ASSIGN_OR_RETURN(udp, kUdpPort.get());
  }
  if (udp <= 0 || udp > 65000) return InvalidArgument("dpdk udpPort must be in [1, 65000]");
  e.udpPort = static_cast<uint16_t>(udp);
  double rate = dpdk.dropRate;
  if (rate < 0) {
    COFAB_ASSIGN_OR_RETURN(rate, kDropRate.get());
  }
  if (rate > 0.9) return InvalidArgument("dpdk dropRate must be in [0, 0.9]");
  e.dropRate = rate;
  if (!(dpdk.corruptRate >= 0 && dpdk.corruptRate <= 0.5)) {
    return InvalidArgument("dpdk corruptRate must be in [0, 0.5]");
  }
  e.corruptRate = dpdk.corruptRate;
  if (!(dpdk.dropDataRate >= 0 && dpdk.dropDataRate <= 1)) {
    return InvalidArgument("dpdk dropDataRate must be in [0, 1]");
  }
  e.dropDataRate = dpdk.dropDataRate;
  int64_t seed = dpdk.dropSeed;
  if (seed < 0) {
    COFAB_ASSIGN_OR_RETURN(seed, kDropSeed.get());
  }
  e.dropSeed = static_cast<uint64_t>(seed);
  // Options given in code take the ranges their variables have (a 5 ms peer timeout passed).
  int64_t timeout = dpdk.peerTimeoutMs;
  if (timeout <= 0) {
    COFAB_ASSIGN_OR_RETURN(timeout, kPeerTimeoutMs.get());
  } else {
    COFAB_ASSIGN_OR_RETURN(
        timeout, kPeerTimeoutMs.parse(std::to_string(timeout), "DpdkOptions::peerTimeoutMs"));
  }
  e.peerTimeoutNs = static_cast<uint64_t>(timeout) * 1'000'000;
  int64_t spin = dpdk.idleSpinUs;
  if (spin < -1) {
    COFAB_ASSIGN_OR_RETURN(spin, kIdleSpinUs.get());
  }
  e.idleSpinNs = spin < 0 ? -1 : spin * 1000;
  int64_t nap = dpdk.idleNapUs;
  if (nap <= 0) {
    COFAB_ASSIGN_OR_RETURN(nap, kIdleNapUs.get());
  } else {
    COFAB_ASSIGN_OR_RETURN(nap, kIdleNapUs.parse(std::to_string(nap), "DpdkOptions::idleNapUs"));
  }
  // A napping poller sends nothing, keepalives included (every peer timeout / 4 at most): a nap
  // of up to 100 ms against a 50 ms peer timeout made idle peers fail each other. At most an
  // eighth of the peer timeout, so two keepalives always fit.
  e.idleNapNs = std::min<uint64_t>(static_cast<uint64_t>(nap) * 1000, e.peerTimeoutNs / 8);
  int64_t pipe = dpdk.pipeFrames;
  if (pipe == 0) {
    COFAB_ASSIGN_OR_RETURN(pipe, kPipeFrames.get());
  }
  if (pipe < 0 || pipe > 1024) {
    return InvalidArgument("dpdk: pipeFrames " + std::to_string(pipe) +
                           " is outside 1..1024 (the window; 0 takes COFAB_DPDK_PIPE_FRAMES)");
  }
  e.pipeFrames = static_cast<uint32_t>(pipe);
  COFAB_ASSIGN_OR_RETURN(auto engine, Engine::create(e));
  return std::shared_ptr<Context>(std::make_shared<DpdkContext>(std::move(engine)));
}

StatusOr<DpdkStats> stats(const Context& context) {
  const auto* c = dynamic_cast<const DpdkContext*>(&context);
  if (c == nullptr) return InvalidArgument("stats: '" + context.name() + "' is not a dpdk context");
  return c->engine().stats();
}

Status injectFrame(Context& context, std::span<const uint8_t> frame) {
  auto* c = dynamic_cast<DpdkContext*>(&context);
  if (c == nullptr) return InvalidArgument("injectFrame: not a dpdk context");
  return c->engine().inject(frame);
}

StatusOr<ConnectionIds> connectionIds(const Connection& connection) {
  const auto* c = dynamic_cast<const DpdkConnection*>(&connection);
  if (c == nullptr) return InvalidArgument("connectionIds: not a dpdk connection");
  // Both are set once, before the application gets the connection.
  return ConnectionIds{c->conn().id(), c->conn().peerConn()};
}

StatusOr<std::string> localAddress(const Context& context) {
  const auto* c = dynamic_cast<const DpdkContext*>(&context);
  if (c == nullptr) return InvalidArgument("localAddress: not a dpdk context");
  return c->engine().local().toString();
}

}  // namespace cofab::transport::dpdk
