#include "core/stop_signals.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

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

// Stop signals the process was started with ignored (a shell's background command gets SIGINT
// ignored, nohup's children SIGHUP): set by install(), before any thread reads it.
bool gIgnored[2] = {false, false};
constexpr int kStopSignals[2] = {SIGTERM, SIGINT};

// The stop signals this process takes: an ignored one stays ignored, and out of the set (a
// blocked signal is queued even when ignored, and pending() would then take it as a stop).
sigset_t stopSet() {
  sigset_t s;
  sigemptyset(&s);
  for (int i = 0; i < 2; ++i) {
    if (!gIgnored[i]) sigaddset(&s, kStopSignals[i]);
  }
  return s;
}

// Threads that existed before install() (OpenBLAS starts its pool when the library loads) are
// made to block the stop signals too, each from inside itself: a handler for this signal adds
// them to the mask the thread gets back when the handler returns. Once every thread blocks them,
// a stop signal stays pending on the process until the main thread takes it, so pending() sees
// every signal sent before it was called. While one thread still took them through the
// handler, a signal that thread had dequeued but not yet written to the pipe was invisible, and
// a daemon whose startup wait ended at that moment went on to publish its address.
int maskSignal() { return SIGRTMIN + 5; }
std::atomic<int> gMasked{0};

void onMaskSignal(int, siginfo_t*, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  sigaddset(&uc->uc_sigmask, SIGTERM);
  sigaddset(&uc->uc_sigmask, SIGINT);
  gMasked.fetch_add(1);
}

// The other threads of this process, as the kernel lists them now.
std::set<pid_t> otherThreads() {
  std::set<pid_t> tids;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return tids;
  const pid_t self = static_cast<pid_t>(::syscall(SYS_gettid));
  while (dirent* e = ::readdir(d)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid > 0 && tid != self) tids.insert(tid);
  }
  ::closedir(d);
  return tids;
}

// Best effort, bounded: a thread that blocks the mask signal never answers, and then takes
// stop signals through onStopSignal as before (the pipe still says "stop", only later). The
// signal interrupts what those threads wait in (a poll or sleep may return EINTR once); under
// TSan, which runs handlers on a copy of the context, the mask change is lost (same fallback).
void maskInEveryThread() {
  // Someone else's signal (a profiler, an MPI library): leave it alone, and the older threads
  // take stop signals through onStopSignal as before.
  struct sigaction old {};
  if (sigaction(maskSignal(), nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) != 0 ||
      old.sa_handler != SIG_DFL) {
    return;
  }
  struct sigaction sa {};
  sa.sa_sigaction = onMaskSignal;
  // Blocked from the handler's entry, not only once it returns: a thread counted as masked must
  // not take a stop signal while it is still in the handler.
  sa.sa_mask = stopSet();
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  // Left installed afterwards: a late delivery must find this handler, not the default action
  // (which ends the process).
  if (sigaction(maskSignal(), &sa, nullptr) != 0) return;
  std::set<pid_t> signalled;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  // Twice over the list: a thread may have started one while we signalled the others.
  for (int round = 0; round < 2; ++round) {
    for (pid_t tid : otherThreads()) {
      if (signalled.count(tid) != 0) continue;
      if (::syscall(SYS_tgkill, ::getpid(), tid, maskSignal()) == 0) signalled.insert(tid);
    }
    while (gMasked.load() < static_cast<int>(signalled.size()) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
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
    for (int i = 0; i < 2; ++i) {
      struct sigaction old {};
      sigaction(kStopSignals[i], nullptr, &old);
      gIgnored[i] = old.sa_handler == SIG_IGN;
      if (!gIgnored[i]) sigaction(kStopSignals[i], &sa, nullptr);
    }
    const sigset_t set = stopSet();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    maskInEveryThread();
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
