#include "fabric/transport/tcp/lingering_close.h"

#include <linux/sockios.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

namespace cofab::transport::tcp {
namespace {

// Reads and discards what has arrived; true when the peer closed or the socket failed.
bool drainSocket(int fd) {
  char discard[16384];
  // A bounded number of reads per call: a peer that keeps sending must not hold the loop (the
  // socket is level-triggered, so what is left wakes the loop again).
  for (int reads = 0; reads < 64; ++reads) {
    const ssize_t n = ::recv(fd, discard, sizeof(discard), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;
  }
  return false;
}

// True when the kernel holds no unacknowledged byte of ours (the FIN included).
bool sendQueueEmpty(int fd) {
  int unacked = 0;
  // On failure (not a tcp socket any more?) there is nothing to wait for.
  return ::ioctl(fd, SIOCOUTQ, &unacked) != 0 || unacked == 0;
}

// Lingering closes whose loop stopped first (their context was closed and joined): one
// background thread finishes them the same way, so that closing a context neither waits for
// them nor cuts them short. Cutting them short lost data: once the descriptor is closed, the
// next bytes from the peer are answered with a RST, which discards what is still queued.
class OrphanedCloses {
 public:
  // Never destroyed: the thread may still run while static destructors do.
  static OrphanedCloses& get() {
    static auto* const orphans = [] {
      auto* o = new OrphanedCloses;
      // A fork while the thread holds the mutex would leave it locked in the child for good:
      // held across fork(), then released in both; the child starts with none of it (no thread,
      // and its copies of the sockets are closed: the parent's thread finishes those).
      ::pthread_atfork([] { get().mu_.lock(); }, [] { get().mu_.unlock(); },
                       [] {
                         OrphanedCloses& self = get();
                         self.sockets_.clear();
                         self.threadRunning_ = false;
                         self.mu_.unlock();
                       });
      return o;
    }();
    return *orphans;
  }

  // Called from destructors: never throws. Without a thread (none can be started), the socket
  // is closed at once after a last drain, as a plain close would.
  void adopt(Fd fd, std::chrono::steady_clock::time_point deadline) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      sockets_.push_back({std::move(fd), deadline});
      if (!threadRunning_) {
        std::thread([this] { run(); }).detach();
        threadRunning_ = true;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!threadRunning_) {
        for (const Socket& s : sockets_) drainSocket(s.fd.get());
        sockets_.clear();
      }
    }
  }

 private:
  struct Socket {
    Fd fd;
    std::chrono::steady_clock::time_point deadline;
  };

  void run() {
    for (;;) {
      std::this_thread::sleep_for(LingeringClose::kPollInterval);
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(sockets_, [&](const Socket& s) {
        return drainSocket(s.fd.get()) || sendQueueEmpty(s.fd.get()) || now >= s.deadline;
      });
      if (sockets_.empty()) {
        threadRunning_ = false;
        return;
      }
    }
  }

  std::mutex mu_;
  std::vector<Socket> sockets_;
  bool threadRunning_ = false;
};

}  // namespace

void LingeringClose::start(EpollLoop& loop, Fd fd) {
  ::shutdown(fd.get(), SHUT_WR);
  std::shared_ptr<LingeringClose> self(new LingeringClose(loop, std::move(fd)));
  if (self->drainInput() || self->allAcknowledged()) {
    self->finished_ = true;  // closes now: nothing to lose
    return;
  }
  self->timer_ = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  // Without a timer (out of descriptors) or the socket's registration on the loop, the
  // background finisher takes the socket (the destructor hands it over); without the timer's
  // registration, it closes now.
  if (!self->timer_.valid()) return;
  const auto ns = std::chrono::nanoseconds(kPollInterval).count();
  itimerspec every{};
  every.it_interval.tv_nsec = ns;
  every.it_value.tv_nsec = ns;
  if (::timerfd_settime(self->timer_.get(), 0, &every, nullptr) != 0) return;
  if (!loop.add(self->fd_.get(), EPOLLIN | EPOLLRDHUP, self).ok()) return;
  if (!loop.add(self->timer_.get(), EPOLLIN, self).ok()) {
    loop.remove(self->fd_.get());
    self->finished_ = true;
  }
}

LingeringClose::LingeringClose(EpollLoop& loop, Fd fd)
    : loop_(loop), fd_(std::move(fd)), deadline_(std::chrono::steady_clock::now() + kLimit) {}

LingeringClose::~LingeringClose() {
  // The loop stopped first (its context closed): the socket lingers on without it.
  if (!finished_) OrphanedCloses::get().adopt(std::move(fd_), deadline_);
}

void LingeringClose::handleEvents(uint32_t /*events*/) {
  if (finished_) return;  // removed earlier in this iteration
  uint64_t ticks;
  [[maybe_unused]] const ssize_t r = ::read(timer_.get(), &ticks, sizeof(ticks));
  if (drainInput() || allAcknowledged() || std::chrono::steady_clock::now() >= deadline_) {
    finish();
  }
}

bool LingeringClose::drainInput() { return drainSocket(fd_.get()); }

bool LingeringClose::allAcknowledged() const { return sendQueueEmpty(fd_.get()); }

void LingeringClose::finish() {
  finished_ = true;
  // The loop keeps this handler (and so both descriptors) until the end of the iteration.
  loop_.remove(fd_.get());
  loop_.remove(timer_.get());
}

}  // namespace cofab::transport::tcp
