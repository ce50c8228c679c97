// core/heap.h: the heap policy cofab's binaries apply at start.
#include "core/heap.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "core/param.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace cofab {
namespace {

TEST(HeapTest, SwitchedOffItLeavesMallocAlone) {
  ScopedParamOverride off("COFAB_HEAP_KEEP", "0");
  auto applied = keepLargeBlocksInHeap();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_FALSE(*applied);
}

TEST(HeapTest, AMalformedSwitchIsAnErrorNamingIt) {
  ScopedParamOverride bad("COFAB_HEAP_KEEP", "perhaps");
  auto applied = keepLargeBlocksInHeap();
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(applied.status().message().find("COFAB_HEAP_KEEP"), std::string::npos)
      << applied.status();
}

#if defined(__GLIBC__)
// mallopt is process-wide and stays: ctest runs each test in a process of its own.
TEST(HeapTest, AFreedStepSizedBlockIsServedFromTheHeapAgain) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc malloc: mallopt does not apply";
#endif
  ScopedParamOverride on("COFAB_HEAP_KEEP", "1");
  auto applied = keepLargeBlocksInHeap();
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_TRUE(*applied);
  // 8 MiB is far above glibc's default mmap threshold (128 KiB): without the setting it is
  // mmapped, and mallinfo2 counts it under hblkhd (mmapped bytes), never in the arena.
  const size_t mmappedBefore = mallinfo2().hblkhd;
  void* p = std::malloc(8 << 20);
  ASSERT_NE(p, nullptr);
  EXPECT_LT(mallinfo2().hblkhd, mmappedBefore + (size_t{8} << 20)) << "the block was mmapped";
  std::free(p);
  // Freed, it stays in the heap (no trim below 256 MiB of free top).
  EXPECT_GE(mallinfo2().fordblks, size_t{8} << 20);
}
#endif

}  // namespace
}  // namespace cofab
