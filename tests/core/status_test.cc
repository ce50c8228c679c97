#include "core/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <set>

namespace cofab {
namespace {

StatusOr<int> half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

StatusOr<int> quarter(int x) {
  COFAB_ASSIGN_OR_RETURN(int h, half(x));
  COFAB_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status checkPositive(int x) {
  if (x <= 0) return FailedPrecondition("not positive");
  return OkStatus();
}

Status chain(int x) {
  COFAB_RETURN_IF_ERROR(checkPositive(x));
  return Internal("reached the end");
}

TEST(StatusTest, OkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = DeadlineExceeded("waiting for rank 3");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.toString(), "DeadlineExceeded: waiting for rank 3");
  EXPECT_EQ(s.withContext("allreduce #7").toString(),
            "DeadlineExceeded: allreduce #7: waiting for rank 3");
  EXPECT_TRUE(OkStatus().withContext("ignored").ok());
}

TEST(StatusTest, EveryCodeHasADistinctName) {
  std::set<std::string_view> names;
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    names.insert(statusCodeName(static_cast<StatusCode>(c)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(StatusCode::kInternal) + 1);
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*quarter(8), 2);
  auto odd = quarter(6);  // 6/2 = 3 is odd
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "odd: 3");
  EXPECT_EQ(chain(-1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(chain(1).code(), StatusCode::kInternal);
}

TEST(StatusTest, ErrnoStatusNamesCallErrnoAndPeer) {
  Status s = errnoStatus(StatusCode::kRemoteError, "connect", ECONNREFUSED, "10.0.0.1:80");
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_NE(s.message().find("connect failed"), std::string::npos);
  EXPECT_NE(s.message().find("errno 111"), std::string::npos);
  EXPECT_NE(s.message().find("10.0.0.1:80"), std::string::npos);
}

TEST(StatusDeathTest, ValueOfAnErrorAborts) {
  StatusOr<int> bad = InvalidArgument("nope");
  EXPECT_DEATH((void)bad.value(), "value\\(\\) on error: InvalidArgument: nope");
}

TEST(StatusDeathTest, CheckFailureNamesFileAndCondition) {
  int x = 1;
  EXPECT_DEATH(COFAB_CHECK(x == 2) << "x was " << x, "status_test.cc:[0-9]+: .*x == 2.*x was 1");
}

}  // namespace
}  // namespace cofab
