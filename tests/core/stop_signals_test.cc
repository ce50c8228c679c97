// StopSignals: a stop request reaches the main thread even when the kernel hands it to a thread
// that existed before main blocked it (as OpenBLAS's pool does in every cofab binary).
#include "core/stop_signals.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <thread>

namespace cofab {
namespace {

// Runs `body` in a forked child; returns its wait status.
template <typename Fn>
int inChild(Fn body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignals, ASignalTakenByAForeignThreadStillReachesWait) {
  const int status = inChild([] {
    int ready[2], park[2];
    if (::pipe(ready) != 0 || ::pipe(park) != 0) return 100;
    // Started before install(): SIGTERM is not blocked there, and main blocks it below, so the
    // kernel must deliver the process-directed signal to this thread.
    std::thread foreign([&] {
      char c;
      (void)!::read(park[0], &c, 1);
    });
    StopSignals::install();
    ::kill(::getpid(), SIGTERM);
    const int sig = StopSignals::wait();
    (void)!::write(park[1], "x", 1);
    foreign.join();
    return sig;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the process died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), SIGTERM);
}

TEST(StopSignals, PendingSeesASignalSentWhileEveryThreadBlocksIt) {
  const int status = inChild([] {
    StopSignals::install();
    if (StopSignals::pending() != 0) return 101;
    ::kill(::getpid(), SIGINT);  // only thread, blocked: stays pending on the process
    const int first = StopSignals::pending();
    if (StopSignals::pending() != 0) return 102;  // consumed
    return first;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the process died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), SIGINT);
}

}  // namespace
}  // namespace cofab
