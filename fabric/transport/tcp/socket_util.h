// Socket helpers for the tcp transport: address parsing and formatting, interface lookup
// (COFAB_SOCKET_IFNAME), socket options, and an owned file descriptor. Internal to
// fabric/transport/tcp; every function is callable from any thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace cofab::transport::tcp {

// Closes the descriptor on destruction; move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  // "127.0.0.1:5000" or "[::1]:5000".
  std::string toString() const;
};

// Parses "host:port", "[v6]:port" or "host" (port 0). Host names are resolved (getaddrinfo);
// InvalidArgument names the text and what was wrong.
// A host that does not resolve (yet) is Unavailable (connect retries it), other errors
// InvalidArgument.
StatusOr<SockAddr> parseAddress(std::string_view text);
// The same, with every address the host resolves to (IPv4 and IPv6, getaddrinfo's order);
// parseAddress is the first of them.
// `requirePort`: no port, or port 0, is InvalidArgument before any name lookup (a connect's
// address; a listen's may leave the port to the kernel).
StatusOr<std::vector<SockAddr>> resolveAddresses(std::string_view text, bool requirePort = false);

// The first IPv4 (else IPv6) address of interface `ifname`; InvalidArgument listing the
// interfaces and their addresses when it does not exist or has no address.
StatusOr<SockAddr> interfaceAddress(const std::string& ifname);
// "lo 127.0.0.1, eth0 10.0.0.2" — for error messages.
std::string describeInterfaces();

// TCP_NODELAY, optional SO_SNDBUF/SO_RCVBUF (0 keeps kernel autotuning), keepalive,
// non-blocking.
struct SocketTuning {
  int bufferBytes = 0;
  int keepaliveSeconds = 0;  // > 0: probe an idle peer after this long (a host that vanished)
};
Status tuneSocket(int fd, const SocketTuning& tuning, std::string_view peer);
Status setNonBlocking(int fd, bool on, std::string_view peer);

// Blocking-with-deadline helpers for the connect-side handshake (poll + non-blocking I/O).
// `cancelled`, when set, is asked every 100 ms while waiting: true ends the wait with
// Cancelled (the transport context was closed).
Status writeAll(int fd, const void* data, size_t size, Deadline deadline, std::string_view peer,
                const std::function<bool()>& cancelled = {});
Status readAll(int fd, void* data, size_t size, Deadline deadline, std::string_view peer,
               const std::function<bool()>& cancelled = {});

}  // namespace cofab::transport::tcp
