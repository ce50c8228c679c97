// cofab-sched's command line and startup, on the real binary:
// - negative or malformed sizes exit 1 naming the option (strtoull read "-1" as 2^64-1);
// - a SIGTERM that arrives during startup (SIGTERM / SIGINT are blocked from before the store is
//   opened) stops it before it publishes cofab/sched/address. Before, it finished starting,
//   published the address and exited 0 at once, so workers read a dead scheduler's address.
//   Deterministic: the test waits (bounded) until the process blocks SIGTERM (/proc SigBlk),
//   sends SIGTERM, and only then publishes the daemons' count the scheduler is waiting for.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transfer/central_scheduler.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"

namespace cofab::testing {
namespace {

// Runs cofab-sched with `args` and COFAB_STORE unset (so only the flags name a store), killed
// after 20 s (exit 124) should it start serving instead of refusing the command line.
ShellRun runSched(const std::string& args) {
  return runShell(std::string("env -u COFAB_STORE timeout 20 ") + COFAB_SCHED_PATH + " " + args);
}

TEST(CofabSchedCli, NegativeOrMalformedSizesExit1NamingTheOption) {
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {"--dest-bytes -1", "--dest-bytes expects an integer"},
      {"--rate -1", "--rate expects an integer"},
      {"--destinations -1", "--destinations expects an integer"},
      {"--dest-bytes 0", "--dest-bytes expects an integer"},
      {"--dest-bytes 12x", "--dest-bytes expects an integer"},
      {"--rate 18446744073709551616", "--rate expects an integer"},
      // The variables' ranges (2^40): the flags took up to 2^63 - 1.
      {"--rate 2000000000000", "--rate expects an integer"},
      {"--dest-bytes 2000000000000", "--dest-bytes expects an integer"},
      {"--destinations 4097", "--destinations expects an integer"},
      {"--dest-bytes 4096 --bogus 1", "unknown option --bogus"},
  };
  for (const Case& c : cases) {
    const ShellRun r = runSched(c.args);
    EXPECT_EQ(r.exitCode, 1) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << ": " << r.out;
  }
}

TEST(CofabSchedCli, SigtermDuringStartupStopsItBeforePublishingItsAddress) {
  TempDir dir;
  const std::string url = "file://" + dir.path();
  auto store = openStore(url, Deadline::afterMs(10000));
  ASSERT_TRUE(store.ok()) << store.status();

  // No --destinations: it waits for the daemons' count in the store.
  const pid_t pid = spawnDaemon({COFAB_SCHED_PATH, "--store", url, "--listen", "127.0.0.1:0"});
  auto reapWithin = [&](int ms, int* status) {
    return reapBefore(pid, Deadline::afterMs(ms), status);
  };

  // Startup has begun (signals blocked, the store being opened or the count awaited).
  const Deadline blocked = Deadline::afterMs(20000);
  while (!handlesStopSignal(pid, SIGTERM) && !blocked.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!handlesStopSignal(pid, SIGTERM)) {
    ::kill(pid, SIGKILL);
    int ignored = 0;
    ::waitpid(pid, &ignored, 0);
    FAIL() << "cofab-sched never blocked SIGTERM (exited early?)";
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  // Now what it waits for: before the fix it started, published and exited 0 at once.
  ASSERT_TRUE((*store)->set(ps::serverCountKey("cofab/agg"), toBytes("1")).ok());

  int status = 0;
  if (!reapWithin(20000, &status)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "cofab-sched did not exit within 20 s of SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto published = (*store)->check({transfer::schedulerAddressKey("cofab/sched")});
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_FALSE(*published) << "a scheduler stopped during startup published its address";
}

}  // namespace
}  // namespace cofab::testing
