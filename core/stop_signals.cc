#include "core/stop_signals.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "core/check.h"

namespace cofab {
namespace {

int gPipe[2] = {-1, -1};

void onStopSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(gPipe[1], &b, 1);  // async-signal-safe; a full pipe already says "stop"
  errno = saved;
}

sigset_t stopSet() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  return s;
}

int readPipe() {
  unsigned char b = 0;
  const ssize_t n = ::read(gPipe[0], &b, 1);
  return n == 1 ? b : 0;
}

}  // namespace

void StopSignals::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    COFAB_CHECK(::pipe2(gPipe, O_CLOEXEC | O_NONBLOCK) == 0) << "StopSignals: pipe2 failed";
    // The handler before the block: once this thread shows the signals blocked (what a test
    // or a supervisor may wait for), a signal delivered to any other thread is already caught.
    struct sigaction sa {};
    sa.sa_handler = onStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    const sigset_t set = stopSet();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  });
}

int StopSignals::pending() {
  COFAB_CHECK(gPipe[0] >= 0) << "StopSignals::pending() before install()";
  if (int sig = readPipe(); sig != 0) return sig;
  // Sent to the process while every thread blocked it: still pending, take it here.
  const sigset_t set = stopSet();
  const timespec zero{0, 0};
  const int sig = sigtimedwait(&set, nullptr, &zero);
  return sig > 0 ? sig : 0;
}

int StopSignals::wait() {
  if (int sig = pending(); sig != 0) return sig;
  // From here the main thread takes them too (through the handler): whichever thread gets one,
  // the pipe wakes us.
  const sigset_t set = stopSet();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  while (true) {
    pollfd p{gPipe[0], POLLIN, 0};
    (void)::poll(&p, 1, -1);  // EINTR: our own handler ran; the pipe says which signal
    if (int sig = readPipe(); sig != 0) {
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      return sig;
    }
  }
}

}  // namespace cofab
