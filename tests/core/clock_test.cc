#include "core/clock.h"

#include <gtest/gtest.h>

namespace cofab {
namespace {

TEST(DeadlineTest, NeverNeverExpires) {
  Deadline d = Deadline::never();
  EXPECT_TRUE(d.isNever());
  EXPECT_FALSE(d.expired());
  EXPECT_EQ(d.remaining(), Duration::max());
  EXPECT_GT(d.remainingMsForPoll(), 1'000'000);
}

TEST(DeadlineTest, PastDeadlineIsExpiredWithZeroRemaining) {
  Deadline d = Deadline::afterMs(-5);
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.remaining(), Duration::zero());
  EXPECT_EQ(d.remainingMsForPoll(), 0);
}

TEST(DeadlineTest, MinPicksTheEarlier) {
  Deadline a = Deadline::afterMs(10'000);
  Deadline b = Deadline::afterMs(-1);
  EXPECT_EQ(a.min(b).when(), b.when());
  EXPECT_EQ(Deadline::never().min(a).when(), a.when());
  EXPECT_FALSE(a.expired());
  EXPECT_GT(a.remainingMsForPoll(), 0);
}

TEST(DeadlineTest, HugeDurationsSaturateToNever) {
  EXPECT_TRUE(Deadline::after(Duration::max()).isNever());
  // In milliseconds too: INT64_MAX ms (an option's "forever") overflowed the conversion to
  // nanoseconds and came out as a deadline already past.
  EXPECT_TRUE(Deadline::afterMs(INT64_MAX).isNever());
  EXPECT_TRUE(Deadline::afterMs(INT64_MAX / 1000).isNever());
  EXPECT_TRUE(Deadline::afterMs(INT64_MIN).expired());
}

TEST(ClockTest, WallTimestampIsIso8601Utc) {
  std::string ts = wallTimestamp();
  ASSERT_EQ(ts.size(), 24u) << ts;
  EXPECT_EQ(ts[4], '-');
  EXPECT_EQ(ts[10], 'T');
  EXPECT_EQ(ts.back(), 'Z');
}

}  // namespace
}  // namespace cofab
