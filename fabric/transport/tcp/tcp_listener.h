// TcpListener: the tcp backend's Listener (contract: fabric/transport/listener.h).
//
// The listening socket lives on one of the context's loops. Each accepted socket runs the
// handshake (read the peer's Hello with its id, answer HelloAck with ours) on that loop, then
// becomes a TcpConnection on the next loop in round-robin order and is queued for accept().
// Sockets whose Hello names a stripe group (COFAB_TCP_SOCKETS_PER_PEER > 1 on the connecting
// side) wait until their group is complete and are queued as one StripedConnection.
// Both waits are bounded by a timer on the loop: a handshake by COFAB_TCP_CONNECT_TIMEOUT_MS
// (the bound the connecting side puts on connect + handshake), an incomplete group by twice that.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/transport/accept_queue.h"
#include "fabric/transport/listener.h"
#include "fabric/transport/tcp/epoll_loop.h"
#include "fabric/transport/tcp/socket_util.h"

namespace cofab::transport::tcp {

class TcpContextState;
class HandshakeHandler;
struct StripeGroup;

class TcpListenerImpl final : public EpollHandler,
                              public std::enable_shared_from_this<TcpListenerImpl> {
 public:
  TcpListenerImpl(std::shared_ptr<TcpContextState> ctx, std::shared_ptr<EpollLoop> loop, Fd fd,
                  std::string address);
  ~TcpListenerImpl() override;

  Status attach();
  const std::string& address() const { return address_; }
  StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline) {
    return queue_.accept(deadline);
  }
  void acceptAsync(AcceptCallback done) { queue_.acceptAsync(std::move(done)); }
  void close();

  void handleEvents(uint32_t events) override;
  // Loop thread: the timer fired; drops what is past its bound and re-arms for the next one.
  void sweep();

  // Loop thread: a handshake finished; its socket leaves the loop first (detach), then the
  // connection made from it is queued for accept (done).
  void handshakeDetach(int fd);
  void handshakeDone(std::shared_ptr<Connection> conn);
  // Loop thread: a handshaken socket of a striped connection; accept() gets the connection once
  // all sockets of its group are here.
  void stripeMember(const StripeGroup& group, std::shared_ptr<Connection> conn);
  StatusOr<std::shared_ptr<Connection>> ctxAdopt(Fd fd, const std::string& id,
                                                 const std::string& addr);

 private:
  void closeOnLoop();
  // Loop thread: makes the timer fire by `atNs` (nowNs() clock) at the latest.
  void armSweep(int64_t atNs);
  int64_t handshakeBoundNs() const;
  int64_t stripeBoundNs() const { return 2 * handshakeBoundNs(); }

  std::shared_ptr<TcpContextState> ctx_;
  std::shared_ptr<EpollLoop> loop_;
  Fd fd_;
  const std::string address_;
  bool attached_ = false;
  Fd timerFd_;                  // timerfd: created by attach(), closed by closeOnLoop()
  bool timerAttached_ = false;  // loop thread only
  int64_t timerAtNs_ = 0;       // loop thread only: when the armed timer fires; 0: disarmed
  // Loop thread only: accept4 ran out of descriptors or memory; the socket is unwatched until
  // then (the sweep watches it again). 0: accepting.
  int64_t acceptPausedUntilNs_ = 0;
  static constexpr int64_t kAcceptPauseNs = 100'000'000;
  // Loop thread only: sockets still in their handshake.
  std::unordered_map<int, std::shared_ptr<HandshakeHandler>> handshakes_;
  // Loop thread only: striped connections still missing sockets, by group token.
  struct PendingStripe {
    std::vector<std::shared_ptr<Connection>> members;  // by index
    int have = 0;
    std::string peerId;
    int64_t startNs = 0;
  };
  std::unordered_map<uint64_t, PendingStripe> stripes_;
  AcceptQueue queue_;
};

class TcpListener final : public Listener {
 public:
  explicit TcpListener(std::shared_ptr<TcpListenerImpl> impl) : impl_(std::move(impl)) {}
  ~TcpListener() override { impl_->close(); }
  const std::string& address() const override { return impl_->address(); }
  StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline) override {
    return impl_->accept(deadline);
  }
  void acceptAsync(AcceptCallback done) override { impl_->acceptAsync(std::move(done)); }
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<TcpListenerImpl> impl_;
};

}  // namespace cofab::transport::tcp
