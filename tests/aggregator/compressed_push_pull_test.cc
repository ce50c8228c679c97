// Compressed push-pull (docs/COMPRESSION.md) on real cofab-aggd processes: the result every
// worker receives equals, bit for bit, a serial reference of the definition (client codec with
// per-key error feedback, decompress, rank-order f32 fold, optional average, daemon recompression:
// stateless, or with per-chunk error feedback carried across rounds when the pushes ask for reply
// feedback); bytes-on-wire counters on both ends; malformed or mismatched compressed chunks
// rejected with a reason.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "fabric/compress/codec.h"
#include "fabric/ps/placement.h"
#include "fabric/ps/push_pull.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

using compress::Compression;

// The next message that is not an ack is a wrong_compression reject whose text has `fragment`.
void expectReject(RawPeer& p, const std::string& fragment) {
  auto m = p.recvSkippingAcks();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->isReject(ps::RejectReason::kWrongCompression))
      << m->header.describe() << " " << m->text();
  EXPECT_NE(m->text().find(fragment), std::string::npos) << m->text();
}

// `x` compressed with `codec` in blocks of 32, as a raw push payload.
std::vector<uint8_t> encoded(Compression codec, const std::vector<float>& x) {
  std::vector<uint8_t> out(compress::compressedBytes(codec, x.size(), 32));
  compress::compress(codec, x.data(), x.size(), 32, nullptr, out.data());
  return out;
}

std::vector<float> input(size_t n, int rank, int t) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000 + t));
  std::normal_distribution<float> d(0.1f * static_cast<float>(rank), 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Case {
  Compression codec;
  bool average;
  ps::Delivery delivery = ps::Delivery::kPushBack;
  bool replyFeedback = false;
};

class CompressedPushPullTest : public ::testing::TestWithParam<Case> {};

TEST_P(CompressedPushPullTest, EqualsTheSerialReferenceBitForBit) {
  const int kWorkers = 3, kSteps = 4;
  const size_t kCount = 2500, kChunkBytes = 4096, kBlock = 100;
  const Compression codec = GetParam().codec;
  DaemonCluster cluster(2, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  std::vector<std::vector<std::vector<float>>> outputs(kWorkers);  // [rank][step]
  std::vector<ps::ClientStats> stats(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunkBytes;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> x = input(kCount, rank, t);
      ps::PushPullOptions po;
      po.compression = codec;
      po.compressionBlock = kBlock;
      po.op = GetParam().average ? ps::ReduceOp::kAverage : ps::ReduceOp::kSum;
      po.delivery = GetParam().delivery;
      po.replyFeedback = GetParam().replyFeedback;
      TensorView v = TensorView::of(x.data(), x.size(), DType::kF32);
      COFAB_RETURN_IF_ERROR(client->pushPull(2, v, v, po).wait(Deadline::afterMs(20000)));
      outputs[static_cast<size_t>(rank)].push_back(std::move(x));
    }
    stats[static_cast<size_t>(rank)] = client->stats();
    client->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);

  // Serial reference of the same definition.
  const auto layout = ps::chunkLayout(kCount, 4, kChunkBytes);
  std::vector<std::vector<float>> clientResidual(kWorkers, std::vector<float>(kCount, 0.0f));
  std::vector<float> serverResidual(kCount, 0.0f);      // per chunk = the chunk's slice
  const bool feedback = codec == Compression::kOneBit;  // the clients' own
  const bool replyFeedback = GetParam().replyFeedback;
  uint64_t wireBytesPerStep = 0;
  for (uint32_t c = 0; c < layout.chunkCount; ++c) {
    const size_t n = std::min(layout.elementsPerChunk, kCount - c * layout.elementsPerChunk);
    wireBytesPerStep += compress::compressedBytes(codec, n, kBlock);
  }
  for (int t = 0; t < kSteps; ++t) {
    std::vector<float> want(kCount);
    for (uint32_t c = 0; c < layout.chunkCount; ++c) {
      const size_t first = c * layout.elementsPerChunk;
      const size_t n = std::min(layout.elementsPerChunk, kCount - first);
      std::vector<float> acc(n);
      for (int r = 0; r < kWorkers; ++r) {
        const auto x = input(kCount, r, t);
        std::vector<uint8_t> enc(compress::compressedBytes(codec, n, kBlock));
        compress::compress(
            codec, x.data() + first, n, kBlock,
            feedback ? clientResidual[static_cast<size_t>(r)].data() + first : nullptr, enc.data());
        std::vector<float> dec(n);
        ASSERT_TRUE(compress::decompress(codec, enc.data(), enc.size(), n, dec.data()).ok());
        for (size_t i = 0; i < n; ++i) acc[i] = r == 0 ? dec[i] : acc[i] + dec[i];
      }
      if (GetParam().average) {
        for (auto& a : acc) a = a / static_cast<float>(kWorkers);
      }
      std::vector<uint8_t> enc(compress::compressedBytes(codec, n, kBlock));
      compress::compress(codec, acc.data(), n, kBlock,
                         replyFeedback ? serverResidual.data() + first : nullptr, enc.data());
      ASSERT_TRUE(compress::decompress(codec, enc.data(), enc.size(), n, want.data() + first).ok());
    }
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_EQ(outputs[static_cast<size_t>(r)][static_cast<size_t>(t)], want)
          << "worker " << r << " step " << t;
    }
  }
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(stats[static_cast<size_t>(r)].bytesOut, kSteps * wireBytesPerStep);
    EXPECT_EQ(stats[static_cast<size_t>(r)].bytesIn, kSteps * wireBytesPerStep);
  }
  double in = 0, logical = 0, out = 0, logicalOut = 0;
  for (int s = 0; s < cluster.servers(); ++s) {
    in += *cluster.metric(s, "cofab_agg_compressed_bytes_in_total");
    logical += *cluster.metric(s, "cofab_agg_compressed_logical_bytes_in_total");
    out += *cluster.metric(s, "cofab_agg_compressed_bytes_out_total");
    logicalOut += *cluster.metric(s, "cofab_agg_compressed_logical_bytes_out_total");
  }
  EXPECT_EQ(in, static_cast<double>(kWorkers * kSteps * wireBytesPerStep));
  EXPECT_EQ(logical, static_cast<double>(kWorkers * kSteps * kCount * 4));
  // Every worker got every result once, whether pushed back or pulled (a pull after the round's
  // last push is answered from the kept result: it used to go uncounted).
  EXPECT_EQ(out, static_cast<double>(kWorkers * kSteps * wireBytesPerStep));
  EXPECT_EQ(logicalOut, static_cast<double>(kWorkers * kSteps * kCount * 4));
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, CompressedPushPullTest,
    ::testing::Values(Case{Compression::kInt8, false},
                      Case{Compression::kInt8, true, ps::Delivery::kPull},
                      Case{Compression::kOneBit, false, ps::Delivery::kPull},
                      Case{Compression::kOneBit, true},
                      Case{Compression::kOneBit, true, ps::Delivery::kPushBack, true},
                      Case{Compression::kOneBit, false, ps::Delivery::kPull, true}),
    [](const auto& info) {
      return std::string(compress::compressionName(info.param.codec)) +
             (info.param.average ? "_average" : "_sum") +
             (info.param.delivery == ps::Delivery::kPull ? "_pull" : "_push") +
             (info.param.replyFeedback ? "_reply_feedback" : "");
    });

TEST(CompressedPushPull, MalformedOrMismatchedChunksAreRejectedWithAReason) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w0.ok() && w1.ok());
  std::vector<float> x(100, 0.5f);
  const std::vector<uint8_t> enc = encoded(Compression::kInt8, x);
  // One f32 short of what 100 elements in blocks of 32 take.
  auto shortEnc = enc;
  shortEnc.resize(enc.size() - 4);
  const uint8_t int8Bits = ps::kPushDeliver | ps::kPushInt8;
  ASSERT_TRUE((*w0)->send(RawPeer::push(0, 1, 0, DType::kF32, 1, int8Bits), shortEnc).ok());
  expectReject(**w0, "take");
  // Both codecs at once.
  ASSERT_TRUE(
      (*w0)->send(RawPeer::push(0, 1, 0, DType::kF32, 1, int8Bits | ps::kPushOneBit), enc).ok());
  expectReject(**w0, "two codecs");
  // A well-formed int8 chunk establishes the slot; a plain f32 push of the same round does not
  // mix into it.
  ASSERT_TRUE((*w0)->send(RawPeer::push(0, 1, 0, DType::kF32, 1, int8Bits), enc).ok());
  ASSERT_TRUE((*w1)->sendValues(RawPeer::push(1, 1, 0, DType::kF32), x).ok());
  expectReject(**w1, "chunk is int8");
  // The right codec completes the round.
  ASSERT_TRUE((*w1)->send(RawPeer::push(1, 1, 0, DType::kF32, 1, int8Bits), enc).ok());
  auto result = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->header.type, wire::MessageType::kPullReply);
  std::vector<float> sum(100);
  ASSERT_TRUE(compress::decompress(Compression::kInt8, result->payload.data(),
                                   result->payload.size(), 100, sum.data())
                  .ok());
  EXPECT_NEAR(sum[0], 1.0f, 1e-6);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rejects_total", "reason=\"wrong_compression\""), 3);
}

// Reply feedback is daemon state per (key, chunk): it needs the 1-bit codec, and every
// contribution of a chunk must agree on it (a mix would make the residual depend on who pushed
// first).
TEST(CompressedPushPull, ReplyFeedbackNeedsOneBitAndAgreement) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w0.ok() && w1.ok());
  std::vector<float> x(100, 0.5f);
  const std::vector<uint8_t> int8 = encoded(Compression::kInt8, x);
  const std::vector<uint8_t> onebit = encoded(Compression::kOneBit, x);
  const uint8_t feedback = ps::kPushDeliver | ps::kPushReplyFeedback;
  ASSERT_TRUE(
      (*w0)->send(RawPeer::push(0, 1, 0, DType::kF32, 1, feedback | ps::kPushInt8), int8).ok());
  expectReject(**w0, "without 1-bit");
  ASSERT_TRUE((*w0)->sendValues(RawPeer::push(0, 1, 0, DType::kF32, 1, feedback), x).ok());
  expectReject(**w0, "without 1-bit");
  // Worker 0 establishes the chunk with reply feedback; worker 1 without it is refused.
  ASSERT_TRUE(
      (*w0)->send(RawPeer::push(0, 1, 0, DType::kF32, 1, feedback | ps::kPushOneBit), onebit).ok());
  ASSERT_TRUE(
      (*w1)
          ->send(RawPeer::push(1, 1, 0, DType::kF32, 1, ps::kPushDeliver | ps::kPushOneBit), onebit)
          .ok());
  expectReject(**w1, "reply feedback");
  ASSERT_TRUE(
      (*w1)->send(RawPeer::push(1, 1, 0, DType::kF32, 1, feedback | ps::kPushOneBit), onebit).ok());
  auto result = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->header.type, wire::MessageType::kPullReply);
  std::vector<float> sum(100);
  ASSERT_TRUE(compress::decompress(Compression::kOneBit, result->payload.data(),
                                   result->payload.size(), 100, sum.data())
                  .ok());
  EXPECT_FLOAT_EQ(sum[0], 1.0f);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rejects_total", "reason=\"wrong_compression\""), 3);
}

TEST(CompressedPushPull, ClientRefusesCompressionOfNonF32) {
  DaemonCluster cluster(1, 1);
  ASSERT_TRUE(cluster.start().ok());
  auto client = cluster.connect(0);
  ASSERT_TRUE(client.ok());
  std::vector<double> y(10);
  ps::PushPullOptions po;
  po.compression = Compression::kOneBit;
  TensorView v = TensorView::of(y.data(), y.size(), DType::kF64);
  Status st = (*client)->pushPull(1, v, v, po).wait(Deadline::afterMs(5000));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("f32"), std::string::npos) << st;
  std::vector<float> z(10);
  po.compression = Compression::kInt8;
  po.replyFeedback = true;
  TensorView f = TensorView::of(z.data(), z.size(), DType::kF32);
  st = (*client)->pushPull(1, f, f, po).wait(Deadline::afterMs(5000));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("replyFeedback"), std::string::npos) << st;
}

}  // namespace
}  // namespace cofab::testing
