// cofab-coded started by cofab-run: a master and 4 worker processes (role "coded") meet through
// the launcher's store; the master's demo checks every result against a local sgemm and exits 0
// only if all requests succeeded, so the deployment path of docs/CODED.md works end to end.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

TEST(CofabCodedCli, MasterAndWorkersUnderCofabRun) {
  const std::string cmd = std::string(COFAB_RUN_BINARY) + " -n 1 --role coded:4:\"" +
                          COFAB_CODED_BINARY + " worker\" -- " + COFAB_CODED_BINARY +
                          " master --n=4 --k=3 --rows=50 --cols=16 --bcols=3 --requests=3 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("request 2:"), std::string::npos) << out;
}

}  // namespace
