// The broadcast shuffle's cut of a row into frames, and the check that lets a receiver count
// distinct pieces as "every byte arrived" (fabric/coded/shuffle_segments.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "fabric/coded/shuffle_segments.h"

namespace cofab::coded {
namespace {

// Every piece of every cut fits, with the cut's size; and the pieces of one cut tile the row.
TEST(ShuffleSegments, EveryPieceOfACutFitsAndThePiecesTileTheRow) {
  for (size_t rowBytes : {1, 7, 1000, 1472, 1473, 4096, 100000}) {
    for (size_t s : {1, 3, 1000, 1472, 8192}) {
      const uint32_t count = shuffleSegmentCount(rowBytes, s);
      std::vector<int> covered(rowBytes, 0);
      for (uint32_t i = 0; i < count; ++i) {
        const size_t offset = i * s;
        const size_t length = std::min(s, rowBytes - offset);
        const size_t want = count == 1 ? rowBytes : s;
        ASSERT_EQ(shuffleSegmentSize(rowBytes, count, i, offset, length), want)
            << rowBytes << " bytes cut by " << s << ", piece " << i;
        for (size_t b = offset; b < offset + length; ++b) ++covered[b];
      }
      EXPECT_EQ(std::count(covered.begin(), covered.end(), 1),
                static_cast<std::ptrdiff_t>(rowBytes));
    }
  }
}

// Claims that are pieces of no cut: each would let a row complete with a hole or an overlap.
TEST(ShuffleSegments, PiecesOfNoCutAreRefused) {
  const size_t row = 3000;  // cut by 1000: pieces at 0, 1000, 2000
  EXPECT_EQ(shuffleSegmentSize(row, 3, 1, 1000, 1000), 1000u);
  EXPECT_EQ(shuffleSegmentSize(row, 3, 1, 0, 1000), 0u) << "piece 1 at piece 0's offset";
  EXPECT_EQ(shuffleSegmentSize(row, 3, 1, 1001, 1000), 0u) << "shifted by a byte";
  EXPECT_EQ(shuffleSegmentSize(row, 3, 2, 2000, 999), 0u) << "last piece short of the end";
  EXPECT_EQ(shuffleSegmentSize(row, 3, 2, 2001, 999), 0u) << "last piece not on the cut";
  EXPECT_EQ(shuffleSegmentSize(row, 3, 0, 0, 3000), 0u) << "a whole row as piece 0 of 3";
  EXPECT_EQ(shuffleSegmentSize(row, 3, 3, 3000, 1), 0u) << "index past the count";
  EXPECT_EQ(shuffleSegmentSize(row, 2, 0, 0, 1000), 0u) << "1000-byte pieces make 3, not 2";
  EXPECT_EQ(shuffleSegmentSize(row, 1, 0, 0, 2999), 0u) << "a single piece must be the row";
  EXPECT_EQ(shuffleSegmentSize(row, 0, 0, 0, 3000), 0u);
  EXPECT_EQ(shuffleSegmentSize(row, 3, 0, 0, 0), 0u);
  EXPECT_EQ(shuffleSegmentSize(0, 1, 0, 0, 1), 0u);
  // Pieces of different cuts each fit alone; the receiver keeps one cut per row, so they are
  // never combined: 1200-byte pieces also make 3 of a 3000-byte row.
  EXPECT_EQ(shuffleSegmentSize(row, 3, 2, 2400, 600), 1200u);
  EXPECT_NE(shuffleSegmentSize(row, 3, 2, 2400, 600), shuffleSegmentSize(row, 3, 0, 0, 1000));
}

}  // namespace
}  // namespace cofab::coded
