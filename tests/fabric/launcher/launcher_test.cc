// cofab-run as a user runs it: a real binary starting real processes.
#include <sys/stat.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "fabric/launcher/launcher.h"
#include "tests/support/temp_dir.h"

namespace cofab {
namespace {

struct RunResult {
  int exitCode = -1;
  std::string output;  // stdout and stderr together
};

RunResult runCofabRun(const std::string& args) {
  std::string cmd = std::string(COFAB_RUN_BINARY) + " " + args + " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string writeScript(const testing::TempDir& dir, const std::string& body) {
  std::string path = dir.path() + "/job.sh";
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(LauncherTest, EveryRankGetsItsEnvironmentAndPrefixedOutput) {
  testing::TempDir dir;
  auto script = writeScript(dir,
                            "echo \"r=$COFAB_RANK n=$COFAB_WORLD_SIZE l=$COFAB_LOCAL_RANK "
                            "s=${COFAB_STORE%%:*}\"\necho to-stderr >&2\n");
  auto r = runCofabRun("-n 3 " + script);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string rs = std::to_string(rank);
    EXPECT_NE(r.output.find("[rank " + rs + "] r=" + rs + " n=3 l=" + rs + " s=tcp"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("[rank " + rs + "] to-stderr"), std::string::npos) << r.output;
  }
}

TEST(LauncherTest, AFailingRankStopsTheOthersAndIsNamed) {
  testing::TempDir dir;
  auto script = writeScript(dir,
                            "if [ \"$COFAB_RANK\" = 1 ]; then sleep 0.2; exit 7; fi\n"
                            "sleep 30\necho should-not-finish\n");
  auto r = runCofabRun("-n 3 --grace-ms 2000 " + script);
  EXPECT_EQ(r.exitCode, 7) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with status 7"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("should-not-finish"), std::string::npos) << r.output;
}

TEST(LauncherTest, ARankKilledBySignalIsNamedWithTheSignal) {
  testing::TempDir dir;
  auto script = writeScript(dir, "if [ \"$COFAB_RANK\" = 0 ]; then kill -9 $$; fi\nsleep 30\n");
  auto r = runCofabRun("-n 2 --grace-ms 2000 " + script);
  EXPECT_EQ(r.exitCode, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("rank 0 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("killed by signal 9"), std::string::npos) << r.output;
}

TEST(LauncherTest, RoleProcessesRunBesideWorkersAndAreStoppedAtTheEnd) {
  testing::TempDir dir;
  std::string marker = dir.path() + "/role";
  auto script = writeScript(dir, "sleep 0.2\necho worker-done\n");
  auto r = runCofabRun("-n 2 --role 'aggd:2:echo role=$COFAB_ROLE.$COFAB_ROLE_RANK of "
                       "$COFAB_ROLE_SIZE; exec sleep 60' " + script);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("[aggd.0] role=aggd.0 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[aggd.1] role=aggd.1 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] worker-done"), std::string::npos) << r.output;
}

TEST(LauncherTest, SigtermIsForwardedAndReported) {
  testing::TempDir dir;
  // Each rank says it is ready only after its trap is installed, so the SIGTERM below can never
  // arrive before the rank can report it, however slow the machine.
  auto script = writeScript(dir, "trap 'echo got-term; exit 0' TERM\ntouch " + dir.path() +
                                     "/ready.$COFAB_RANK\nsleep 30 & wait\n");
  std::string cmd = std::string(COFAB_RUN_BINARY) + " -n 2 " + script + " > " + dir.path() +
                    "/out 2>&1 & pid=$!; i=0; while [ $i -lt 600 ] && ! { [ -e " + dir.path() +
                    "/ready.0 ] && [ -e " + dir.path() + "/ready.1 ]; }; do sleep 0.1; " +
                    "i=$((i+1)); done; kill -TERM $pid; wait $pid";
  int status = std::system(("sh -c '" + cmd + "'").c_str());
  std::ifstream in(dir.path() + "/out");
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(WEXITSTATUS(status), 128 + 15) << out;
  EXPECT_NE(out.find("forwarding"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0] got-term"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1] got-term"), std::string::npos) << out;
}

TEST(LauncherArgsTest, BadArgumentsAreExplained) {
  EXPECT_FALSE(parseLaunchArgs({}).ok());
  auto noN = parseLaunchArgs({"prog"});
  ASSERT_FALSE(noN.ok());
  EXPECT_NE(noN.status().message().find("-n N is required"), std::string::npos);
  EXPECT_NE(parseLaunchArgs({"-n", "0", "prog"}).status().message().find("integer >= 1"),
            std::string::npos);
  EXPECT_NE(parseLaunchArgs({"-n", "2", "--role", "bad", "prog"}).status().message().find(
                "NAME:COUNT:COMMAND"),
            std::string::npos);
  EXPECT_NE(parseLaunchArgs({"-n", "2", "--bogus", "prog"}).status().message().find("'--bogus'"),
            std::string::npos);
  auto ok = parseLaunchArgs({"-n", "4", "--role", "aggd:2:cofab-aggd --x", "--", "prog", "-n", "9"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->nprocs, 4);
  ASSERT_EQ(ok->roles.size(), 1u);
  EXPECT_EQ(ok->roles[0].command, "cofab-aggd --x");
  EXPECT_EQ(ok->argv, (std::vector<std::string>{"prog", "-n", "9"}));
}

}  // namespace
}  // namespace cofab
