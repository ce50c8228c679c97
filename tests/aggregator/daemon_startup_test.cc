// cofab-aggd stopped while it starts up: it exits 0 without advertising itself to workers.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transport/registry.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"

namespace cofab::testing {
namespace {

// Sends SIGTERM to a starting cofab-aggd (`settleMs` after it installed its handler) and checks
// that it exits 0 logging event=stopped_before_serving, within 20 s.
void expectStopsBeforeServing(pid_t pid, const std::string& log, int settleMs) {
  const Deadline started = Deadline::afterMs(20000);
  while (!handlesStopSignal(pid, SIGTERM) && !started.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(handlesStopSignal(pid, SIGTERM)) << "cofab-aggd never reached its startup";
  std::this_thread::sleep_for(std::chrono::milliseconds(settleMs));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  if (!reapBefore(pid, Deadline::afterMs(20000), &status)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "cofab-aggd did not exit within 20 s of SIGTERM";
  }
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("event=stopped_before_serving signal=15"), std::string::npos) << out;
}

TEST(DaemonStartup, SigtermWhileWaitingForTheBackupStopsBeforeServing) {
  TempDir dir;
  const std::string url = "file://" + dir.path();
  const std::string log = dir.path() + "/aggd.log";
  // With replication and no daemon 1, startup waits for its backup's address.
  const pid_t pid = spawnDaemon({COFAB_AGGD_PATH, "--store", url, "--workers", "1", "--servers",
                                 "2", "--id", "0", "--replication", "on", "--http", "off"},
                                log);
  expectStopsBeforeServing(pid, log, 0);
  if (HasFatalFailure()) return;
  auto store = openStore(url, Deadline::afterMs(5000));
  ASSERT_TRUE(store.ok()) << store.status();
  auto published = (*store)->check({ps::serverAddressKey("cofab/agg", 0)});
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_FALSE(*published) << "a stopped daemon advertised itself to workers";
}

// The same with a static peer list (--peers): the daemon connects to its backup's address, which
// nobody serves yet, and the connect retried until --connect-timeout-ms without looking at the
// stop request: 60 s, then exit 1 with the connect's DeadlineExceeded.
TEST(DaemonStartup, SigtermWhileConnectingToTheBackupStopsBeforeServing) {
  TempDir dir;
  const std::string log = dir.path() + "/aggd.log";
  auto freePort = [] {
    auto ctx = transport::Registry::create("tcp", {.localId = "probe"});
    auto l = ctx.ok() ? (*ctx)->listen({.address = "127.0.0.1:0"})
                      : StatusOr<std::unique_ptr<transport::Listener>>(ctx.status());
    std::string a = l.ok() ? (*l)->address() : "127.0.0.1:1";
    if (l.ok()) (*l)->close();
    if (ctx.ok()) (*ctx)->join();
    return a;
  };
  const std::string peers = freePort() + "," + freePort();
  const pid_t pid = spawnDaemon({COFAB_AGGD_PATH, "--peers", peers, "--workers", "1", "--id", "0",
                                 "--replication", "on", "--http", "off"},
                                log);
  expectStopsBeforeServing(pid, log, 300);  // 300 ms: into the connect's retries
}

// Daemons of one job that disagree on --servers: the store holds one count (the first daemon's)
// that workers read, while each daemon places chunks and backups by its own. The second used
// to overwrite the count and serve; it now exits 1 naming both counts, before publishing its
// address.
TEST(DaemonStartup, ADaemonWithAnotherServerCountThanTheJobsIsRefused) {
  TempDir dir;
  const std::string url = "file://" + dir.path();
  const std::string log = dir.path() + "/aggd.log";
  {
    auto store = openStore(url, Deadline::afterMs(5000));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->set(ps::serverCountKey("cofab/agg"), toBytes("3")).ok());
  }
  const pid_t pid = spawnDaemon({COFAB_AGGD_PATH, "--store", url, "--workers", "1", "--servers",
                                 "2", "--id", "0", "--http", "off"},
                                log);
  int status = 0;
  const bool exited = reapBefore(pid, Deadline::afterMs(20000), &status);
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(exited) << "the daemon served with a count the job does not have\n" << out;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("says --servers 2"), std::string::npos) << out;
  EXPECT_NE(out.find("holds 3"), std::string::npos) << out;
  auto store = openStore(url, Deadline::afterMs(5000));
  ASSERT_TRUE(store.ok()) << store.status();
  auto published = (*store)->check({ps::serverAddressKey("cofab/agg", 0)});
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_FALSE(*published) << "the refused daemon advertised itself to workers";
}

}  // namespace
}  // namespace cofab::testing
