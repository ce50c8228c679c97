// TcpContext: the tcp backend's Context (contract: fabric/transport/context.h), and the state
// its listeners and connections share (loops, options, the list of live objects to close).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/transport/context.h"
#include "fabric/transport/tcp/epoll_loop.h"
#include "fabric/transport/tcp/factory.h"
#include "fabric/transport/tcp/socket_util.h"

namespace cofab::transport::tcp {

class TcpConnectionImpl;
class TcpListenerImpl;

// Where a socket belongs, carried in its Hello (key = token, chunkIndex = index, chunkCount =
// count): the listener joins the `count` sockets of one token into a StripedConnection.
struct StripeGroup {
  uint64_t token = 0;
  uint32_t index = 0;
  uint32_t count = 1;
};
inline constexpr uint32_t kMaxSocketsPerPeer = 64;

// Shared by the context, its listeners and its connections.
class TcpContextState {
 public:
  ContextOptions options;
  SocketTuning tuning;
  std::string ifname;           // COFAB_SOCKET_IFNAME, may be empty
  int64_t connectAttemptMs = 0;  // COFAB_TCP_CONNECT_TIMEOUT_MS
  int socketsPerPeer = 1;        // COFAB_TCP_SOCKETS_PER_PEER (connections this side opens)
  std::vector<std::shared_ptr<EpollLoop>> loops;

  std::shared_ptr<EpollLoop> nextLoop() {
    return loops[next_.fetch_add(1, std::memory_order_relaxed) % loops.size()];
  }
  // Creates a connection over an established, handshaken socket and registers it for close().
  StatusOr<std::shared_ptr<Connection>> adopt(Fd fd, std::string peerId, std::string peerAddress);
  bool track(const std::shared_ptr<TcpListenerImpl>& listener);
  bool closed() const;
  // Closes every tracked object; returns whether this call did it (first call).
  bool closeAll();

 private:
  std::atomic<size_t> next_{0};
  mutable std::mutex mu_;
  bool closed_ = false;
  std::vector<std::weak_ptr<TcpConnectionImpl>> conns_;
  std::vector<std::weak_ptr<TcpListenerImpl>> listeners_;
};

class TcpContext final : public Context {
 public:
  explicit TcpContext(std::shared_ptr<TcpContextState> state) : state_(std::move(state)) {}
  ~TcpContext() override { join(); }

  const std::string& name() const override { return name_; }
  bool isViable() const override { return !state_->closed(); }
  StatusOr<std::unique_ptr<Listener>> listen(const ListenOptions& options) override;
  StatusOr<std::shared_ptr<Connection>> connect(const std::string& address,
                                                const ConnectOptions& options,
                                                Deadline deadline) override;
  StatusOr<std::unique_ptr<MemoryRegion>> registerMemory(void* data, size_t size) override;
  void close() override;
  void join() override;

 private:
  // One socket, with retries until `deadline`; each attempt tries the addresses in order, and
  // `connectedAt` (when given) says which one answered. `group`: the socket's place in a
  // striped connection (count 1: a plain connection).
  StatusOr<std::shared_ptr<Connection>> connectSocket(const std::vector<SockAddr>& addrs,
                                                      const std::string& address,
                                                      const ConnectOptions& options,
                                                      const StripeGroup& group, Deadline deadline,
                                                      size_t* connectedAt = nullptr);
  StatusOr<std::shared_ptr<Connection>> connectOnce(const SockAddr& addr, const std::string& text,
                                                    const ConnectOptions& options,
                                                    const StripeGroup& group, Deadline deadline,
                                                    bool* retryable);
  const std::string name_ = "tcp";
  std::shared_ptr<TcpContextState> state_;
  std::mutex joinMu_;
};

// Handshake framing shared by both sides: a Hello/HelloAck header whose payload is the id.
inline constexpr uint64_t kMaxHandshakeId = 4096;

}  // namespace cofab::transport::tcp
