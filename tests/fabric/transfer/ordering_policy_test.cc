// The ordering policies as comparators: each one's order, and the (seq, chunk) tie break that
// makes the order total.
#include "fabric/transfer/ordering_policy.h"

#include <gtest/gtest.h>

namespace cofab::transfer {
namespace {

Clock::time_point at(int ms) { return Clock::time_point() + Millis(ms); }

TEST(OrderingPolicy, FifoIsEnqueueOrderThenChunkIndex) {
  FifoPolicy p;
  EXPECT_TRUE(p.before({1, 5, 9, at(1)}, {2, 0, 0, at(0)}));
  EXPECT_TRUE(p.before({1, 0, 9, at(9)}, {1, 1, 0, at(0)}));
  EXPECT_FALSE(p.before({1, 1, 0, at(0)}, {1, 1, 0, at(0)}));
}

TEST(OrderingPolicy, PriorityIsLowestLayerFirstThenFifo) {
  PriorityPolicy p;
  EXPECT_TRUE(p.before({9, 0, 0, at(9)}, {1, 0, 3, at(0)}));  // later but more urgent
  EXPECT_TRUE(p.before({1, 2, 3, at(0)}, {2, 0, 3, at(0)}));  // equal priority: FIFO
  EXPECT_TRUE(p.before({1, 2, 3, at(0)}, {1, 3, 3, at(0)}));
}

TEST(OrderingPolicy, DeadlineIsEarliestFirstWithoutDeadlineLast) {
  DeadlinePolicy p;
  EXPECT_TRUE(p.before({9, 0, 9, at(5)}, {1, 0, 0, at(6)}));
  EXPECT_TRUE(p.before({9, 0, 9, at(5)}, {1, 0, 0, Clock::time_point::max()}));
  EXPECT_TRUE(p.before({1, 0, 9, at(5)}, {2, 0, 0, at(5)}));
}

TEST(OrderingPolicy, FactoryNamesAndRejectsUnknown) {
  for (const char* n : {"fifo", "priority", "deadline"}) {
    auto p = makeOrderingPolicy(n);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->name(), n);
  }
  auto bad = makeOrderingPolicy("lifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fifo, priority, deadline"), std::string::npos);
}

}  // namespace
}  // namespace cofab::transfer
