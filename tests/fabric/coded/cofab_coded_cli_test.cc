// cofab-coded started by cofab-run: a master and 4 worker processes (role "coded") meet through
// the launcher's store; the master's demo checks every result against a local sgemm and exits 0
// only if all requests succeeded, so the deployment path of docs/CODED.md works end to end.
// And its command line: bad flags exit 2 with a message.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/support/process_group.h"

namespace {

using cofab::testing::runShell;
using cofab::testing::ShellRun;

TEST(CofabCodedCli, MasterAndWorkersUnderCofabRun) {
  const std::string cmd = std::string(COFAB_RUN_BINARY) + " -n 1 --role coded:4:\"" +
                          COFAB_CODED_BINARY + " worker\" -- " + COFAB_CODED_BINARY +
                          " master --n=4 --k=3 --rows=50 --cols=16 --bcols=3 --requests=3";
  const ShellRun r = runShell(cmd);
  EXPECT_EQ(r.exitCode, 0) << r.out;
  EXPECT_NE(r.out.find("request 2:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos) << r.out;
}

// Bad command lines exit 2 with the reason (naming the flag) and the usage, before touching the
// store (the file store's directory below is never created). Before: --rows=-1 aborted in a
// vector allocation, --requests=abc / -5 ran no request and exited 0, --n=8x ran with n=8,
// --index=x ran worker 0 and misspelled flags were ignored.
TEST(CofabCodedCli, BadFlagsExit2NamingTheFlag) {
  const std::string store = " --store=file:///nonexistent/cofab-coded-cli-test";
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {"master --rows=-1", "--rows"},
      {"master --requests=abc", "--requests"},
      {"master --requests=-5", "--requests"},
      {"master --n=8x", "--n"},
      {"master --shift_ms=nan", "--shift_ms"},
      {"master --reqests=3", "unknown flag --reqests"},
      {"master --rows", "--flag=value"},
      {"worker --index=x", "--index"},
      {"worker --index=1 --idnex=2", "unknown flag --idnex"},
  };
  for (const Case& c : cases) {
    // Bounded: before the fix some of these ran (--index=x: a worker waiting for its master).
    const ShellRun r =
        runShell("timeout 20 " + std::string(COFAB_CODED_BINARY) + " " + c.args + store);
    EXPECT_EQ(r.exitCode, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find("usage: cofab-coded"), std::string::npos) << c.args << ": " << r.out;
  }
}

}  // namespace
