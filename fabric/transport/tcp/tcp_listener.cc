#include "fabric/transport/tcp/tcp_listener.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>

#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "fabric/transport/tcp/striped_connection.h"
#include "fabric/transport/tcp/tcp_context.h"

namespace cofab::transport::tcp {

// Reads one Hello (header + id) from a freshly accepted socket and answers with HelloAck.
// Reads exactly the handshake's bytes, so whatever the peer sends next stays in the socket for
// the connection. Loop thread only.
class HandshakeHandler final : public EpollHandler {
 public:
  HandshakeHandler(TcpListenerImpl* listener, Fd fd, std::string peerAddress, std::string localId)
      : listener_(listener),
        fd_(std::move(fd)),
        peerAddress_(std::move(peerAddress)),
        localId_(std::move(localId)) {}

  int fd() const { return fd_.get(); }
  int64_t startNs() const { return startNs_; }
  // The listener's timer: the peer did not complete its Hello in time.
  void expire(int64_t boundMs) {
    finish("no complete handshake within " + std::to_string(boundMs) +
           " ms (COFAB_TCP_CONNECT_TIMEOUT_MS)");
  }

  void handleEvents(uint32_t) override {
    // The sweep may have expired this handshake earlier in the same batch of events: the loop
    // keeps the handler alive to the batch's end, but it is done.
    if (finished_) return;
    while (true) {
      uint8_t* dst;
      size_t want;
      if (got_ < wire::kHeaderSize) {
        dst = header_ + got_;
        want = wire::kHeaderSize - got_;
      } else {
        dst = reinterpret_cast<uint8_t*>(id_.data()) + (got_ - wire::kHeaderSize);
        want = wire::kHeaderSize + id_.size() - got_;
      }
      if (want == 0) break;
      const ssize_t n = ::recv(fd_.get(), dst, want, 0);
      if (n == 0) return finish("peer closed the connection during the handshake");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return finish(std::string("recv failed: ") + std::strerror(errno));
      }
      got_ += static_cast<size_t>(n);
      if (got_ == wire::kHeaderSize) {
        auto h = wire::decodeHeader({header_, wire::kHeaderSize}, {kMaxHandshakeId});
        if (!h.ok()) return finish("bad handshake: " + h.status().message());
        if (h->type != wire::MessageType::kHello) {
          return finish("bad handshake: expected Hello, got " +
                        std::string(wire::messageTypeName(h->type)));
        }
        id_.resize(h->payloadLength);
        group_.token = h->key;
        group_.index = h->chunkIndex;
        group_.count = h->chunkCount == 0 ? 1 : h->chunkCount;
        if (group_.count > kMaxSocketsPerPeer) {
          return finish("bad handshake: " + std::to_string(group_.count) +
                        " sockets per connection (at most " + std::to_string(kMaxSocketsPerPeer) +
                        ")");
        }
      }
    }
    // Complete: answer. A fresh socket's send buffer always has room for this small reply.
    wire::Header ack;
    ack.type = wire::MessageType::kHelloAck;
    ack.payloadLength = localId_.size();
    std::string reply(wire::kHeaderSize, '\0');
    wire::encodeHeader(ack, reinterpret_cast<uint8_t*>(reply.data()));
    reply += localId_;
    const ssize_t n = ::send(fd_.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(reply.size())) return finish("could not send the HelloAck");
    finish("");
  }

 private:
  void finish(const std::string& error) {
    if (finished_) return;
    finished_ = true;
    // Leave this loop's epoll before the descriptor moves to a connection (perhaps on another
    // loop): no event may reach this handler afterwards. The loop keeps `this` alive until the
    // end of the iteration.
    listener_->handshakeDetach(fd_.get());
    std::shared_ptr<Connection> conn;
    if (error.empty()) {
      auto c = listener_->ctxAdopt(std::move(fd_), id_, peerAddress_);
      if (c.ok()) {
        conn = std::move(c).value();
      } else {
        COFAB_LOG(kWarn, "tcp") << "accepted connection from " << peerAddress_
                                << " dropped: " << c.status();
      }
    } else {
      COFAB_LOG(kWarn, "tcp") << "accepted connection from " << peerAddress_
                              << " dropped: " << error;
    }
    if (!conn) return;
    if (group_.count > 1) {
      listener_->stripeMember(group_, std::move(conn));
    } else {
      listener_->handshakeDone(std::move(conn));
    }
  }

  TcpListenerImpl* listener_;
  Fd fd_;
  const std::string peerAddress_;
  const std::string localId_;
  uint8_t header_[wire::kHeaderSize];
  std::string id_;
  StripeGroup group_;
  size_t got_ = 0;
  bool finished_ = false;
  const int64_t startNs_ = nowNs();
};

TcpListenerImpl::TcpListenerImpl(std::shared_ptr<TcpContextState> ctx,
                                 std::shared_ptr<EpollLoop> loop, Fd fd, std::string address)
    : ctx_(std::move(ctx)),
      loop_(std::move(loop)),
      fd_(std::move(fd)),
      address_(std::move(address)),
      queue_("tcp " + address_,
             [loop = loop_](std::function<void()> fn) { return loop->post(std::move(fn)); }) {}

TcpListenerImpl::~TcpListenerImpl() = default;

StatusOr<std::shared_ptr<Connection>> TcpListenerImpl::ctxAdopt(Fd fd, const std::string& id,
                                                                const std::string& addr) {
  return ctx_->adopt(std::move(fd), id, addr);
}

// Fires the listener's sweep on its loop.
class SweepTimer final : public EpollHandler {
 public:
  SweepTimer(TcpListenerImpl* listener, int fd) : listener_(listener), fd_(fd) {}
  void handleEvents(uint32_t) override {
    uint64_t expirations;
    [[maybe_unused]] ssize_t n = ::read(fd_, &expirations, sizeof(expirations));
    listener_->sweep();
  }

 private:
  TcpListenerImpl* listener_;
  const int fd_;
};

int64_t TcpListenerImpl::handshakeBoundNs() const { return ctx_->connectAttemptMs * 1'000'000; }

Status TcpListenerImpl::attach() {
  timerFd_ = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timerFd_.valid()) {
    return errnoStatus(StatusCode::kResourceExhausted, "timerfd_create", errno, address_);
  }
  auto self = shared_from_this();
  if (!loop_->post([self] {
        Status s = self->loop_->add(self->fd_.get(), EPOLLIN, self);
        if (s.ok()) {
          self->attached_ = true;
          s = self->loop_->add(self->timerFd_.get(), EPOLLIN,
                               std::make_shared<SweepTimer>(self.get(), self->timerFd_.get()));
        }
        if (!s.ok()) {
          COFAB_LOG(kError, "tcp") << "listener " << self->address_ << ": " << s;
          self->close();
          return;
        }
        self->timerAttached_ = true;
      })) {
    return Cancelled("tcp: the transport context is closed");
  }
  return OkStatus();
}

void TcpListenerImpl::handleEvents(uint32_t) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd =
        ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINVAL || err == EBADF) {
        // close() shut the socket down: stop watching it (it is level-triggered). The
        // descriptor itself is closed by the closeOnLoop() that close() posted.
        if (attached_) loop_->remove(fd_.get());
        attached_ = false;
        return;
      }
      // A network error of the connection being accepted (accept(2): treat like EAGAIN for
      // that one connection and go on with the others).
      if (err == EPROTO || err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET ||
          err == EHOSTUNREACH || err == EOPNOTSUPP || err == ENETUNREACH || err == ENETDOWN ||
          err == EPERM) {
        continue;
      }
      // Out of descriptors or memory: transient. The socket stays readable, so stop watching it
      // rather than spin, and try again from the sweep timer (pending connections wait in the
      // backlog meanwhile).
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        COFAB_LOG(kWarn, "tcp") << "listener " << address_ << ": "
                                << errnoStatus(StatusCode::kResourceExhausted, "accept4", err)
                                << "; accepting again in " << kAcceptPauseNs / 1'000'000 << " ms";
        if (attached_) loop_->remove(fd_.get());
        attached_ = false;
        acceptPausedUntilNs_ = nowNs() + kAcceptPauseNs;
        armSweep(acceptPausedUntilNs_);
        return;
      }
      // Anything else is not expected: the listener is dead and says so once.
      COFAB_LOG(kError, "tcp") << "listener " << address_ << ": "
                               << errnoStatus(StatusCode::kInternal, "accept4", err)
                               << "; no longer accepting";
      if (queue_.close()) {
        closeOnLoop();  // close() now returns early: nobody else touches fd_
      } else {
        if (attached_) loop_->remove(fd_.get());  // close() got there first and posted closeOnLoop
        attached_ = false;
      }
      return;
    }
    SockAddr peer;
    std::memcpy(&peer.storage, &ss, len);
    peer.len = len;
    Fd owned(fd);
    Status s = tuneSocket(fd, ctx_->tuning, peer.toString());
    if (!s.ok()) {
      COFAB_LOG(kWarn, "tcp") << "listener " << address_ << ": " << s;
      continue;
    }
    auto h = std::make_shared<HandshakeHandler>(this, std::move(owned), peer.toString(),
                                                ctx_->options.localId);
    s = loop_->add(fd, EPOLLIN | EPOLLRDHUP, h);
    if (!s.ok()) {
      COFAB_LOG(kWarn, "tcp") << "listener " << address_ << ": " << s;
      continue;
    }
    armSweep(h->startNs() + handshakeBoundNs());
    handshakes_[fd] = std::move(h);
  }
}

void TcpListenerImpl::armSweep(int64_t atNs) {
  if (!timerAttached_ || (timerAtNs_ != 0 && timerAtNs_ <= atNs)) return;
  timerAtNs_ = atNs;
  // Relative, from the same clock as nowNs(); 0 would disarm the timer.
  const int64_t in = std::max<int64_t>(atNs - nowNs(), 1);
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(in / 1'000'000'000);
  spec.it_value.tv_nsec = static_cast<long>(in % 1'000'000'000);
  if (::timerfd_settime(timerFd_.get(), 0, &spec, nullptr) != 0) {
    // Not expected (the arguments are valid); the waits are then unbounded, so say so.
    COFAB_LOG(kError, "tcp") << "listener " << address_ << ": "
                             << errnoStatus(StatusCode::kInternal, "timerfd_settime", errno)
                             << "; stalled handshakes are no longer dropped";
    timerAtNs_ = 0;
  }
}

void TcpListenerImpl::sweep() {
  timerAtNs_ = 0;
  if (!timerAttached_) return;  // closed
  const int64_t now = nowNs();
  if (acceptPausedUntilNs_ != 0) {
    if (now < acceptPausedUntilNs_) {
      armSweep(acceptPausedUntilNs_);
    } else {
      acceptPausedUntilNs_ = 0;
      Status s = loop_->add(fd_.get(), EPOLLIN, shared_from_this());
      if (s.ok()) {
        attached_ = true;  // level-triggered: a backlog waiting fires at once
      } else {
        COFAB_LOG(kError, "tcp") << "listener " << address_ << ": " << s
                                 << "; no longer accepting";
        // As on the fatal accept error: accept() then says the listener is closed instead of
        // waiting for connections that can no longer come.
        if (queue_.close()) {
          closeOnLoop();
          return;
        }
      }
    }
  }
  // A peer that connects and sends nothing, or part of its Hello, would otherwise hold the
  // socket and its handler forever. expire() erases the entry (handshakeDetach): collect first.
  std::vector<std::shared_ptr<HandshakeHandler>> late;
  for (auto& [fd, h] : handshakes_) {
    if (now - h->startNs() >= handshakeBoundNs()) late.push_back(h);
  }
  for (auto& h : late) h->expire(ctx_->connectAttemptMs);
  // A connecting side that failed half-way closes its sockets, but a socket parked here is not
  // read, so nobody would notice: groups incomplete after twice the connect-attempt bound go.
  std::erase_if(stripes_, [&](const auto& kv) {
    if (now - kv.second.startNs < stripeBoundNs()) return false;
    // (Any slot may be the empty one: the socket that arrived first need not be socket 0.)
    COFAB_LOG(kWarn, "tcp") << "listener " << address_ << ": dropped an incomplete group of "
                            << kv.second.members.size() << " sockets from '" << kv.second.peerId
                            << "' (" << kv.second.have << " arrived)";
    return true;
  });
  for (auto& [fd, h] : handshakes_) armSweep(h->startNs() + handshakeBoundNs());
  for (auto& [token, p] : stripes_) armSweep(p.startNs + stripeBoundNs());
}

void TcpListenerImpl::handshakeDetach(int fd) {
  loop_->remove(fd);  // keeps the handler alive until the end of this iteration
  handshakes_.erase(fd);
}

void TcpListenerImpl::handshakeDone(std::shared_ptr<Connection> conn) {
  queue_.deliver(std::move(conn));
}

void TcpListenerImpl::stripeMember(const StripeGroup& group, std::shared_ptr<Connection> conn) {
  PendingStripe& p = stripes_[group.token];
  if (p.members.empty()) {
    p.members.resize(group.count);
    p.startNs = nowNs();
    armSweep(p.startNs + stripeBoundNs());  // the sweep drops it if the group stays incomplete
  }
  // The size first: a socket of the same token claiming a larger group must not index past it.
  if (p.members.size() != group.count || p.members[group.index] != nullptr ||
      (p.have > 0 && p.peerId != conn->peerId())) {
    COFAB_LOG(kWarn, "tcp") << "listener " << address_ << ": socket " << group.index << "/"
                            << group.count << " from '" << conn->peerId()
                            << "' does not fit its group; dropping the group";
    stripes_.erase(group.token);
    return;
  }
  p.peerId = conn->peerId();
  p.members[group.index] = std::move(conn);
  if (++p.have < static_cast<int>(group.count)) return;
  auto members = std::move(p.members);
  stripes_.erase(group.token);
  queue_.deliver(std::make_shared<StripedConnection>(std::move(members)));
}

void TcpListenerImpl::close() {
  if (!queue_.close()) return;
  // Refuse new connections now rather than when the loop gets to it: the fd stays valid (the
  // loop closes it), but the socket leaves LISTEN so connecting peers are refused and retry.
  ::shutdown(fd_.get(), SHUT_RDWR);
  auto self = shared_from_this();
  loop_->post([self] { self->closeOnLoop(); });
}

void TcpListenerImpl::closeOnLoop() {
  if (attached_) loop_->remove(fd_.get());
  attached_ = false;
  fd_.reset();
  if (timerAttached_) loop_->remove(timerFd_.get());
  timerAttached_ = false;
  timerFd_.reset();
  for (auto& [fd, h] : handshakes_) loop_->remove(fd);
  handshakes_.clear();
  stripes_.clear();
}

}  // namespace cofab::transport::tcp
