#include "fabric/rendezvous/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "fabric/rendezvous/tcp_socket.h"
#include "fabric/rendezvous/tcp_store_protocol.h"

namespace cofab {

using store_proto::Op;
using store_proto::Reader;
using store_proto::Reply;
using store_proto::Writer;

class TcpStoreServer::Loop {
 public:
  Loop(int listenFd, int maxConnections) : listenFd_(listenFd), maxConnections_(maxConnections) {}
  ~Loop();

  Status init();
  void run();
  void requestStop();
  // After run() has returned: closes the listener and every connection, so that the port is
  // free and clients see the end of the stream instead of waiting out their deadlines.
  void closeAll();
  Stats stats() const;

 private:
  struct Conn {
    int fd = -1;
    uint64_t id = 0;  // unique for the server's life: fds are reused, ids never
    Bytes in;         // unparsed bytes
    Bytes out;        // unsent response bytes
    size_t outOffset = 0;
    uint64_t parkId = 0;  // its get/wait waiting for keys (parked_), 0: none
    bool wantWrite = false;
  };
  struct Parked {
    int fd;
    uint64_t connId;  // the connection that asked, not a later one given the same fd
    Op op;
    std::vector<std::string> keys;
    Deadline deadline;
    size_t awaited = 0;  // index in keys of the key it is registered in waitingOn_ for
  };

  void acceptAll();
  void onReadable(Conn& c);
  void onWritable(Conn& c);
  // Parses and serves complete frames in c.in; false if the connection must close.
  bool serveFrames(Conn& c);
  // Serves one request body. Returns false on a protocol error.
  bool handle(Conn& c, const uint8_t* body, size_t len);
  void reply(Conn& c, const Writer& w);
  void replyError(Conn& c, const Status& s);
  // Completes parked requests whose awaited key was written or whose deadline passed.
  void serviceParked();
  // Answers `p` if all its keys exist (or, timed out, with the missing ones) and returns true;
  // else registers it for its first missing key and returns false. A request waits on one
  // key at a time, so a write touches only the requests waiting on that key: rescanning every
  // parked request's keys on every loop turn cost O(waits x keys) per turn (a 1024-rank
  // barrier: a million lookups a turn).
  bool settle(uint64_t id, Parked& p, bool timedOut);
  void keyWritten(const std::string& key);
  void unpark(uint64_t id);
  void closeConn(int fd, const char* why);
  int nextTimeoutMs() const;
  void updateBuffered();
  // Out of descriptors: the listening socket stays readable while its connection waits in the
  // backlog, so it is taken out of the epoll set (else epoll_wait returns at once, forever: a
  // core at 100 % and a log line per turn) and put back once the pause is over.
  void pauseAccepting();
  void resumeAcceptingIfDue();

  int listenFd_;
  int maxConnections_;
  int epfd_ = -1;
  int wakeFd_ = -1;
  std::atomic<bool> stop_{false};
  std::unordered_map<int, Conn> conns_;
  uint64_t nextConnId_ = 1;
  std::unordered_map<uint64_t, Parked> parked_;
  uint64_t nextParkId_ = 1;
  // Parked request ids by the key each waits on next, and by deadline (never: not listed).
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waitingOn_;
  std::set<std::pair<Clock::time_point, uint64_t>> byDeadline_;
  std::vector<uint64_t> woken_;  // requests whose awaited key was written since the last pass
  Deadline acceptPausedUntil_ = Deadline::never();  // never: accepting
  std::map<std::string, Bytes, std::less<>> data_;

  mutable std::mutex statsMu_;
  Stats stats_;
};

namespace {
constexpr uint64_t kListenTag = ~0ull;
constexpr uint64_t kWakeTag = ~0ull - 1;

}  // namespace

TcpStoreServer::Loop::~Loop() {
  closeAll();
  if (wakeFd_ >= 0) ::close(wakeFd_);
  if (epfd_ >= 0) ::close(epfd_);
}

void TcpStoreServer::Loop::closeAll() {
  for (auto& [fd, _] : conns_) ::close(fd);
  conns_.clear();
  parked_.clear();
  waitingOn_.clear();
  byDeadline_.clear();
  woken_.clear();
  if (listenFd_ >= 0) ::close(listenFd_);
  listenFd_ = -1;
  std::lock_guard<std::mutex> lock(statsMu_);
  stats_.openConnections = 0;
}

Status TcpStoreServer::Loop::init() {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) return errnoStatus(StatusCode::kIoError, "epoll_create1", errno);
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) return errnoStatus(StatusCode::kIoError, "eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, listenFd_, &ev) != 0) {
    return errnoStatus(StatusCode::kIoError, "epoll_ctl", errno);
  }
  ev.data.u64 = kWakeTag;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) {
    return errnoStatus(StatusCode::kIoError, "epoll_ctl", errno);
  }
  return OkStatus();
}

void TcpStoreServer::Loop::requestStop() {
  stop_.store(true);
  uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof(one));
}

TcpStoreServer::Stats TcpStoreServer::Loop::stats() const {
  std::lock_guard<std::mutex> lock(statsMu_);
  return stats_;
}

int TcpStoreServer::Loop::nextTimeoutMs() const {
  int ms = acceptPausedUntil_.isNever() ? -1 : acceptPausedUntil_.remainingMsForPoll();
  if (!byDeadline_.empty()) {
    const int left = Deadline::at(byDeadline_.begin()->first).remainingMsForPoll();
    if (ms < 0 || left < ms) ms = left;
  }
  return ms;
}

void TcpStoreServer::Loop::run() {
  epoll_event events[64];
  while (!stop_.load()) {
    int n = ::epoll_wait(epfd_, events, 64, nextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      COFAB_LOG(kError, "store") << "epoll_wait failed: " << strerror(errno);
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        acceptAll();
        continue;
      }
      if (tag == kWakeTag) continue;
      int fd = static_cast<int>(tag);
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      if (events[i].events & (EPOLLERR | EPOLLHUP)) {
        closeConn(fd, "hang-up");
        continue;
      }
      if (events[i].events & EPOLLOUT) onWritable(it->second);
      it = conns_.find(fd);
      if (it != conns_.end() && (events[i].events & EPOLLIN)) onReadable(it->second);
    }
    serviceParked();
    updateBuffered();
    resumeAcceptingIfDue();
  }
}

void TcpStoreServer::Loop::pauseAccepting() {
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, listenFd_, nullptr);
  acceptPausedUntil_ = Deadline::afterMs(100);
}

void TcpStoreServer::Loop::resumeAcceptingIfDue() {
  if (acceptPausedUntil_.isNever() || !acceptPausedUntil_.expired()) return;
  acceptPausedUntil_ = Deadline::never();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, listenFd_, &ev) != 0) {
    COFAB_LOG(kError, "store") << "cannot watch the listening socket again: " << strerror(errno)
                               << "; no longer accepting";
  }
}

void TcpStoreServer::Loop::acceptAll() {
  while (true) {
    int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        uint64_t failures;
        {
          std::lock_guard<std::mutex> lock(statsMu_);
          failures = ++stats_.acceptFailures;
        }
        if (failures == 1 || failures % 100 == 0) {  // once, then every 10 s of it
          COFAB_LOG(kWarn, "store") << "accept failed: " << strerror(err)
                                    << " (raise ulimit -n); accepting again in 100 ms (" << failures
                                    << " failures so far)";
        }
        pauseAccepting();
      } else if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        COFAB_LOG(kWarn, "store") << "accept failed: " << strerror(err);
      }
      return;
    }
    if (static_cast<int>(conns_.size()) >= maxConnections_) {
      COFAB_LOG(kWarn, "store") << "connection limit " << maxConnections_ << " reached";
      ::close(fd);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = static_cast<uint64_t>(fd);
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    Conn& c = conns_[fd];
    c.fd = fd;
    c.id = nextConnId_++;
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.acceptedConnections;
    stats_.openConnections = conns_.size();
  }
}

void TcpStoreServer::Loop::closeConn(int fd, const char* why) {
  COFAB_LOG(kDebug, "store") << "closing connection fd " << fd << ": " << why;
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  if (auto it = conns_.find(fd); it != conns_.end() && it->second.parkId != 0) {
    unpark(it->second.parkId);
  }
  conns_.erase(fd);
  std::lock_guard<std::mutex> lock(statsMu_);
  stats_.openConnections = conns_.size();
}

void TcpStoreServer::Loop::onReadable(Conn& c) {
  uint8_t buf[65536];
  while (true) {
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
      // Never hold more than one maximal frame (plus one read) per connection.
      if (c.in.size() > store_proto::kMaxBodyBytes + store_proto::kFrameHeaderBytes + sizeof(buf)) {
        {
          std::lock_guard<std::mutex> lock(statsMu_);  // closeConn takes it too
          ++stats_.protocolErrors;
        }
        closeConn(c.fd, "input beyond one frame while a request is pending");
        return;
      }
      if (c.parkId == 0 && !serveFrames(c)) return;
      // A reply the socket did not take: read no more until it has gone (onWritable resumes),
      // so a client that sends requests without reading the answers is held back by TCP
      // instead of growing this server's memory by one answer per request.
      if (!c.out.empty()) return;
      continue;
    }
    if (n == 0) {
      closeConn(c.fd, "peer closed");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    closeConn(c.fd, strerror(errno));
    return;
  }
}

bool TcpStoreServer::Loop::serveFrames(Conn& c) {
  size_t off = 0;
  int fd = c.fd;
  while (c.parkId == 0 && c.out.empty() && c.in.size() - off >= store_proto::kFrameHeaderBytes) {
    auto len = store_proto::parseFrameHeader(c.in.data() + off, store_proto::kRequestMagic);
    if (!len.ok()) {
      COFAB_LOG(kWarn, "store") << "closing client: " << len.status().message();
      {
        std::lock_guard<std::mutex> lock(statsMu_);
        ++stats_.protocolErrors;
      }
      closeConn(fd, "bad frame header");
      return false;
    }
    if (c.in.size() - off < store_proto::kFrameHeaderBytes + *len) break;
    const uint8_t* body = c.in.data() + off + store_proto::kFrameHeaderBytes;
    off += store_proto::kFrameHeaderBytes + *len;
    if (!handle(c, body, *len)) {
      {
        std::lock_guard<std::mutex> lock(statsMu_);
        ++stats_.protocolErrors;
      }
      closeConn(fd, "malformed request");
      return false;
    }
    if (conns_.find(fd) == conns_.end()) return false;  // closed while replying
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(off));
  return true;
}

void TcpStoreServer::Loop::reply(Conn& c, const Writer& w) {
  Bytes frame = w.frame(store_proto::kResponseMagic);
  if (c.out.empty()) {
    ssize_t n = ::send(c.fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(frame.size())) return;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      closeConn(c.fd, "send failed");
      return;
    }
    c.out.assign(frame.begin() + (n > 0 ? n : 0), frame.end());
    c.outOffset = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  if (!c.wantWrite) {
    c.wantWrite = true;
    epoll_event ev{};
    ev.events = EPOLLOUT;  // not EPOLLIN: nothing is read while a reply waits (onReadable)
    ev.data.u64 = static_cast<uint64_t>(c.fd);
    ::epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
  }
}

void TcpStoreServer::Loop::onWritable(Conn& c) {
  while (c.outOffset < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.outOffset, c.out.size() - c.outOffset, MSG_NOSIGNAL);
    if (n > 0) {
      c.outOffset += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    closeConn(c.fd, "send failed");
    return;
  }
  c.out.clear();
  c.outOffset = 0;
  c.wantWrite = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = static_cast<uint64_t>(c.fd);
  ::epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
  // Requests that arrived while the reply waited are served now; more in the socket are
  // picked up by EPOLLIN.
  if (c.parkId == 0 && !c.in.empty()) serveFrames(c);
}

void TcpStoreServer::Loop::replyError(Conn& c, const Status& s) {
  Writer w;
  w.u8(static_cast<uint8_t>(Reply::kError));
  w.u8(static_cast<uint8_t>(s.code()));
  w.str(s.message());
  reply(c, w);
}

bool TcpStoreServer::Loop::handle(Conn& c, const uint8_t* body, size_t len) {
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.requests;
  }
  Reader r(body, len);
  auto op = r.u8();
  if (!op.ok()) return false;
  auto readKeys = [&](std::vector<std::string>* keys) -> bool {
    auto n = r.u32();
    if (!n.ok() || *n > store_proto::kMaxWaitKeys) return false;
    for (uint32_t i = 0; i < *n; ++i) {
      auto k = r.str();
      if (!k.ok()) return false;
      keys->push_back(std::move(*k));
    }
    return true;
  };
  auto validKeys = [&](const std::vector<std::string>& keys) {
    for (const auto& k : keys) {
      Status s = validateStoreKey(k);
      if (!s.ok()) {
        replyError(c, s);
        return false;
      }
    }
    return true;
  };
  Writer w;
  switch (static_cast<Op>(*op)) {
    case Op::kSet: {
      auto key = r.str();
      auto value = key.ok() ? r.blob() : StatusOr<Bytes>(key.status());
      if (!value.ok() || !r.done()) return false;
      if (!validKeys({*key})) return true;
      if (Status s = validateStoreValue(*value); !s.ok()) {
        replyError(c, s);
        return true;
      }
      keyWritten(data_.insert_or_assign(std::move(*key), std::move(*value)).first->first);
      w.u8(static_cast<uint8_t>(Reply::kOk));
      reply(c, w);
      return true;
    }
    case Op::kGet:
    case Op::kWait: {
      std::vector<std::string> keys;
      if (static_cast<Op>(*op) == Op::kGet) {
        auto key = r.str();
        if (!key.ok()) return false;
        keys.push_back(std::move(*key));
      } else if (!readKeys(&keys)) {
        return false;
      }
      auto timeoutMs = r.u32();
      if (!timeoutMs.ok() || !r.done()) return false;
      if (!validKeys(keys)) return true;
      const uint64_t id = nextParkId_++;
      Parked& p =
          parked_
              .emplace(id, Parked{c.fd, c.id, static_cast<Op>(*op), std::move(keys),
                                  Deadline::afterMs(*timeoutMs)})
              .first->second;
      if (!settle(id, p, false)) {
        c.parkId = id;
        if (!p.deadline.isNever()) byDeadline_.emplace(p.deadline.when(), id);
      }
      return true;
    }
    case Op::kAdd: {
      auto key = r.str();
      auto delta = key.ok() ? r.i64() : StatusOr<int64_t>(key.status());
      if (!delta.ok() || !r.done()) return false;
      if (!validKeys({*key})) return true;
      auto it = data_.find(*key);
      auto result = addToCounter(*key, it == data_.end() ? nullptr : &it->second, *delta);
      if (!result.ok()) {
        replyError(c, result.status());
        return true;
      }
      keyWritten(
          data_.insert_or_assign(std::move(*key), toBytes(std::to_string(*result))).first->first);
      w.u8(static_cast<uint8_t>(Reply::kOk));
      w.i64(*result);
      reply(c, w);
      return true;
    }
    case Op::kCompareSet: {
      auto key = r.str();
      auto expected = key.ok() ? r.blob() : StatusOr<Bytes>(key.status());
      auto desired = expected.ok() ? r.blob() : StatusOr<Bytes>(expected.status());
      if (!desired.ok() || !r.done()) return false;
      if (!validKeys({*key})) return true;
      if (Status s = validateStoreValue(*desired); !s.ok()) {
        replyError(c, s);
        return true;
      }
      auto it = data_.find(*key);
      bool matches = it == data_.end() ? expected->empty() : it->second == *expected;
      w.u8(static_cast<uint8_t>(Reply::kOk));
      if (matches) {
        w.blob(*desired);
        keyWritten(data_.insert_or_assign(std::move(*key), std::move(*desired)).first->first);
      } else {
        w.blob(it == data_.end() ? Bytes{} : it->second);
      }
      reply(c, w);
      return true;
    }
    case Op::kRemove: {
      auto key = r.str();
      if (!key.ok() || !r.done()) return false;
      if (!validKeys({*key})) return true;
      w.u8(static_cast<uint8_t>(Reply::kOk));
      w.u8(data_.erase(*key) > 0 ? 1 : 0);
      reply(c, w);
      return true;
    }
    case Op::kCheck: {
      std::vector<std::string> keys;
      if (!readKeys(&keys) || !r.done()) return false;
      if (!validKeys(keys)) return true;
      bool all = true;
      for (const auto& k : keys) all = all && data_.count(k) > 0;
      w.u8(static_cast<uint8_t>(Reply::kOk));
      w.u8(all ? 1 : 0);
      reply(c, w);
      return true;
    }
  }
  return false;  // unknown op
}

bool TcpStoreServer::Loop::settle(uint64_t id, Parked& p, bool timedOut) {
  auto conn = conns_.find(p.fd);
  if (conn == conns_.end() || conn->second.id != p.connId) {  // client gone: drop
    unpark(id);
    return true;
  }
  auto missingAt = [&](size_t i) { return data_.find(p.keys[i]) == data_.end(); };
  // From the awaited key on, then the ones before it: a remove may have taken one away again.
  size_t next = p.keys.size();
  for (size_t i = p.awaited; i < p.keys.size() && next == p.keys.size(); ++i) {
    if (missingAt(i)) next = i;
  }
  for (size_t i = 0; i < p.awaited && next == p.keys.size(); ++i) {
    if (missingAt(i)) next = i;
  }
  if (next < p.keys.size() && !timedOut) {
    p.awaited = next;
    waitingOn_[p.keys[next]].insert(id);
    return false;
  }
  Writer w;
  if (next < p.keys.size()) {
    std::vector<const std::string*> missing;
    for (size_t i = 0; i < p.keys.size(); ++i) {
      if (missingAt(i)) missing.push_back(&p.keys[i]);
    }
    w.u8(static_cast<uint8_t>(Reply::kTimeout));
    w.u32(static_cast<uint32_t>(missing.size()));
    for (const auto* k : missing) w.str(*k);
  } else {
    w.u8(static_cast<uint8_t>(Reply::kOk));
    if (p.op == Op::kGet) w.blob(data_.find(p.keys[0])->second);
  }
  // Unparked before the reply, which may close the connection (and look for its park).
  unpark(id);
  Conn& c = conn->second;
  c.parkId = 0;
  reply(c, w);
  return true;
}

void TcpStoreServer::Loop::unpark(uint64_t id) {
  auto it = parked_.find(id);
  if (it == parked_.end()) return;
  const Parked& p = it->second;
  // A wait for no keys (one rank's communicator waits for every other rank's) is answered at
  // once and was never registered.
  if (p.awaited < p.keys.size()) {
    if (auto w = waitingOn_.find(p.keys[p.awaited]); w != waitingOn_.end()) {
      w->second.erase(id);
      if (w->second.empty()) waitingOn_.erase(w);
    }
  }
  if (!p.deadline.isNever()) byDeadline_.erase({p.deadline.when(), id});
  parked_.erase(it);
}

void TcpStoreServer::Loop::keyWritten(const std::string& key) {
  auto w = waitingOn_.find(key);
  if (w == waitingOn_.end()) return;
  woken_.insert(woken_.end(), w->second.begin(), w->second.end());
  waitingOn_.erase(w);
}

void TcpStoreServer::Loop::serviceParked() {
  // Until nothing changes: a client whose request completed may have pipelined more frames,
  // and a set among them can complete requests this pass already looked at (they would
  // otherwise wait for their deadline).
  const auto now = Clock::now();
  while (!byDeadline_.empty() && byDeadline_.begin()->first <= now) {
    woken_.push_back(byDeadline_.begin()->second);
    byDeadline_.erase(byDeadline_.begin());
  }
  while (!woken_.empty()) {
    std::vector<uint64_t> ready;
    ready.swap(woken_);
    std::vector<int> resumed;
    for (uint64_t id : ready) {
      auto it = parked_.find(id);
      if (it == parked_.end()) continue;  // answered, or its connection closed
      Parked& p = it->second;
      const int fd = p.fd;
      if (settle(id, p, p.deadline.expired())) resumed.push_back(fd);
    }
    for (int fd : resumed) {
      auto c = conns_.find(fd);
      if (c != conns_.end() && !c->second.in.empty() && c->second.parkId == 0) {
        serveFrames(c->second);
      }
    }
  }
}

void TcpStoreServer::Loop::updateBuffered() {
  uint64_t total = 0;
  for (const auto& [_, c] : conns_) total += c.in.size() + (c.out.size() - c.outOffset);
  std::lock_guard<std::mutex> lock(statsMu_);
  stats_.bufferedBytes = total;
  stats_.keys = data_.size();
}

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(
    const TcpStoreServerOptions& options) {
  if (options.maxConnections <= 0) {
    return InvalidArgument("TcpStoreServer maxConnections must be positive");
  }
  uint16_t port = 0;
  COFAB_ASSIGN_OR_RETURN(int fd,
                         listenTcp(HostPort{options.bindAddress, options.port}, 512, &port));
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->loop_ = std::make_unique<Loop>(fd, options.maxConnections);
  COFAB_RETURN_IF_ERROR(server->loop_->init());
  server->host_ = options.bindAddress == "0.0.0.0" || options.bindAddress == "::"
                      ? "127.0.0.1"
                      : options.bindAddress;
  server->port_ = port;
  Loop* loop = server->loop_.get();
  server->thread_ = std::thread([loop] { loop->run(); });
  COFAB_LOG(kInfo, "store") << "TcpStore server listening on " << server->url();
  return server;
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> lock(stopMu_);  // two stop()s must not both join
  if (!thread_.joinable()) return;
  loop_->requestStop();
  thread_.join();
  loop_->closeAll();
}

std::string TcpStoreServer::url() const { return "tcp://" + HostPort{host_, port_}.toString(); }

TcpStoreServer::Stats TcpStoreServer::stats() const { return loop_->stats(); }

}  // namespace cofab
