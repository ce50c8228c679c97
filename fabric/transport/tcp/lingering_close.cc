#include "fabric/transport/tcp/lingering_close.h"

#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

namespace cofab::transport::tcp {

void LingeringClose::start(EpollLoop& loop, Fd fd) {
  ::shutdown(fd.get(), SHUT_WR);
  std::shared_ptr<LingeringClose> self(new LingeringClose(loop, std::move(fd)));
  if (self->drainInput() || self->allAcknowledged()) return;  // closes now: nothing to lose
  self->timer_ = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  // Without a timer (out of descriptors) or a registration, the socket closes now: what the
  // RST loses is what a plain close would have lost.
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
  // The loop stopped first (its context closed): leave the receive queue empty so that the
  // close sends a FIN, and the kernel goes on delivering what is queued, if nothing else comes.
  if (!finished_) drainInput();
}

void LingeringClose::handleEvents(uint32_t /*events*/) {
  if (finished_) return;  // removed earlier in this iteration
  uint64_t ticks;
  [[maybe_unused]] const ssize_t r = ::read(timer_.get(), &ticks, sizeof(ticks));
  if (drainInput() || allAcknowledged() || std::chrono::steady_clock::now() >= deadline_) {
    finish();
  }
}

bool LingeringClose::drainInput() {
  char discard[16384];
  // A bounded number of reads per call: a peer that keeps sending must not hold the loop (the
  // socket is level-triggered, so what is left wakes the loop again).
  for (int reads = 0; reads < 64; ++reads) {
    const ssize_t n = ::recv(fd_.get(), discard, sizeof(discard), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;
  }
  return false;
}

bool LingeringClose::allAcknowledged() const {
  int unacked = 0;
  // On failure (not a tcp socket any more?) there is nothing to wait for.
  return ::ioctl(fd_.get(), SIOCOUTQ, &unacked) != 0 || unacked == 0;
}

void LingeringClose::finish() {
  finished_ = true;
  // The loop keeps this handler (and so both descriptors) until the end of the iteration.
  loop_.remove(fd_.get());
  loop_.remove(timer_.get());
}

}  // namespace cofab::transport::tcp
