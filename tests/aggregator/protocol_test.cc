// The daemon against hand-made messages: dedup of retransmissions, every rejection reason sent
// back and counted, and garbage on the port (random bytes, truncated frames) not hurting the
// other workers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "fabric/compress/codec.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

using ps::RejectReason;

std::vector<float> floatsOf(const RawMessage& m) {
  std::vector<float> v(m.payload.size() / 4);
  std::memcpy(v.data(), m.payload.data(), m.payload.size());
  return v;
}

// One daemon for two workers and a raw connection of each (w0, w1): most tests here start so
// (`auto& [cluster, w0, w1] = peers;`). start() records what failed.
struct TwoRawPeers {
  explicit TwoRawPeers(std::vector<std::string> args = {}) : cluster(1, 2, std::move(args)) {}
  Status start() {
    const Status started = cluster.start();
    if (!started.ok()) {
      ADD_FAILURE() << started;
      return started;
    }
    w0 = RawPeer::connect(cluster.address(0), "worker 0");
    w1 = RawPeer::connect(cluster.address(0), "worker 1");
    if (!w0.ok()) ADD_FAILURE() << w0.status();
    if (!w1.ok()) ADD_FAILURE() << w1.status();
    return !w0.ok() ? w0.status() : w1.status();
  }
  DaemonCluster cluster;
  StatusOr<std::unique_ptr<RawPeer>> w0 = Unavailable("not started");
  StatusOr<std::unique_ptr<RawPeer>> w1 = Unavailable("not started");
};

TEST(AggregatorProtocol, RetransmittedChunksAreAppliedOnce) {
  TwoRawPeers peers;
  ASSERT_TRUE(peers.start().ok());
  auto& [cluster, w0, w1] = peers;
  const auto h0 = RawPeer::push(0, 5, 0, DType::kF32);
  ASSERT_TRUE((*w0)->sendValues(h0, std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->sendValues(h0, std::vector<float>{1, 2}).ok());  // retransmission
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 5, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  auto r0 = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_EQ(r0->header.type, wire::MessageType::kPullReply);
  EXPECT_EQ(floatsOf(*r0), (std::vector<float>{11, 22}));
  auto r1 = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(floatsOf(*r1), (std::vector<float>{11, 22}));
  // A replay after the round finished is answered from the kept result, never re-applied.
  ASSERT_TRUE((*w0)->sendValues(h0, std::vector<float>{1, 2}).ok());
  auto again = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(floatsOf(*again), (std::vector<float>{11, 22}));
  // The first resend may be handled before or after worker 1's push completes the round (two
  // connections, two engines): counted as a duplicate either way, and if after, answered with
  // the result too, so `again` can be that answer while the last resend is still being handled.
  EXPECT_TRUE(cluster.waitMetric(0, "cofab_agg_chunks_duplicate_total", 2).ok());
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_chunks_applied_total"), 2);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_completed_total"), 1);
}

wire::Header pullOf(uint32_t rank, uint64_t key, uint64_t iteration, DType dtype) {
  wire::Header h = RawPeer::push(rank, key, iteration, dtype);
  h.type = wire::MessageType::kPull;
  h.opcode = 0;
  return h;
}

// A pull may come before anyone pushed the chunk: it waits, and the first push still defines
// the chunk (its size, dtype and chunk count). A waiting pull for another dtype is refused once
// the push shows the chunk's.
TEST(AggregatorProtocol, APullBeforeAnyPushWaitsAndThePushDefinesTheChunk) {
  TwoRawPeers peers;
  ASSERT_TRUE(peers.start().ok());
  auto& [cluster, w0, w1] = peers;
  ASSERT_TRUE((*w1)->send(pullOf(1, 5, 0, DType::kF64), {}).ok());
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_open_rounds", 1).ok());  // the pull is held
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 5, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  auto refused = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kWrongDType))
      << refused->header.describe() << " " << refused->text();
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 5, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
  // The round was opened by the refused pull, then held by the pushes: counted once, and no
  // longer open once answered.
  EXPECT_TRUE(cluster.waitMetric(0, "cofab_agg_open_rounds", 0).ok());
}

// A pull before any push does not fix the chunk for later pulls either: only the push does. A
// second pull of the right dtype waits like the first, and only the wrong one is refused.
TEST(AggregatorProtocol, AnEarlierPullDoesNotFixTheChunkForLaterPulls) {
  TwoRawPeers peers;
  ASSERT_TRUE(peers.start().ok());
  auto& [cluster, w0, w1] = peers;
  ASSERT_TRUE((*w1)->send(pullOf(1, 5, 0, DType::kF64), {}).ok());
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_open_rounds", 1).ok());  // the pull is held
  ASSERT_TRUE((*w0)->send(pullOf(0, 5, 0, DType::kF32), {}).ok());
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 5, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  auto refused = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kWrongDType))
      << refused->header.describe() << " " << refused->text();
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 5, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  // Worker 0: its pull and its push are both answered with the sum.
  for (auto* w : {&*w0, &*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
}

// A refused push leaves no state behind: no slot, no shape for the pushes that follow, and a
// pull waiting on the chunk is neither refused nor answered by it.
TEST(AggregatorProtocol, ARefusedPushLeavesNoSlotBehind) {
  TwoRawPeers peers({"--engines", "1"});
  ASSERT_TRUE(peers.start().ok());
  auto& [cluster, w0, w1] = peers;
  // Beyond the window (a new chunk's open round is 0, and 100 is past the empty rounds a push
  // may pass over), 2 x f32, for a key nobody used yet.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 7, 100, DType::kF32), std::vector<float>{1, 2}).ok());
  auto refused = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kBeyondWindow)) << refused->text();
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_slots"), 0);
  // Round 0 of key 7 holds 3 x f32: the refused push did not define the chunk.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 7, 0, DType::kF32), std::vector<float>{1, 2, 3}).ok());
  ASSERT_TRUE((*w1)
                  ->sendValues(RawPeer::push(1, 7, 0, DType::kF32), std::vector<float>{10, 20, 30})
                  .ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22, 33}));
  }
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_slots"), 1);
  // Key 8: a pull waits; a refused push (f64, beyond the window) neither refuses the pull nor
  // makes the chunk f64; the f32 pushes of round 0 then answer it.
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_open_rounds", 0).ok());  // key 7's round is done
  ASSERT_TRUE((*w1)->send(pullOf(1, 8, 0, DType::kF32), {}).ok());
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_open_rounds", 1).ok());  // the pull is held
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 8, 2, DType::kF64), std::vector<double>{1, 2}).ok());
  refused = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kBeyondWindow)) << refused->text();
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 8, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 8, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  // Worker 1: its pull and its push are both answered with the sum.
  for (auto* w : {&*w0, &*w1, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
}

// A round nobody contributed to is passed over by a push for a later round (every worker
// dropped it: docs/TRANSFER.md); a worker that sends it afterwards is refused finished_iteration,
// and more than 8 rounds ahead stays beyond the window.
TEST(AggregatorProtocol, AnEmptyRoundIsPassedOverByThePushForTheNextOne) {
  TwoRawPeers peers;
  ASSERT_TRUE(peers.start().ok());
  auto& [cluster, w0, w1] = peers;
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 5, 1, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack: stored in round 1, before worker 1 sends round 0
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 5, 0, DType::kF32), std::vector<float>{7, 7}).ok());
  auto late = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->isReject(RejectReason::kFinishedIteration)) << late->text();
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 5, 1, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_skipped_total"), 1);
  // Round 2 is open and empty: a push for round 11 is past the 8 rounds a push may pass over.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 5, 11, DType::kF32), std::vector<float>{1, 2}).ok());
  auto far = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_TRUE(far->isReject(RejectReason::kBeyondWindow)) << far->text();
}

// The lag gauge follows the pushes the daemon stored: one refused (beyond the window) says
// nothing about how far its worker is.
TEST(AggregatorProtocol, WorkerLagCountsOnlyStoredPushes) {
  TwoRawPeers peers;
  ASSERT_TRUE(peers.start().ok());
  auto& [cluster, w0, w1] = peers;
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 1, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack: stored
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 1, 1000, DType::kF32), std::vector<float>{1, 2}).ok());
  auto refused = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kBeyondWindow)) << refused->text();
  // Worker 0 pushed the newest iteration stored; worker 1 has stored nothing (one behind).
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_worker_lag_iterations", "worker=\"0\""), 0);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_worker_lag_iterations", "worker=\"1\""), 1);
}

// --max-chunk-bytes bounds what a compressed chunk decodes to as well: a small 1-bit payload
// claiming more elements than the limit holds is refused before the daemon allocates for it.
TEST(AggregatorProtocol, ACompressedChunkIsBoundedByItsDecodedSize) {
  DaemonCluster cluster(1, 1, {"--max-chunk-bytes", "4096"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok());
  auto onebit = [](size_t count) {
    std::vector<float> x(count, 1.0f);
    std::vector<uint8_t> out(
        compress::compressedBytes(compress::Compression::kOneBit, count, compress::kDefaultBlock));
    compress::compress(compress::Compression::kOneBit, x.data(), count, compress::kDefaultBlock,
                       nullptr, out.data());
    return out;
  };
  const uint8_t bits = ps::kPushDeliver | ps::kPushOneBit;
  // 8192 floats (32 KiB decoded) in about 1 KiB.
  const std::vector<uint8_t> big = onebit(8192);
  ASSERT_LE(big.size(), 4096u);
  ASSERT_TRUE((*w0)->send(RawPeer::push(0, 1, 0, DType::kF32, 1, bits), big).ok());
  auto refused = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kOversized))
      << refused->header.describe() << " " << refused->text();
  EXPECT_NE(refused->text().find("decode"), std::string::npos) << refused->text();
  // 1024 floats decode to exactly the limit: served.
  ASSERT_TRUE((*w0)->send(RawPeer::push(0, 2, 0, DType::kF32, 1, bits), onebit(1024)).ok());
  auto served = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->header.type, wire::MessageType::kPullReply)
      << served->header.describe() << " " << served->text();
}

// Pulls for chunks nobody pushes cost the daemon a slot each: past COFAB_AGG_MAX_PULLED_ONLY
// per engine they are refused with pull_backlog, and a push still gets through.
TEST(AggregatorProtocol, PullsForChunksNobodyPushedAreBounded) {
  ::setenv("COFAB_AGG_MAX_PULLED_ONLY", "4", 1);
  DaemonCluster cluster(1, 1, {"--engines", "1"});
  const Status started = cluster.start();
  ::unsetenv("COFAB_AGG_MAX_PULLED_ONLY");
  ASSERT_TRUE(started.ok()) << started;
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok());
  for (uint64_t key = 100; key < 105; ++key) {
    ASSERT_TRUE((*w0)->send(pullOf(0, key, 0, DType::kF32), {}).ok());
  }
  auto refused = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(RejectReason::kPullBacklog))
      << refused->header.describe() << " " << refused->text();
  EXPECT_EQ(refused->header.key, 104u);
  // A push for one of the pulled keys completes its round (one worker) and answers both.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 100, 0, DType::kF32), std::vector<float>{3, 4}).ok());
  for (int i = 0; i < 2; ++i) {
    auto sum = (*w0)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{3, 4}));
  }
}

TEST(AggregatorProtocol, BadChunksAreRejectedWithAReasonAndCounted) {
  DaemonCluster cluster(1, 2, {"--max-chunk-bytes", "4096"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  auto stranger = RawPeer::connect(cluster.address(0), "worker 9");
  ASSERT_TRUE(w0.ok() && w1.ok() && stranger.ok());
  RawPeer& a = **w0;
  RawPeer& b = **w1;
  const std::vector<float> two{1, 2};

  auto expectReject = [](RawPeer& p, RejectReason reason) {
    auto m = p.recvSkippingAcks();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m->isReject(reason)) << "expected " << ps::rejectReasonName(reason) << ", got "
                                     << m->header.describe() << " " << m->text();
    EXPECT_FALSE(m->text().empty()) << "a rejection must say why";
  };

  // Beyond the window: the open round of a fresh chunk is iteration 0 (and 100 is past the empty
  // rounds a push may pass over).
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 1, 100, DType::kF32), two).ok());
  expectReject(a, RejectReason::kBeyondWindow);
  // Unknown worker: a rank outside the job, and a rank that is not the connection's.
  ASSERT_TRUE((*stranger)->sendValues(RawPeer::push(9, 1, 0, DType::kF32), two).ok());
  expectReject(**stranger, RejectReason::kUnknownWorker);
  ASSERT_TRUE(a.sendValues(RawPeer::push(1, 1, 0, DType::kF32), two).ok());
  expectReject(a, RejectReason::kUnknownWorker);
  // Malformed: chunkCount 0; unknown opcode bits.
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 1, 0, DType::kF32, 0), two).ok());
  expectReject(a, RejectReason::kMalformed);
  // Every bit no PushBits value names (0x80 until it became kPushReplyFeedback).
  const auto unknownBits = static_cast<uint8_t>(~ps::kKnownPushBits);
  ASSERT_NE(unknownBits, 0) << "every opcode bit is in use: nothing unknown left to test";
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 1, 0, DType::kF32, 1, unknownBits), two).ok());
  expectReject(a, RejectReason::kMalformed);
  // Unsupported dtype.
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 1, 0, DType::kI32), std::vector<int32_t>{1, 2}).ok());
  expectReject(a, RejectReason::kUnsupportedDType);
  // Oversized: 8 KiB against --max-chunk-bytes 4096.
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 1, 0, DType::kF32), std::vector<float>(2048)).ok());
  expectReject(a, RejectReason::kOversized);
  // No elements at all.
  ASSERT_TRUE(a.send(RawPeer::push(0, 1, 0, DType::kF32), std::vector<uint8_t>()).ok());
  expectReject(a, RejectReason::kWrongSize);
  // Key 2 is established as 2 x f32 by worker 0; worker 1 disagrees on dtype, then on size.
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 2, 0, DType::kF32), two).ok());
  ASSERT_TRUE(b.sendValues(RawPeer::push(1, 2, 0, DType::kF64), std::vector<double>{1}).ok());
  expectReject(b, RejectReason::kWrongDType);
  ASSERT_TRUE(b.sendValues(RawPeer::push(1, 2, 0, DType::kF32), std::vector<float>{1, 2, 3}).ok());
  expectReject(b, RejectReason::kWrongSize);
  // Sum vs average disagreement within a round.
  ASSERT_TRUE(
      b.sendValues(RawPeer::push(1, 2, 0, DType::kF32, 1, ps::kPushDeliver | ps::kPushAverage), two)
          .ok());
  expectReject(b, RejectReason::kWrongOp);
  // A correct contribution completes the round (nothing rejected was merged: 1+1, 2+2).
  ASSERT_TRUE(b.sendValues(RawPeer::push(1, 2, 0, DType::kF32), two).ok());
  auto r = b.recvSkippingAcks();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(floatsOf(*r), (std::vector<float>{2, 4}));
  auto ra = a.recvSkippingAcks();
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(floatsOf(*ra), (std::vector<float>{2, 4}));
  // Round 1 of key 2, then iteration 0 is finished (older than the last completed round).
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 2, 1, DType::kF32), two).ok());
  ASSERT_TRUE(b.sendValues(RawPeer::push(1, 2, 1, DType::kF32), two).ok());
  ASSERT_TRUE(a.recvSkippingAcks().ok());
  ASSERT_TRUE(b.recvSkippingAcks().ok());
  ASSERT_TRUE(a.sendValues(RawPeer::push(0, 2, 0, DType::kF32), two).ok());
  expectReject(a, RejectReason::kFinishedIteration);

  const std::pair<const char*, double> expected[] = {
      {"beyond_window", 1},     {"unknown_worker", 2}, {"malformed", 2},
      {"unsupported_dtype", 1}, {"oversized", 1},      {"wrong_size", 2},
      {"wrong_dtype", 1},       {"wrong_op", 1},       {"finished_iteration", 1}};
  for (const auto& [reason, count] : expected) {
    auto v = cluster.metric(0, "cofab_agg_rejects_total", std::string("reason=\"") + reason + "\"");
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, count) << reason;
  }
}

TEST(AggregatorProtocol, ClientSeesTheRejectionReason) {
  DaemonCluster cluster(1, 1);
  ASSERT_TRUE(cluster.start().ok());
  auto client = cluster.connect(0);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> x(10, 1.0f);
  ps::PushPullOptions po;
  po.iteration = 70;  // the daemon's open round is 0, and at most 8 empty ones are passed over
  Status s = (*client)
                 ->pushPull(3, TensorView::of(x.data(), x.size(), DType::kF32),
                            TensorView::of(x.data(), x.size(), DType::kF32), po)
                 .wait(Deadline::afterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("beyond_window"), std::string::npos) << s;
  // Bad arguments fail the handle at once, without a round trip.
  std::vector<int32_t> ints(4);
  Status bad = (*client)
                   ->pushPull(4, TensorView::of(ints.data(), 4, DType::kI32),
                              TensorView::of(ints.data(), 4, DType::kI32))
                   .wait(Deadline::afterMs(1000));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
}

int rawConnect(const std::string& address) {
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(address.c_str() + colon + 1)));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool writeAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Sends Hello{id} and reads the HelloAck, so that what follows reaches the daemon's receive loop.
bool rawHandshake(int fd, const std::string& id) {
  wire::Header hello;
  hello.type = wire::MessageType::kHello;
  hello.payloadLength = id.size();
  const auto enc = wire::encodeHeader(hello);
  if (!writeAll(fd, enc.data(), enc.size()) || !writeAll(fd, id.data(), id.size())) return false;
  uint8_t ack[wire::kHeaderSize];
  size_t got = 0;
  while (got < sizeof(ack)) {
    const ssize_t r = ::read(fd, ack + got, sizeof(ack) - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  auto h = wire::decodeHeader({ack, sizeof(ack)});
  if (!h.ok()) return false;
  std::vector<uint8_t> rest(h->payloadLength);
  got = 0;
  while (got < rest.size()) {
    const ssize_t r = ::read(fd, rest.data() + got, rest.size() - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

TEST(AggregatorProtocol, GarbageOnThePortDoesNotHurtOtherWorkers) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  std::mt19937_64 rng(42);
  // 1. Random bytes instead of a handshake.
  for (int i = 0; i < 3; ++i) {
    const int fd = rawConnect(cluster.address(0));
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> junk(4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    writeAll(fd, junk.data(), junk.size());
    ::close(fd);
  }
  // 2. A handshake claiming to be worker 0, then a push header announcing 1 MiB and 10 bytes.
  {
    const int fd = rawConnect(cluster.address(0));
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(rawHandshake(fd, "worker 0"));
    wire::Header h = RawPeer::push(0, 1, 0, DType::kF32);
    h.payloadLength = 1 << 20;
    const auto enc = wire::encodeHeader(h);
    writeAll(fd, enc.data(), enc.size());
    writeAll(fd, "0123456789", 10);
    ::close(fd);
  }
  // 3. A handshake, then a header with a broken CRC, then half a header.
  {
    const int fd = rawConnect(cluster.address(0));
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(rawHandshake(fd, "worker 1"));
    auto enc = wire::encodeHeader(RawPeer::push(1, 1, 0, DType::kF32));
    enc[20] ^= 0xff;
    writeAll(fd, enc.data(), enc.size());
    ::close(fd);
    const int fd2 = rawConnect(cluster.address(0));
    ASSERT_GE(fd2, 0);
    ASSERT_TRUE(rawHandshake(fd2, "worker 1"));
    writeAll(fd2, enc.data(), 30);
    ::close(fd2);
  }
  // The real workers are served as if nothing happened.
  auto statuses = runThreadRanks(2, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank));
    std::vector<float> x(3000, static_cast<float>(rank + 1));
    COFAB_RETURN_IF_ERROR(client
                              ->pushPull(1, TensorView::of(x.data(), x.size(), DType::kF32),
                                         TensorView::of(x.data(), x.size(), DType::kF32))
                              .wait(Deadline::afterMs(20000)));
    for (float v : x) {
      if (v != 3.0f) return Internal("wrong sum " + std::to_string(v));
    }
    client->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  auto health = cluster.httpGet(0, "/healthz");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_completed_total"), 1);
  // The fake workers' broken connections may count as lost workers, but the real ones
  // connecting again are live: no round was released for them.
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_failed_total"), 0);
}

}  // namespace
}  // namespace cofab::testing
