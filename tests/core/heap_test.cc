// core/heap.h: the heap policy cofab's binaries apply at start.
#include "core/heap.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace cofab {
namespace {

class HeapTest : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv("COFAB_HEAP_KEEP"); }
};

TEST_F(HeapTest, OffByEnvironmentLeavesMallocAlone) {
  ::setenv("COFAB_HEAP_KEEP", "0", 1);
  auto applied = keepLargeBlocksInHeap();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_FALSE(*applied);
}

TEST_F(HeapTest, AMalformedSwitchIsAnErrorNamingIt) {
  ::setenv("COFAB_HEAP_KEEP", "perhaps", 1);
  auto applied = keepLargeBlocksInHeap();
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(applied.status().message().find("COFAB_HEAP_KEEP"), std::string::npos)
      << applied.status();
}

#if defined(__GLIBC__)
TEST_F(HeapTest, AFreedStepSizedBlockIsServedFromTheHeapAgain) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc malloc: mallopt does not apply";
#endif
  auto applied = keepLargeBlocksInHeap();
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_TRUE(*applied);
  // 8 MiB is far above glibc's default mmap threshold (128 KiB): without the setting it is
  // mmapped, and mallinfo2 counts it under hblkhd, never in the arena.
  void* p = std::malloc(8 << 20);
  ASSERT_NE(p, nullptr);
  const struct mallinfo2 m = mallinfo2();
  EXPECT_LT(m.hblkhd, size_t{8} << 20) << "the block was mmapped";
  std::free(p);
  // Freed, it stays in the heap (no trim below 256 MiB of free top).
  EXPECT_GE(mallinfo2().fordblks, size_t{8} << 20);
}
#endif

}  // namespace
}  // namespace cofab
