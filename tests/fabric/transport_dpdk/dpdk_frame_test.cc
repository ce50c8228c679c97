// The dpdk frame format (fabric/transport/dpdk/frame.h): pure byte functions, no EAL needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "fabric/transport/dpdk/frame.h"
#include "fabric/wire/crc32c.h"

namespace cofab::transport::dpdk {
namespace {

const NetAddress kA{{0x02, 0xcf, 0xab, 0, 0, 1}, 0x0A000001, 47000};
const NetAddress kB{{0x02, 0xcf, 0xab, 0, 0, 2}, 0x0A000002, 47001};

std::vector<uint8_t> makeFrame(const std::vector<uint8_t>& payload, FrameKind kind) {
  FrameHeader h;
  h.kind = kind;
  h.dstConn = 7;
  h.srcConn = 9;
  h.seq = 42;
  h.length = static_cast<uint16_t>(payload.size());
  std::vector<uint8_t> f(frameSize(h));
  uint8_t* p = writeFrameHeaders(f.data(), kA, kB, h);
  std::copy(payload.begin(), payload.end(), p);
  sealFrame(f.data());
  return f;
}

TEST(DpdkFrameTest, RoundTrip) {
  const std::vector<uint8_t> payload = {1, 2, 3, 4, 5};
  auto f = makeFrame(payload, FrameKind::kData);
  ParsedFrame p;
  ASSERT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kOk);
  EXPECT_EQ(p.header.seq, 42u);
  EXPECT_EQ(p.header.dstConn, 7u);
  EXPECT_EQ(p.src, kA);
  EXPECT_EQ(p.dstPort, kB.port);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), p.payload));
  // Ethernet padding after the IP packet is allowed.
  f.resize(f.size() + 10, 0);
  EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kOk);
}

// The IPv4 header checksum against a value computed elsewhere (the classic worked example of
// RFC 791's checksum: 45 00 00 73 00 00 40 00 40 11 [b8 61] c0 a8 00 01 c0 a8 00 c7), so that
// tshark and real routers accept the frames, not only cofab's own parser.
TEST(DpdkFrameTest, Ipv4HeaderChecksumMatchesAKnownVector) {
  const NetAddress src{{0x02, 0xcf, 0xab, 0, 0, 1}, 0xC0A80001, 47000};  // 192.168.0.1
  const NetAddress dst{{0x02, 0xcf, 0xab, 0, 0, 2}, 0xC0A800C7, 47001};  // 192.168.0.199
  FrameHeader h;
  h.length = 0x73 - kIpv4HeaderSize - kUdpHeaderSize - kFrameHeaderSize;  // IP total length 0x73
  std::vector<uint8_t> f(frameSize(h));
  writeFrameHeaders(f.data(), src, dst, h);
  const uint8_t* ip = f.data() + kEthHeaderSize;
  const std::vector<uint8_t> expected = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                                         0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), ip));
  ParsedFrame p;
  sealFrame(f.data());
  EXPECT_EQ(parseFrame(f.data(), f.size(), dst.ip, &p), RxVerdict::kOk);
}

TEST(DpdkFrameTest, StampedTemplateEqualsWrittenHeaders) {
  FrameHeader h;
  h.kind = FrameKind::kData;
  h.dstConn = 7;
  h.srcConn = 9;
  h.length = 1440;
  const FrameTemplate t = makeFrameTemplate(kA, kB, h);
  for (uint32_t seq : {1u, 42u, 0xFFFFFFFFu}) {
    h.seq = seq;
    std::vector<uint8_t> written(frameSize(h), 0x33), stamped(frameSize(h), 0x33);
    const uint8_t* pw = writeFrameHeaders(written.data(), kA, kB, h);
    const uint8_t* ps = stampFrame(stamped.data(), t, seq);
    EXPECT_EQ(pw - written.data(), ps - stamped.data());
    sealFrame(written.data());
    // The sender's way: CRC while copying the payload in (here all zeros), then set.
    const std::vector<uint8_t> zeros(1440, 0);
    uint8_t* payload = stamped.data() + kFrameOverhead;
    // The sender's header CRC from the template and seq equals the one read from the frame.
    EXPECT_EQ(frameCrcStart(t, seq), frameCrcStart(payload)) << "seq " << seq;
    setFrameCrc(payload, wire::crc32cCopy(frameCrcStart(t, seq), payload, zeros.data(), 1440));
    std::fill(written.begin() + kFrameOverhead, written.end(), 0);
    sealFrame(written.data());
    EXPECT_EQ(written, stamped) << "seq " << seq;
    ParsedFrame p;
    ASSERT_EQ(parseFrame(stamped.data(), stamped.size(), kB.ip, &p), RxVerdict::kOk);
    EXPECT_EQ(p.header.seq, seq);
    EXPECT_EQ(p.header.length, 1440);
  }
}

TEST(DpdkFrameTest, EveryBitFlipInTheCofabPartIsCaught) {
  const auto good = makeFrame({9, 8, 7, 6}, FrameKind::kData);
  for (size_t byte = kFrameOverhead - kFrameHeaderSize; byte < good.size(); ++byte) {
    auto f = good;
    f[byte] ^= 0x10;
    ParsedFrame p;
    EXPECT_NE(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kOk) << "byte " << byte;
  }
}

TEST(DpdkFrameTest, ThePayloadsOwnCrcFollowsFromTheFrameCheckWithoutReadingIt) {
  // The receiver joins a full frame's payload CRC into a message's payload CRC without a second
  // pass: the frame CRC (header, then payload) and the header's CRC give the payload's.
  for (size_t len : {1, 300, 1440}) {
    std::vector<uint8_t> payload(len);
    for (size_t i = 0; i < len; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 1);
    const auto f = makeFrame(payload, FrameKind::kData);
    ParsedFrame p;
    ASSERT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kOk);
    EXPECT_EQ(payloadCrcOf(p.header.crc, p.headerCrc, len),
              wire::crc32c(0, payload.data(), payload.size()))
        << "len " << len;
  }
}

// The receiver's one pass (Engine::checkDataCrc): parseFrame leaves the CRC of Data frames from
// the given size on to its caller and checks everything else; checkFrameCrcCopy copies the
// payload whether or not it matches, and says whether it did.
TEST(DpdkFrameTest, DeferredDataCrcIsLeftToTheCallerAndCaughtThere) {
  std::vector<uint8_t> payload(1440);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 13 + 5);
  const auto good = makeFrame(payload, FrameKind::kData);
  ParsedFrame p;
  ASSERT_EQ(parseFrame(good.data(), good.size(), kB.ip, &p, 256), RxVerdict::kOk);
  EXPECT_FALSE(p.crcChecked);
  EXPECT_TRUE(checkFrameCrc(p));
  std::vector<uint8_t> out(payload.size());
  EXPECT_TRUE(checkFrameCrcCopy(p, out.data()));
  EXPECT_EQ(out, payload);
  // A payload bit flipped: parsed, then refused by either check (the copy still happens).
  for (size_t byte : {kFrameOverhead, kFrameOverhead + 700, good.size() - 1}) {
    auto f = good;
    f[byte] ^= 0x04;
    ASSERT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p, 256), RxVerdict::kOk);
    EXPECT_FALSE(checkFrameCrc(p)) << "byte " << byte;
    EXPECT_FALSE(checkFrameCrcCopy(p, out.data())) << "byte " << byte;
    EXPECT_TRUE(std::equal(out.begin(), out.end(), f.begin() + kFrameOverhead));
    // Without deferral, or below the size, parseFrame checks it itself.
    EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kBadChecksum);
    EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p, 1441), RxVerdict::kBadChecksum);
  }
  // Other kinds are always checked at once.
  auto ack = makeFrame(payload, FrameKind::kAck);
  ack.back() ^= 1;
  EXPECT_EQ(parseFrame(ack.data(), ack.size(), kB.ip, &p, 256), RxVerdict::kBadChecksum);
}

TEST(DpdkFrameTest, MalformedFramesAreClassified) {
  const auto good = makeFrame({1, 2, 3}, FrameKind::kAck);
  ParsedFrame p;
  // Truncated anywhere.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_NE(parseFrame(good.data(), n, kB.ip, &p), RxVerdict::kOk) << n;
  }
  auto f = good;
  f[12] = 0x86;  // EtherType IPv6
  f[13] = 0xdd;
  EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kForeign);
  f = good;
  EXPECT_EQ(parseFrame(f.data(), f.size(), kA.ip, &p), RxVerdict::kForeign);  // not our IP
  f = good;
  f[kEthHeaderSize + 10] ^= 1;  // IPv4 header checksum
  EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kBadChecksum);
  f = good;
  f[kEthHeaderSize + kIpv4HeaderSize + 5] += 1;  // UDP length
  EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kBadLength);
  f = good;
  f[kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize] ^= 0xFF;  // magic: foreign UDP traffic
  EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kForeign);
  // cofab's magic with another frame version: a peer running another cofab, counted apart from
  // traffic that is not cofab's (it was kForeign, and a connect to it said only "no answer").
  f = good;
  f[kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize + offsetof(FrameHeader, version)] += 1;
  EXPECT_EQ(parseFrame(f.data(), f.size(), kB.ip, &p), RxVerdict::kBadHeader);
}

TEST(DpdkFrameTest, AddressesParseAndPrint) {
  auto a = parseNetAddress(kA.toString());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, kA);
  EXPECT_EQ(kA.toString(), "02:cf:ab:00:00:01/10.0.0.1:47000");
  for (const char* bad : {"", "10.0.0.1:5", "02:cf:ab:00:00:01/10.0.0.1",
                          "zz:cf:ab:00:00:01/1.2.3.4:5", "02:cf:ab:00:00:01/10.0.0.1:0",
                          "02:cf:ab:00:00:01/300.0.0.1:5", "02:cf:ab:00:00:01/10.0.0.1:5x"}) {
    EXPECT_EQ(parseNetAddress(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace cofab::transport::dpdk
