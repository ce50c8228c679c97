#include "fabric/rendezvous/tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace cofab {

std::string HostPort::toString() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

StatusOr<HostPort> parseHostPort(std::string_view text) {
  auto bad = [&] {
    return InvalidArgument("address '" + std::string(text) +
                           "' not understood: expected host:port, a.b.c.d:port or [v6]:port");
  };
  HostPort out;
  std::string_view portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad();
    }
    out.host = std::string(text.substr(1, close - 1));
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return bad();
    out.host = std::string(text.substr(0, colon));
    portText = text.substr(colon + 1);
  }
  if (portText.empty() || portText.size() > 5) return bad();
  uint32_t port = 0;
  for (char c : portText) {
    if (c < '0' || c > '9') return bad();
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535) return bad();
  out.port = static_cast<uint16_t>(port);
  return out;
}

namespace {

StatusOr<addrinfo*> resolve(const HostPort& addr, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string port = std::to_string(addr.port);
  int rc = getaddrinfo(addr.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    // A name not (yet) in DNS or a resolver that did not answer may resolve later (a master's
    // service record appears once its pod runs): Unavailable, which connectTcp retries.
    const bool mayResolveLater = rc == EAI_AGAIN || rc == EAI_NONAME || rc == EAI_FAIL;
    const std::string what = "cannot resolve '" + addr.host + "': " + gai_strerror(rc);
    return mayResolveLater ? Unavailable(what) : InvalidArgument(what);
  }
  return res;
}

// How long one connect attempt to one address may take before the next address (or the next
// round) is tried. A handshake on any network cofab runs on takes far less.
constexpr int64_t kConnectAttemptMs = 2000;

// One non-blocking connect attempt bounded by `deadline`; the fd on success.
StatusOr<int> connectOnce(const addrinfo* ai, Deadline deadline, const std::string& peer) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoStatus(StatusCode::kIoError, "socket", errno, peer);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    int err = errno;
    ::close(fd);
    return errnoStatus(StatusCode::kUnavailable, "connect", err, peer);
  }
  pollfd p{fd, POLLOUT, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, deadline.remainingMsForPoll());
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) {
    ::close(fd);
    return DeadlineExceeded("connect to " + peer + " timed out");
  }
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (rc < 0 || err != 0) {
    ::close(fd);
    return errnoStatus(StatusCode::kUnavailable, "connect", rc < 0 ? errno : err, peer);
  }
  return fd;
}

}  // namespace

StatusOr<int> connectTcp(const HostPort& addr, Deadline deadline) {
  std::string peer = addr.toString();
  auto backoff = std::chrono::milliseconds(5);
  Status last;
  int attempts = 0;
  addrinfo* res = nullptr;
  bool resolveAgain = true;
  while (true) {
    // Resolved again when the name did not resolve yet, or an address let a slice run out (the
    // host may have moved: restarted elsewhere). Not after a quick refusal: a thousand ranks
    // waiting for the store to listen would send the resolver thousands of queries a second.
    if (resolveAgain) {
      if (res != nullptr) freeaddrinfo(res);
      res = nullptr;
      StatusOr<addrinfo*> resolved = resolve(addr, false);
      if (resolved.ok()) {
        res = *resolved;
      } else if (resolved.status().code() == StatusCode::kUnavailable) {
        last = resolved.status();
      } else {
        return resolved.status();
      }
    }
    resolveAgain = res == nullptr;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      ++attempts;
      // Each attempt gets a slice, not the whole deadline: an address that drops SYNs (an AAAA
      // record behind a firewall) would otherwise keep the ones after it from being tried.
      auto fd = connectOnce(ai, deadline.min(Deadline::afterMs(kConnectAttemptMs)), peer);
      if (fd.ok()) {
        freeaddrinfo(res);
        return fd;
      }
      last = fd.status();
      if (last.code() == StatusCode::kDeadlineExceeded) resolveAgain = true;
    }
    if (deadline.expired()) break;
    std::this_thread::sleep_for(std::min<Duration>(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  if (res != nullptr) freeaddrinfo(res);
  return DeadlineExceeded("could not connect to " + peer + " before the deadline (" +
                          std::to_string(attempts) + " attempts; last: " + last.message() + ")");
}

StatusOr<int> listenTcp(const HostPort& addr, int backlog, uint16_t* boundPort) {
  StatusOr<addrinfo*> resolved = resolve(addr, true);
  if (!resolved.ok()) {  // a bind address that does not resolve is the caller's to fix
    return InvalidArgument(resolved.status().message());
  }
  addrinfo* res = *resolved;
  Status last = Unavailable("no address to bind for " + addr.toString());
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = errnoStatus(StatusCode::kIoError, "socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      last = errnoStatus(StatusCode::kUnavailable, "bind/listen " + addr.toString(), errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    *boundPort = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

namespace {

Status waitFd(int fd, short events, Deadline deadline, std::string_view peer, const char* what) {
  pollfd p{fd, events, 0};
  while (true) {
    int rc = ::poll(&p, 1, deadline.remainingMsForPoll());
    if (rc > 0) return OkStatus();
    if (rc == 0) return DeadlineExceeded(std::string(what) + " " + std::string(peer) + " timed out");
    if (errno != EINTR) return errnoStatus(StatusCode::kIoError, "poll", errno, peer);
  }
}

}  // namespace

Status sendAll(int fd, const void* data, size_t len, Deadline deadline, std::string_view peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      COFAB_RETURN_IF_ERROR(waitFd(fd, POLLOUT, deadline, peer, "send to"));
      continue;
    }
    return errnoStatus(StatusCode::kRemoteError, "send", errno, peer);
  }
  return OkStatus();
}

Status recvAll(int fd, void* data, size_t len, Deadline deadline, std::string_view peer) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return RemoteError("connection closed by " + std::string(peer));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      COFAB_RETURN_IF_ERROR(waitFd(fd, POLLIN, deadline, peer, "receive from"));
      continue;
    }
    return errnoStatus(StatusCode::kRemoteError, "recv", errno, peer);
  }
  return OkStatus();
}

}  // namespace cofab
