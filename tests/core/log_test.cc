#include "core/log.h"

#include <gtest/gtest.h>

#include "core/param.h"

namespace cofab {
namespace {

TEST(LogTest, LevelThresholdAndSubsystemFilter) {
  {
    ScopedParamOverride level("COFAB_LOG_LEVEL", "info");
    ScopedParamOverride subs("COFAB_LOG_SUBSYS", "store, tcp");
    reloadLogConfig();
    EXPECT_TRUE(logEnabled(LogLevel::kInfo, "store"));
    EXPECT_TRUE(logEnabled(LogLevel::kError, "tcp"));
    EXPECT_FALSE(logEnabled(LogLevel::kDebug, "store"));
    EXPECT_FALSE(logEnabled(LogLevel::kInfo, "comm"));
  }
  reloadLogConfig();
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, "comm"));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, "comm"));
}

TEST(LogTest, LinesCarryLevelRankAndSubsystem) {
  ScopedParamOverride level("COFAB_LOG_LEVEL", "debug");
  reloadLogConfig();
  setLogRank(3);
  testing::internal::CaptureStderr();
  COFAB_LOG(kDebug, "store") << "hello " << 42;
  std::string out = testing::internal::GetCapturedStderr();
  setLogRank(-1);
  EXPECT_NE(out.find(" D rank 3 store] hello 42\n"), std::string::npos) << out;
}

TEST(LogTest, MalformedLevelFallsBackToWarnAndSaysSo) {
  ScopedParamOverride level("COFAB_LOG_LEVEL", "loud");
  testing::internal::CaptureStderr();
  reloadLogConfig();
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("COFAB_LOG_LEVEL='loud' is malformed"), std::string::npos) << out;
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, "x"));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, "x"));
}

}  // namespace
}  // namespace cofab
