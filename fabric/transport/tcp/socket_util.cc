#include "fabric/transport/tcp/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace cofab::transport::tcp {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string SockAddr::toString() const {
  char host[INET6_ADDRSTRLEN] = {0};
  if (family() == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (family() == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "<family " + std::to_string(family()) + ">";
}

StatusOr<SockAddr> parseAddress(std::string_view text) {
  COFAB_ASSIGN_OR_RETURN(std::vector<SockAddr> all, resolveAddresses(text));
  return all.front();
}

StatusOr<std::vector<SockAddr>> resolveAddresses(std::string_view text, bool requirePort) {
  std::string host;
  std::string port = "0";
  if (text.empty()) return InvalidArgument("tcp address is empty (expected host:port)");
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return InvalidArgument("tcp address '" + std::string(text) + "': missing ']'");
    }
    host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return InvalidArgument("tcp address '" + std::string(text) + "': expected ':' after ']'");
      }
      port = std::string(text.substr(close + 2));
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') != colon) {
      return InvalidArgument("tcp address '" + std::string(text) +
                             "': write IPv6 addresses as [addr]:port");
    }
    host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) port = std::string(text.substr(colon + 1));
  }
  if (host.empty()) return InvalidArgument("tcp address '" + std::string(text) + "': no host");
  // Whitespace or control characters cannot be in a host name or IP literal (IPv6 zone ids and
  // internationalised names can hold much else): such text is a mistake, not a name that may
  // resolve later (connect() retries those).
  for (const char ch : host) {
    if (static_cast<unsigned char>(ch) <= ' ' || ch == '\x7f' || ch == '/') {
      return InvalidArgument("tcp address '" + std::string(text) + "': '" + host +
                             "' is not a host name or IP address");
    }
  }
  // Digits only: strtol alone took " 80" and "+80".
  char* end = nullptr;
  errno = 0;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || *end != '\0' ||
      errno != 0 || p < 0 || p > 65535) {
    return InvalidArgument("tcp address '" + std::string(text) + "': port '" + port +
                           "' is not a number in [0, 65535]");
  }
  // Checked before the lookup: a connect to a name not in DNS (yet) retries that until its
  // deadline, and port 0 is refused by every host, retried like a listener not up yet.
  if (requirePort && p == 0) {
    return InvalidArgument("tcp address '" + std::string(text) +
                           "': no port (expected host:port, port 1..65535)");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    // A name not (yet) in DNS, or a resolver that did not answer, may resolve later:
    // Unavailable, which connect() retries until its deadline.
    const std::string what = "tcp address '" + std::string(text) + "': cannot resolve host '" +
                             host + "': " + ::gai_strerror(rc);
    const bool mayResolveLater = rc == EAI_AGAIN || rc == EAI_NONAME || rc == EAI_FAIL;
    return mayResolveLater ? Unavailable(what) : InvalidArgument(what);
  }
  // Every address, in getaddrinfo's order: a name often resolves to ::1 before 127.0.0.1
  // (localhost on most hosts), and a peer listening on one of them only must still be reached.
  std::vector<SockAddr> all;
  for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    SockAddr out;
    std::memcpy(&out.storage, ai->ai_addr, ai->ai_addrlen);
    out.len = ai->ai_addrlen;
    if (out.family() == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(static_cast<uint16_t>(p));
    } else {
      reinterpret_cast<sockaddr_in6*>(&out.storage)->sin6_port = htons(static_cast<uint16_t>(p));
    }
    all.push_back(out);
  }
  ::freeaddrinfo(res);
  if (all.empty()) {
    return InvalidArgument("tcp address '" + std::string(text) + "': not an IP address");
  }
  return all;
}

namespace {

template <typename Fn>
Status forEachInterface(Fn&& fn) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return errnoStatus(StatusCode::kIoError, "getifaddrs", errno);
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    SockAddr a;
    a.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&a.storage, i->ifa_addr, a.len);
    fn(std::string(i->ifa_name), a);
  }
  ::freeifaddrs(list);
  return OkStatus();
}

std::string hostOnly(const SockAddr& a) {
  std::string s = a.toString();
  return s.substr(0, s.rfind(':'));
}

}  // namespace

std::string describeInterfaces() {
  std::string out;
  forEachInterface([&](const std::string& name, const SockAddr& a) {
    if (!out.empty()) out += ", ";
    out += name + " " + hostOnly(a);
  }).ignoreError();
  return out.empty() ? "(none)" : out;
}

StatusOr<SockAddr> interfaceAddress(const std::string& ifname) {
  SockAddr v4;
  SockAddr v6;
  bool found4 = false;
  bool found6 = false;
  COFAB_RETURN_IF_ERROR(forEachInterface([&](const std::string& name, const SockAddr& a) {
    if (name != ifname) return;
    if (a.family() == AF_INET && !found4) {
      v4 = a;
      found4 = true;
    } else if (a.family() == AF_INET6 && !found6) {
      v6 = a;
      found6 = true;
    }
  }));
  if (found4) return v4;
  if (found6) return v6;
  return InvalidArgument("COFAB_SOCKET_IFNAME='" + ifname +
                         "': no such interface with an IP address; available: " +
                         describeInterfaces());
}

Status setNonBlocking(int fd, bool on, std::string_view peer) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) return errnoStatus(StatusCode::kIoError, "fcntl(F_GETFL)", errno, peer);
  const int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, want) < 0) {
    return errnoStatus(StatusCode::kIoError, "fcntl(F_SETFL)", errno, peer);
  }
  return OkStatus();
}

Status tuneSocket(int fd, const SocketTuning& tuning, std::string_view peer) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return errnoStatus(StatusCode::kIoError, "setsockopt(TCP_NODELAY)", errno, peer);
  }
  if (tuning.bufferBytes > 0) {
    // An explicit size turns off the kernel's autotuning and is capped by rmem_max/wmem_max;
    // the FORCE variants (root) lift the cap, else fall back to the capped request.
    int b = tuning.bufferBytes;
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &b, sizeof(b)) != 0 &&
        ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b)) != 0) {
      return errnoStatus(StatusCode::kIoError, "setsockopt(SO_SNDBUF)", errno, peer);
    }
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &b, sizeof(b)) != 0 &&
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b)) != 0) {
      return errnoStatus(StatusCode::kIoError, "setsockopt(SO_RCVBUF)", errno, peer);
    }
  }
  if (tuning.keepaliveSeconds > 0) {
    // A peer host that disappears without FIN/RST is declared dead after idle + 3 probes
    // (ETIMEDOUT -> RemoteError) instead of never. Keepalive probes only an idle connection:
    // with data in flight the kernel retransmits for tcp_retries2 (about 15 minutes) first, and
    // the callers' deadlines are what bound that. TCP_USER_TIMEOUT is not set: it would also
    // end a connection whose peer is alive but not reading for that long (a zero window while
    // a straggler computes), which must wait.
    int idle = tuning.keepaliveSeconds;
    int intvl = std::max(1, idle / 5);
    int cnt = 3;
    if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) != 0 ||
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) != 0) {
      return errnoStatus(StatusCode::kIoError, "setsockopt(keepalive)", errno, peer);
    }
  }
  return setNonBlocking(fd, true, peer);
}

namespace {

Status waitFd(int fd, short events, Deadline deadline, std::string_view what,
              std::string_view peer, const std::function<bool()>& cancelled) {
  while (true) {
    if (cancelled && cancelled()) {
      return Cancelled("tcp: stopped " + std::string(what) + " (peer " + std::string(peer) +
                       "): the transport context was closed");
    }
    if (deadline.expired()) {
      return DeadlineExceeded("tcp: timed out " + std::string(what) + " (peer " +
                              std::string(peer) + ")");
    }
    pollfd p{fd, events, 0};
    const int slice = cancelled ? std::min(deadline.remainingMsForPoll(), 100)
                                : deadline.remainingMsForPoll();
    const int rc = ::poll(&p, 1, slice);
    if (rc > 0) return OkStatus();
    if (rc < 0 && errno != EINTR) return errnoStatus(StatusCode::kIoError, "poll", errno, peer);
  }
}

}  // namespace

Status writeAll(int fd, const void* data, size_t size, Deadline deadline, std::string_view peer,
                const std::function<bool()>& cancelled) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      COFAB_RETURN_IF_ERROR(waitFd(fd, POLLOUT, deadline, "sending the handshake", peer, cancelled));
    } else if (n < 0 && errno != EINTR) {
      return errnoStatus(StatusCode::kRemoteError, "send", errno, peer);
    }
  }
  return OkStatus();
}

Status readAll(int fd, void* data, size_t size, Deadline deadline, std::string_view peer,
               const std::function<bool()>& cancelled) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      return RemoteError("tcp: peer " + std::string(peer) + " closed the connection during the "
                         "handshake (is it a cofab listener?)");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      COFAB_RETURN_IF_ERROR(waitFd(fd, POLLIN, deadline, "waiting for the handshake", peer, cancelled));
    } else if (errno != EINTR) {
      return errnoStatus(StatusCode::kRemoteError, "recv", errno, peer);
    }
  }
  return OkStatus();
}

}  // namespace cofab::transport::tcp
