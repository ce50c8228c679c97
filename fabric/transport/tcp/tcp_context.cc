#include "fabric/transport/tcp/tcp_context.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>
#include <thread>

#include "core/log.h"
#include "core/param.h"
#include "fabric/transport/tcp/tcp_connection.h"
#include "fabric/transport/tcp/striped_connection.h"
#include "fabric/transport/tcp/tcp_listener.h"

namespace cofab::transport::tcp {

COFAB_PARAM_INT(kTcpLoops, "COFAB_TCP_LOOPS", 1, 1, 64,
                "epoll I/O threads per tcp transport context");
COFAB_PARAM_STRING(kSocketIfname, "COFAB_SOCKET_IFNAME", "",
                   "network interface whose address tcp listeners bind (empty: 127.0.0.1 unless "
                   "an address is given)");
COFAB_PARAM_INT(kConnectTimeoutMs, "COFAB_TCP_CONNECT_TIMEOUT_MS", 10000, 1, 3600000,
                "bound on one tcp connect attempt incl. handshake (retries continue until the "
                "caller's deadline); listeners drop incoming handshakes slower than this");
COFAB_PARAM_INT(kKeepalive, "COFAB_TCP_KEEPALIVE_S", 30, 0, 86400,
                "tcp keepalive idle seconds before probing a silent peer (3 probes); 0: off");
COFAB_PARAM_INT(kSocketBuffer, "COFAB_TCP_SOCKET_BUFFER", 0, 0, 1 << 30,
                "tcp SO_SNDBUF/SO_RCVBUF bytes; 0 keeps the kernel's autotuning");
COFAB_PARAM_INT(kSocketsPerPeer, "COFAB_TCP_SOCKETS_PER_PEER", 1, 1, kMaxSocketsPerPeer,
                "tcp sockets per connection this side opens; messages go round-robin over them");

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const TcpOptions& tcp) {
  auto state = std::make_shared<TcpContextState>();
  state->options = options;
  // A listener sends its localId in every HelloAck, which peers refuse past the handshake
  // bound: refused here, where the misconfigured side hears of it.
  if (options.localId.size() > kMaxHandshakeId) {
    return InvalidArgument("tcp: ContextOptions.localId has " +
                           std::to_string(options.localId.size()) + " bytes (at most " +
                           std::to_string(kMaxHandshakeId) + ")");
  }
  int64_t loops = tcp.loops;
  if (loops <= 0) {
    COFAB_ASSIGN_OR_RETURN(loops, kTcpLoops.get());
  }
  if (tcp.ifname.empty()) {
    COFAB_ASSIGN_OR_RETURN(state->ifname, kSocketIfname.get());
  } else {
    state->ifname = tcp.ifname;
  }
  if (!state->ifname.empty()) {
    // Fail at creation, not at the first listen, when the interface does not exist.
    COFAB_RETURN_IF_ERROR(interfaceAddress(state->ifname).status());
  }
  int64_t buffer = tcp.socketBufferBytes;
  if (buffer < 0) {
    COFAB_ASSIGN_OR_RETURN(buffer, kSocketBuffer.get());
  }
  state->tuning.bufferBytes = static_cast<int>(buffer);
  COFAB_ASSIGN_OR_RETURN(int64_t keepalive, kKeepalive.get());
  state->tuning.keepaliveSeconds = static_cast<int>(keepalive);
  COFAB_ASSIGN_OR_RETURN(state->connectAttemptMs, kConnectTimeoutMs.get());
  int64_t sockets = tcp.socketsPerPeer;
  if (sockets <= 0) {
    COFAB_ASSIGN_OR_RETURN(sockets, kSocketsPerPeer.get());
  } else if (sockets > kMaxSocketsPerPeer) {
    return InvalidArgument("tcp: socketsPerPeer " + std::to_string(sockets) + " is above " +
                           std::to_string(kMaxSocketsPerPeer));
  }
  state->socketsPerPeer = static_cast<int>(sockets);
  for (int64_t i = 0; i < loops; ++i) {
    COFAB_ASSIGN_OR_RETURN(auto loop, EpollLoop::start("cofab-tcp" + std::to_string(i)));
    state->loops.push_back(std::shared_ptr<EpollLoop>(std::move(loop)));
  }
  return std::shared_ptr<Context>(std::make_shared<TcpContext>(std::move(state)));
}

StatusOr<std::shared_ptr<Connection>> TcpContextState::adopt(Fd fd, std::string peerId,
                                                             std::string peerAddress) {
  TcpConnectionImpl::Params p;
  p.fd = std::move(fd);
  p.peerId = std::move(peerId);
  p.peerAddress = std::move(peerAddress);
  p.maxPayload = options.maxPayload;
  p.loop = nextLoop();
  auto impl = std::make_shared<TcpConnectionImpl>(std::move(p));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Cancelled("tcp: the transport context is closed");
    std::erase_if(conns_, [](const auto& w) { return w.expired(); });
    conns_.push_back(impl);
  }
  COFAB_RETURN_IF_ERROR(impl->attach());
  return std::shared_ptr<Connection>(std::make_shared<TcpConnection>(std::move(impl)));
}

bool TcpContextState::track(const std::shared_ptr<TcpListenerImpl>& listener) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  std::erase_if(listeners_, [](const auto& w) { return w.expired(); });
  listeners_.push_back(listener);
  return true;
}

bool TcpContextState::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

bool TcpContextState::closeAll() {
  std::vector<std::weak_ptr<TcpConnectionImpl>> conns;
  std::vector<std::weak_ptr<TcpListenerImpl>> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    closed_ = true;
    conns.swap(conns_);
    listeners.swap(listeners_);
  }
  for (auto& w : listeners) {
    if (auto l = w.lock()) l->close();
  }
  for (auto& w : conns) {
    if (auto c = w.lock()) c->close();
  }
  return true;
}

namespace {

uint64_t randomToken() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 ^ rd()) + counter.fetch_add(1);
}

// Hello{our id, stripe group} -> HelloAck{their id}; returns their id.
StatusOr<std::string> clientHandshake(int fd, const std::string& text, const std::string& localId,
                                      const StripeGroup& group, Deadline deadline,
                                      const std::function<bool()>& cancelled) {
  wire::Header hello;
  hello.type = wire::MessageType::kHello;
  hello.payloadLength = localId.size();
  if (group.count > 1) {
    hello.key = group.token;
    hello.chunkIndex = group.index;
    hello.chunkCount = group.count;
  }
  std::string out(wire::kHeaderSize, '\0');
  wire::encodeHeader(hello, reinterpret_cast<uint8_t*>(out.data()));
  out += localId;
  COFAB_RETURN_IF_ERROR(writeAll(fd, out.data(), out.size(), deadline, text, cancelled));
  uint8_t hdr[wire::kHeaderSize];
  COFAB_RETURN_IF_ERROR(readAll(fd, hdr, sizeof(hdr), deadline, text, cancelled));
  auto ack = wire::decodeHeader({hdr, sizeof(hdr)}, {kMaxHandshakeId});
  if (!ack.ok()) return ack.status().withContext("tcp handshake with " + text);
  if (ack->type != wire::MessageType::kHelloAck) {
    return DataLoss("tcp handshake with " + text + ": expected HelloAck, got " +
                    std::string(wire::messageTypeName(ack->type)));
  }
  std::string peerId(ack->payloadLength, '\0');
  COFAB_RETURN_IF_ERROR(readAll(fd, peerId.data(), peerId.size(), deadline, text, cancelled));
  return peerId;
}

}  // namespace

StatusOr<std::unique_ptr<Listener>> TcpContext::listen(const ListenOptions& options) {
  if (state_->closed()) return FailedPrecondition("tcp: listen on a closed transport context");
  SockAddr addr;
  if (!options.address.empty()) {
    StatusOr<SockAddr> parsed = parseAddress(options.address);
    if (!parsed.ok()) {  // a bind address that does not resolve is the caller's to fix
      return InvalidArgument(parsed.status().message());
    }
    addr = *parsed;
  } else if (!state_->ifname.empty()) {
    COFAB_ASSIGN_OR_RETURN(addr, interfaceAddress(state_->ifname));
    if (addr.family() == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&addr.storage)->sin6_port = 0;
    } else {
      reinterpret_cast<sockaddr_in*>(&addr.storage)->sin_port = 0;
    }
  } else {
    COFAB_ASSIGN_OR_RETURN(addr, parseAddress("127.0.0.1:0"));
  }
  const std::string text = addr.toString();
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoStatus(StatusCode::kIoError, "socket", errno, text);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (state_->tuning.bufferBytes > 0) {
    // Set on the listening socket so accepted sockets inherit a window negotiated for it.
    int b = state_->tuning.bufferBytes;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &b, sizeof(b));
  }
  if (::bind(fd.get(), addr.get(), addr.len) != 0) {
    const int err = errno;
    if (err == EADDRNOTAVAIL) {
      return InvalidArgument("tcp listen on " + text +
                             ": not an address of this host; available: " + describeInterfaces());
    }
    return errnoStatus(err == EADDRINUSE ? StatusCode::kUnavailable : StatusCode::kIoError,
                       "bind", err, text);
  }
  if (::listen(fd.get(), 1024) != 0) return errnoStatus(StatusCode::kIoError, "listen", errno, text);
  SockAddr bound;
  bound.len = sizeof(bound.storage);
  if (::getsockname(fd.get(), bound.get(), &bound.len) != 0) {
    return errnoStatus(StatusCode::kIoError, "getsockname", errno, text);
  }
  auto impl = std::make_shared<TcpListenerImpl>(state_, state_->nextLoop(), std::move(fd),
                                                bound.toString());
  if (!state_->track(impl)) return FailedPrecondition("tcp: listen on a closed transport context");
  COFAB_RETURN_IF_ERROR(impl->attach());
  return std::unique_ptr<Listener>(std::make_unique<TcpListener>(std::move(impl)));
}

StatusOr<std::shared_ptr<Connection>> TcpContext::connect(const std::string& address,
                                                          const ConnectOptions& options,
                                                          Deadline deadline) {
  if (state_->closed()) return FailedPrecondition("tcp: connect on a closed transport context");
  if (options.localId.size() > kMaxHandshakeId) {
    return InvalidArgument("tcp connect: localId is " + std::to_string(options.localId.size()) +
                           " bytes (at most " + std::to_string(kMaxHandshakeId) + ")");
  }
  // Resolved again until the deadline while the name does not resolve (yet): a peer's DNS
  // record may appear only once it runs (cofab-aggd --peers agg-0:7000 before agg-0 exists).
  StatusOr<std::vector<SockAddr>> parsed = resolveAddresses(address, /*requirePort=*/true);
  for (auto backoff = Millis(10);
       !parsed.ok() && parsed.status().code() == StatusCode::kUnavailable;
       backoff = std::min<Millis>(backoff * 2, Millis(500))) {
    if (state_->closed()) return Cancelled("tcp connect to " + address + ": context closed");
    if (deadline.expired()) {
      return DeadlineExceeded("tcp connect to " + address + ": " + parsed.status().message() +
                              " (until the deadline)");
    }
    std::this_thread::sleep_for(std::min<Duration>(backoff, deadline.remaining()));
    parsed = resolveAddresses(address, /*requirePort=*/true);
  }
  COFAB_ASSIGN_OR_RETURN(std::vector<SockAddr> addr, std::move(parsed));
  const int n = state_->socketsPerPeer;
  if (n == 1) return connectSocket(addr, address, options, StripeGroup{}, deadline);
  // The token only has to tell this connection's sockets apart from other groups in flight at
  // the same listener.
  StripeGroup group;
  group.token = randomToken();
  group.count = static_cast<uint32_t>(n);
  std::vector<std::shared_ptr<Connection>> subs;
  // Every socket of the group goes where the first one connected: another address of the name
  // may be another host (round-robin DNS), whose listener would never complete the group.
  std::vector<SockAddr> where = addr;
  for (int i = 0; i < n; ++i) {
    group.index = static_cast<uint32_t>(i);
    size_t at = 0;
    auto sub = connectSocket(where, address, options, group, deadline, &at);
    if (i == 0 && sub.ok()) where = {where[at]};
    if (!sub.ok()) {
      for (auto& s : subs) s->close();  // the listener drops the incomplete group
      return sub.status().withContext("tcp socket " + std::to_string(i + 1) + " of " +
                                      std::to_string(n));
    }
    subs.push_back(std::move(sub).value());
  }
  return std::shared_ptr<Connection>(std::make_shared<StripedConnection>(std::move(subs)));
}

StatusOr<std::shared_ptr<Connection>> TcpContext::connectSocket(
    const std::vector<SockAddr>& addrs, const std::string& address, const ConnectOptions& options,
    const StripeGroup& group, Deadline deadline, size_t* connectedAt) {
  auto backoff = std::chrono::milliseconds(1);
  int attempts = 0;
  Status last;
  Status firstFinal;  // a definite failure at one address, kept for the final report
  while (true) {
    ++attempts;
    // Each address in turn (a peer may listen on 127.0.0.1 only while the name gives ::1
    // first); another attempt if any of them may still answer later.
    bool retryable = false;
    for (size_t i = 0; i < addrs.size(); ++i) {
      const SockAddr& addr = addrs[i];
      bool again = false;
      const std::string text = addrs.size() == 1 ? address : address + " (" + addr.toString() + ")";
      const Deadline attempt = deadline.min(Deadline::afterMs(state_->connectAttemptMs));
      auto conn = connectOnce(addr, text, options, group, attempt, &again);
      if (conn.ok()) {
        if (connectedAt != nullptr) *connectedAt = i;
        return conn;
      }
      last = conn.status();
      retryable = retryable || again;
      if (!again && firstFinal.ok()) firstFinal = last;
      if (deadline.expired() || state_->closed()) break;
    }
    if (!retryable) return firstFinal;
    if (deadline.expired() || state_->closed()) break;
    // Exponential backoff (1 ms .. 1 s): peers start in any order, the listener may not exist
    // yet. Slept in slices, so that a context closed meanwhile ends the wait soon.
    const Deadline wake = deadline.min(Deadline::after(backoff));
    while (!wake.expired() && !state_->closed()) {
      std::this_thread::sleep_for(std::min<Duration>(wake.remaining(), Millis(20)));
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    if (deadline.expired() || state_->closed()) break;
  }
  const std::string also =
      firstFinal.ok() || firstFinal.message() == last.message() ? "" : "; " + firstFinal.message();
  if (state_->closed()) {
    return Cancelled("tcp connect to " + address + ": the transport context was closed (" +
                     std::to_string(attempts) + " attempts; last: " + last.message() + also + ")");
  }
  return DeadlineExceeded("tcp connect to " + address + ": no listener answered by the deadline (" +
                          std::to_string(attempts) + " attempts; last: " + last.message() + also +
                          ")");
}

StatusOr<std::shared_ptr<Connection>> TcpContext::connectOnce(const SockAddr& addr,
                                                              const std::string& text,
                                                              const ConnectOptions& options,
                                                              const StripeGroup& group,
                                                              Deadline deadline, bool* retryable) {
  *retryable = false;
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoStatus(StatusCode::kIoError, "socket", errno, text);
  COFAB_RETURN_IF_ERROR(tuneSocket(fd.get(), state_->tuning, text));
  int rc = ::connect(fd.get(), addr.get(), addr.len);
  int err = rc == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd p{fd.get(), POLLOUT, 0};
    while (true) {
      // In slices of at most 100 ms: a context closed meanwhile ends the attempt.
      const int n = ::poll(&p, 1, std::min(deadline.remainingMsForPoll(), 100));
      if (n > 0) break;
      if (n == 0 && state_->closed()) return Cancelled("connect to " + text + ": context closed");
      if (n == 0 && deadline.expired()) {
        *retryable = true;
        return DeadlineExceeded("connect to " + text + " did not complete in time");
      }
      if (n < 0 && errno != EINTR) return errnoStatus(StatusCode::kIoError, "poll", errno, text);
    }
    socklen_t len = sizeof(err);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  if (err != 0) {
    *retryable = err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
                 err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN || err == EINTR;
    return errnoStatus(StatusCode::kUnavailable, "connect", err, text);
  }
  // A listener that goes away mid-handshake (closed, restarting) shows up as a reset or EOF:
  // worth another attempt, like a refused connect.
  // A listener that accepted at the TCP level but never answers (a stopped process, a paused
  // accept) must not hold the caller past a close() of this context.
  auto peerId = clientHandshake(fd.get(), text, options.localId, group, deadline,
                                [state = state_] { return state->closed(); });
  if (!peerId.ok()) {
    const StatusCode c = peerId.status().code();
    *retryable = c == StatusCode::kRemoteError || c == StatusCode::kDeadlineExceeded;
    return peerId.status();
  }
  return state_->adopt(std::move(fd), std::move(peerId).value(), addr.toString());
}

StatusOr<std::unique_ptr<MemoryRegion>> TcpContext::registerMemory(void* data, size_t size) {
  if (data == nullptr && size > 0) {
    return InvalidArgument("registerMemory: null pointer with " + std::to_string(size) + " bytes");
  }
  return std::make_unique<MemoryRegion>(data, size);
}

void TcpContext::close() {
  if (state_->closeAll()) {
    for (auto& loop : state_->loops) loop->stop();
  }
}

void TcpContext::join() {
  close();
  std::lock_guard<std::mutex> lock(joinMu_);
  for (auto& loop : state_->loops) loop->join();
}

}  // namespace cofab::transport::tcp
