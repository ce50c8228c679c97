// CRC32C (fabric/wire/crc32c.h): known vectors, every implementation (table, three-stream
// crc32 instruction, carry-less-multiply folding) against the portable one at every alignment
// and around every block size, the fused copy, and joining checksums of adjacent pieces.
#include "fabric/wire/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "fabric/wire/crc32c_fold.h"
#include "tests/support/random_bytes.h"

namespace cofab::wire {
namespace {

using cofab::testing::randomBytes;

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32cPortable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
}

TEST(Crc32cTest, HardwareMatchesPortableAtEveryAlignmentAndLength) {
  std::mt19937_64 rng(1);
  std::vector<uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 9; ++off) {
    // Around the three-stream block sizes (3 x 64 and 3 x 480 bytes) and a dpdk frame (1472).
    for (size_t len : {0,   1,   7,   8,   9,    63,   64,   65,   191,  192, 193,
                       200, 767, 768, 769, 1000, 1472, 1535, 1536, 1537, 4096}) {
      EXPECT_EQ(crc32c(0, buf.data() + off, len), crc32cPortable(0, buf.data() + off, len))
          << "off " << off << " len " << len;
    }
  }
  // Incremental == one shot.
  const uint32_t whole = crc32c(0, buf.data(), 3000);
  EXPECT_EQ(crc32c(crc32c(0, buf.data(), 1234), buf.data() + 1234, 3000 - 1234), whole);
  EXPECT_EQ(crc32c(0, buf.data(), 3000), crc32cPortable(0, buf.data(), 3000));
  // Every length up to 3 long blocks plus a tail, nonzero starting CRC.
  for (size_t len = 0; len <= 3 * 480 + 200; ++len) {
    ASSERT_EQ(crc32c(0x12345678u, buf.data() + 3, len),
              crc32cPortable(0x12345678u, buf.data() + 3, len))
        << "len " << len;
  }
}

TEST(Crc32cTest, CopyCopiesAndMatchesAtEveryAlignmentAndLength) {
  std::vector<uint8_t> src(3000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t len = 0; len <= 3 * 480 + 200; ++len) {
      std::vector<uint8_t> dst(len + 16, 0xEE);
      ASSERT_EQ(crc32cCopy(0x12345678u, dst.data() + 5, src.data() + off, len),
                crc32cPortable(0x12345678u, src.data() + off, len))
          << "off " << off << " len " << len;
      ASSERT_TRUE(std::equal(src.begin() + static_cast<ptrdiff_t>(off),
                             src.begin() + static_cast<ptrdiff_t>(off + len), dst.begin() + 5))
          << "off " << off << " len " << len;
      // Nothing written around the destination.
      for (size_t i = 0; i < 5; ++i) ASSERT_EQ(dst[i], 0xEE);
      for (size_t i = len + 5; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE);
    }
  }
}

TEST(Crc32cTest, OfWordsIsTheCrcOfTheirLittleEndianBytes) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    uint64_t w[4];
    for (auto& x : w) x = i == 0 ? 0 : rng();
    uint8_t bytes[32];
    for (int b = 0; b < 32; ++b) bytes[b] = static_cast<uint8_t>(w[b / 8] >> (8 * (b % 8)));
    EXPECT_EQ(crc32cOfWords(w[0], w[1], w[2], w[3]), crc32cPortable(0, bytes, 32)) << i;
  }
}

TEST(Crc32cTest, CombineJoinsTheChecksumsOfAdjacentPieces) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(5000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  // More sizes than a thread's cache keeps (4), revisited: evicted sizes are rebuilt right.
  for (int round = 0; round < 2; ++round) {
    for (size_t lenB : {0, 1, 8, 63, 1440, 1472, 4000, 1440, 77}) {
      for (size_t lenA : {0, 5, 100, 1000}) {
        const uint32_t a = crc32c(0, buf.data(), lenA);
        const uint32_t b = crc32c(0, buf.data() + lenA, lenB);
        ASSERT_EQ(crc32cCombine(a, b, lenB), crc32c(0, buf.data(), lenA + lenB))
            << "lenA " << lenA << " lenB " << lenB;
        ASSERT_EQ(crc32cCombine(0x9ABCDEF0u, b, lenB),
                  crc32c(0x9ABCDEF0u, buf.data() + lenA, lenB));
      }
    }
  }
  // A flipped bit in either piece shows in the joined checksum.
  const uint32_t a = crc32c(0, buf.data(), 1000);
  const uint32_t b = crc32c(0, buf.data() + 1000, 1440);
  buf[1500] ^= 0x10;
  EXPECT_NE(crc32cCombine(a, b, 1440), crc32c(0, buf.data(), 2440));
}

// The folding path called directly (crc32c() only takes it from kFoldMinBytes on, when the CPU
// has it): every length over its 256-, 64- and 16-byte steps and the scalar tail, at several
// alignments and starting CRCs, plain and copying.
TEST(Crc32cFoldTest, MatchesPortableAtEveryLengthAlignmentAndStartingCrc) {
  if (!detail::crc32cFoldSupported()) {
    GTEST_SKIP() << "this CPU lacks AVX-512F/VPCLMULQDQ: crc32c uses the crc32 instruction";
  }
  const std::vector<uint8_t> src = randomBytes(4096 + 64, 11);
  std::vector<uint8_t> dst(src.size() + 64);
  for (size_t off : {0, 1, 5, 16, 63}) {
    for (uint32_t init : {0u, 0xFFFFFFFFu, 0x12345678u}) {
      for (size_t len = detail::kFoldMinBytes; len <= 1600; ++len) {
        const uint32_t want = crc32cPortable(init, src.data() + off, len);
        ASSERT_EQ(detail::crc32cFold(init, nullptr, src.data() + off, len), want)
            << "off " << off << " len " << len << " init " << init;
        std::fill(dst.begin(), dst.end(), 0xEE);
        ASSERT_EQ(detail::crc32cFold(init, dst.data() + 3, src.data() + off, len), want)
            << "copying, off " << off << " len " << len;
        ASSERT_TRUE(std::equal(src.begin() + static_cast<ptrdiff_t>(off),
                               src.begin() + static_cast<ptrdiff_t>(off + len), dst.begin() + 3))
            << "off " << off << " len " << len;
        for (size_t i = 0; i < 3; ++i) ASSERT_EQ(dst[i], 0xEE);
        for (size_t i = len + 3; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "len " << len;
      }
    }
  }
}

TEST(Crc32cFoldTest, LongBuffersAndEverySingleBitFlip) {
  if (!detail::crc32cFoldSupported()) {
    GTEST_SKIP() << "this CPU lacks AVX-512F/VPCLMULQDQ: crc32c uses the crc32 instruction";
  }
  std::vector<uint8_t> buf = randomBytes((1u << 20) + 7, 12);
  const uint32_t whole = crc32cPortable(0, buf.data(), buf.size());
  EXPECT_EQ(crc32c(0, buf.data(), buf.size()), whole);
  // Split anywhere: the checksum of the first piece continues over the second.
  for (size_t cut : {size_t{256}, size_t{1000}, size_t{65536}, buf.size() - 300}) {
    EXPECT_EQ(crc32c(crc32c(0, buf.data(), cut), buf.data() + cut, buf.size() - cut), whole)
        << "cut " << cut;
  }
  // A CRC detects every single-bit error: flip each bit of a frame-sized buffer in turn.
  std::vector<uint8_t> frame = randomBytes(1472, 13);
  const uint32_t clean = crc32c(0, frame.data(), frame.size());
  for (size_t bit = 0; bit < frame.size() * 8; ++bit) {
    frame[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_NE(crc32c(0, frame.data(), frame.size()), clean) << "bit " << bit;
    frame[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace cofab::wire
