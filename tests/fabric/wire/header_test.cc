// Wire header codec: round trip, every corruption class rejected with the right code, and
// seeded random bytes that must never crash the decoder. CRC32C itself: crc32c_test.cc.
#include "fabric/wire/header.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "fabric/wire/crc32c.h"

namespace cofab::wire {
namespace {

Header sample() {
  Header h;
  h.type = MessageType::kPush;
  h.flags = kFlagPayloadCrc | kFlagLastChunk;
  h.senderRank = 7;
  h.chunkIndex = 3;
  h.chunkCount = 4;
  h.dtype = DType::kF32;
  h.opcode = 9;
  h.key = 0x1122334455667788ull;
  h.sequence = 42;
  h.iteration = 1234567;
  h.payloadLength = 4096;
  h.payloadCrc = 0xDEADBEEF;
  return h;
}

// Rewrites the header CRC so that a test can reach the checks behind it.
void refreshCrc(EncodedHeader& b) {
  const uint32_t crc = crc32c(0, b.data(), 60);
  std::memcpy(b.data() + 60, &crc, 4);
}

TEST(HeaderTest, RoundTrip) {
  const Header h = sample();
  const EncodedHeader b = encodeHeader(h);
  auto d = decodeHeader(b);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, h);
}

TEST(HeaderTest, LayoutIsLittleEndianAsDocumented) {
  const EncodedHeader b = encodeHeader(sample());
  EXPECT_EQ(b[0], 'C');
  EXPECT_EQ(b[1], 'F');
  EXPECT_EQ(b[2], 'A');
  EXPECT_EQ(b[3], 'B');
  EXPECT_EQ(b[4], kVersion);
  EXPECT_EQ(b[5], static_cast<uint8_t>(MessageType::kPush));
  EXPECT_EQ(b[6], 3);  // flags low byte
  EXPECT_EQ(b[8], 7);  // sender rank
  EXPECT_EQ(b[12], 3);
  EXPECT_EQ(b[16], 4);
  EXPECT_EQ(b[20], static_cast<uint8_t>(DType::kF32));
  EXPECT_EQ(b[21], 9);
  EXPECT_EQ(b[24], 0x88);  // key, least significant byte first
  EXPECT_EQ(b[31], 0x11);
  EXPECT_EQ(b[32], 42);
  EXPECT_EQ(b[49], 0x10);  // payload length 4096 = 0x1000
  EXPECT_EQ(b[56], 0xEF);
}

TEST(HeaderTest, EveryDefaultFieldValueRoundTrips) {
  Header h;
  auto d = decodeHeader(encodeHeader(h));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, h);
}

TEST(HeaderTest, ShortBufferIsInvalidArgument) {
  const EncodedHeader b = encodeHeader(sample());
  for (size_t n : {0, 1, 63}) {
    auto d = decodeHeader({b.data(), n});
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << n;
  }
}

TEST(HeaderTest, BadMagicIsDataLoss) {
  EncodedHeader b = encodeHeader(sample());
  b[0] = 'X';
  auto d = decodeHeader(b);
  EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("magic"), std::string::npos);
}

TEST(HeaderTest, OtherVersionIsInvalidArgument) {
  EncodedHeader b = encodeHeader(sample());
  b[4] = kVersion + 1;
  refreshCrc(b);
  auto d = decodeHeader(b);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("version"), std::string::npos);
}

TEST(HeaderTest, EverySingleBitFlipIsRejected) {
  const EncodedHeader good = encodeHeader(sample());
  for (size_t byte = 0; byte < kHeaderSize; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      EncodedHeader b = good;
      b[byte] ^= static_cast<uint8_t>(1u << bit);
      auto d = decodeHeader(b);
      ASSERT_FALSE(d.ok()) << "byte " << byte << " bit " << bit;
      EXPECT_TRUE(d.status().code() == StatusCode::kDataLoss ||
                  d.status().code() == StatusCode::kInvalidArgument)
          << d.status();
    }
  }
}

TEST(HeaderTest, HeaderCrcMismatchIsDataLoss) {
  EncodedHeader b = encodeHeader(sample());
  b[40] ^= 1;  // iteration: only the CRC can notice
  auto d = decodeHeader(b);
  EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("CRC"), std::string::npos);
}

struct FieldCase {
  const char* name;
  size_t offset;
  uint8_t value;
  const char* expectInMessage;
};

TEST(HeaderTest, WellFormedButInvalidFieldsAreInvalidArgument) {
  const FieldCase cases[] = {
      {"type 0", 5, 0, "type"},
      {"type too big", 5, 200, "type"},
      {"unknown flag", 7, 0x80, "flag"},
      {"dtype 0", 20, 0, "dtype"},
      {"dtype 99", 20, 99, "dtype"},
      {"reserved", 22, 1, "reserved"},
      {"chunk index >= count", 12, 4, "chunk"},
  };
  for (const auto& c : cases) {
    EncodedHeader b = encodeHeader(sample());
    b[c.offset] = c.value;
    refreshCrc(b);
    auto d = decodeHeader(b);
    ASSERT_FALSE(d.ok()) << c.name;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << c.name << ": " << d.status();
    EXPECT_NE(d.status().message().find(c.expectInMessage), std::string::npos)
        << c.name << ": " << d.status();
  }
}

TEST(HeaderTest, PayloadCrcWithoutFlagIsRejected) {
  Header h = sample();
  h.flags = 0;
  EncodedHeader b = encodeHeader(h);  // the encoder zeroes it...
  const uint32_t junk = 5;
  std::memcpy(b.data() + 56, &junk, 4);  // ...a hostile peer does not
  refreshCrc(b);
  EXPECT_EQ(decodeHeader(b).status().code(), StatusCode::kInvalidArgument);
}

TEST(HeaderTest, OverlongPayloadIsRejectedBeforeAnythingIsRead) {
  Header h = sample();
  h.payloadLength = 1ull << 40;
  auto d = decodeHeader(encodeHeader(h));
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("exceeds"), std::string::npos) << d.status();
  h.payloadLength = 1024;
  EXPECT_EQ(decodeHeader(encodeHeader(h), {.maxPayload = 1000}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(decodeHeader(encodeHeader(h), {.maxPayload = 1024}).ok());
}

TEST(HeaderTest, PayloadLengthMustBeWholeElements) {
  Header h = sample();
  h.payloadLength = 4095;  // f32
  EXPECT_EQ(decodeHeader(encodeHeader(h)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(validateHeader(h).code(), StatusCode::kInvalidArgument);
}

TEST(HeaderTest, DescribeNamesTheFields) {
  const std::string s = sample().describe();
  EXPECT_NE(s.find("Push"), std::string::npos) << s;
  EXPECT_NE(s.find("chunk=3/4"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 7"), std::string::npos) << s;
}

// Seeded random input: never crashes, never accepts garbage (random bytes essentially never
// carry the magic and a matching CRC).
TEST(HeaderFuzzTest, SeededRandomBytesNeverCrash) {
  std::mt19937_64 rng(20261122);
  uint8_t buf[kHeaderSize + 8];
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    const size_t n = rng() % sizeof(buf);
    if (decodeHeader({buf, n}).ok()) ++accepted;
  }
  EXPECT_EQ(accepted, 0);
}

// Mutations of valid headers (random bytes rewritten, CRC fixed up half the time so the field
// checks are reached): whatever decodes must re-encode to the same bytes.
TEST(HeaderFuzzTest, SeededMutationsOfValidHeaders) {
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    EncodedHeader b = encodeHeader(sample());
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) b[rng() % 60] = static_cast<uint8_t>(rng());
    if (rng() & 1) refreshCrc(b);
    auto d = decodeHeader(b);
    if (!d.ok()) continue;
    ++accepted;
    ASSERT_EQ(encodeHeader(*d), b) << "decoded header does not re-encode to its bytes";
  }
  EXPECT_GT(accepted, 0);  // the field checks were exercised, not just the CRC
}

}  // namespace
}  // namespace cofab::wire
