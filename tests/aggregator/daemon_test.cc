// cofab-aggd as real processes: results against a serial reference over many tensors, sizes,
// dtypes, ops and deliveries; metrics; SIGTERM drains and exits 0.
#include <signal.h>

#include <gtest/gtest.h>

#include <thread>

#include "fabric/ps/aggregator_collectives.h"
#include "fabric/ps/model_client.h"
#include "fabric/ps/placement.h"
#include "fabric/ps/push_pull.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/aggregator/test_data.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

struct TensorSpec {
  uint64_t key;
  size_t count;
  DType dtype;
  bool average;
};

std::vector<TensorSpec> manyTensors() {
  const size_t sizes[] = {1, 7, 1000, 1024, 1025, 5000, 20000, 3, 4096, 777};
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};
  std::vector<TensorSpec> out;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    out.push_back({100 + i, sizes[i], dtypes[i % 4], i % 3 == 1});
  }
  return out;
}

struct Case {
  int servers;
  ps::Delivery delivery;
};

class PushPullReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(PushPullReferenceTest, BitExactAgainstSerialReference) {
  const int kWorkers = 3;
  const int kIterations = 3;
  DaemonCluster cluster(GetParam().servers, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  const auto tensors = manyTensors();
  // outputs[rank][iteration][tensor]
  std::vector<std::vector<std::vector<std::vector<uint8_t>>>> outputs(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = 4096;  // many chunks per tensor, spread over every daemon
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    auto& mine = outputs[static_cast<size_t>(rank)];
    for (int it = 0; it < kIterations; ++it) {
      std::vector<std::vector<uint8_t>> in, out;
      std::vector<ps::PushPullHandle> handles;
      for (const auto& t : tensors) {
        in.push_back(makeTensor(t.dtype, t.count, rank, t.key, static_cast<uint64_t>(it)));
        out.emplace_back(in.back().size());
      }
      // Batched: all tensors in flight at once, waited on afterwards.
      for (size_t i = 0; i < tensors.size(); ++i) {
        ps::PushPullOptions po;
        po.op = tensors[i].average ? ps::ReduceOp::kAverage : ps::ReduceOp::kSum;
        po.delivery = GetParam().delivery;
        handles.push_back(client->pushPull(
            tensors[i].key, TensorView(in[i].data(), tensors[i].count, tensors[i].dtype),
            TensorView(out[i].data(), tensors[i].count, tensors[i].dtype), po));
      }
      for (auto& h : handles) COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
      mine.push_back(std::move(out));
    }
    client->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  for (int it = 0; it < kIterations; ++it) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < kWorkers; ++r) {
        inputs.push_back(makeTensor(tensors[i].dtype, tensors[i].count, r, tensors[i].key,
                                    static_cast<uint64_t>(it)));
      }
      const auto expected = referenceReduce(tensors[i].dtype, tensors[i].average, inputs);
      for (int r = 0; r < kWorkers; ++r) {
        ASSERT_EQ(outputs[static_cast<size_t>(r)][static_cast<size_t>(it)][i], expected)
            << "worker " << r << " iteration " << it << " key " << tensors[i].key << " dtype "
            << dtypeName(tensors[i].dtype) << " count " << tensors[i].count;
      }
    }
  }
  double rounds = 0;
  for (int s = 0; s < cluster.servers(); ++s) {
    auto v = cluster.metric(s, "cofab_agg_rounds_completed_total");
    ASSERT_TRUE(v.ok()) << v.status();
    rounds += *v;
  }
  size_t chunks = 0;
  for (const auto& t : tensors) {
    chunks += ps::chunkLayout(t.count, dtypeSize(t.dtype), 4096).chunkCount;
  }
  EXPECT_EQ(rounds, static_cast<double>(chunks * kIterations));
}

INSTANTIATE_TEST_SUITE_P(Deployments, PushPullReferenceTest,
                         ::testing::Values(Case{1, ps::Delivery::kPushBack},
                                           Case{1, ps::Delivery::kPull},
                                           Case{3, ps::Delivery::kPushBack},
                                           Case{3, ps::Delivery::kPull}),
                         [](const auto& info) {
                           return std::to_string(info.param.servers) + "servers_" +
                                  (info.param.delivery == ps::Delivery::kPull ? "pull" : "push");
                         });

TEST(DaemonLifecycle, HealthMetricsAndSigtermExitsZero) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto health = cluster.httpGet(0, "/healthz");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "ok\n");
  auto statuses = runThreadRanks(2, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank));
    std::vector<float> x(1000, static_cast<float>(rank + 1));
    COFAB_RETURN_IF_ERROR(client
                              ->pushPull(1, TensorView::of(x.data(), x.size(), DType::kF32),
                                         TensorView::of(x.data(), x.size(), DType::kF32))
                              .wait(Deadline::afterMs(20000)));
    if (x[999] != 3.0f) return Internal("sum is " + std::to_string(x[999]));
    client->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  auto rounds = cluster.metric(0, "cofab_agg_rounds_completed_total");
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  EXPECT_EQ(*rounds, 1);
  auto bytesIn = cluster.metric(0, "cofab_agg_bytes_in_total");
  ASSERT_TRUE(bytesIn.ok());
  EXPECT_EQ(*bytesIn, 2 * 4000);
  auto lag = cluster.metric(0, "cofab_agg_worker_lag_iterations", "worker=\"1\"");
  ASSERT_TRUE(lag.ok()) << lag.status();
  EXPECT_EQ(*lag, 0);
  auto lost = cluster.metric(0, "cofab_agg_workers_lost_total");
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(*lost, 0) << "an orderly close() must not count as a lost worker";
  cluster.signal(0, SIGTERM);
  EXPECT_EQ(cluster.wait(0, Deadline::afterMs(20000)), 0);
}

// A client whose chunks exceed a daemon's --max-chunk-bytes is refused at connect, naming the
// daemon and both sizes: chunks over twice the limit broke the connection (the daemon's frame
// limit) instead of being rejected, so the worker failed over and every daemon counted it lost.
TEST(AggregatorDaemon, AChunkSizeAboveADaemonsLimitIsRefusedAtConnect) {
  DaemonCluster cluster(1, 1, {"--max-chunk-bytes", "1048576"});
  ASSERT_TRUE(cluster.start().ok());
  ps::ClientOptions co;
  co.chunkBytes = 4u << 20;
  auto refused = cluster.connect(0, co);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("aggregator 0's --max-chunk-bytes 1048576"),
            std::string::npos)
      << refused.status();
  co.chunkBytes = 1u << 20;  // at the limit: fine
  auto fits = cluster.connect(0, co);
  ASSERT_TRUE(fits.ok()) << fits.status();
  std::vector<float> x(1u << 19, 1.0f);  // two chunks
  const TensorView v = TensorView::of(x.data(), x.size(), DType::kF32);
  EXPECT_TRUE((*fits)->pushPull(1, v, v).wait(Deadline::afterMs(20000)).ok());
}

// The same for the model store's client: its chunks (COFAB_PS_MODEL_CHUNK_BYTES, 4 MiB by
// default) went unchecked, the first init frame above the daemon's frame limit dropped the
// connection, and the client (the model store has no replication) had that daemon dead for good.
TEST(AggregatorDaemon, AModelChunkSizeAboveADaemonsLimitIsRefusedAtConnect) {
  DaemonCluster cluster(1, 1, {"--max-chunk-bytes", "1048576"});
  ASSERT_TRUE(cluster.start().ok());
  ps::ClientOptions co;
  co.chunkBytes = 4u << 20;
  auto refused = ps::ModelClient::connect(cluster.store(), 0, 1, co);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("aggregator 0's --max-chunk-bytes 1048576"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("COFAB_PS_MODEL_CHUNK_BYTES"), std::string::npos)
      << refused.status();
  co.chunkBytes = 1u << 20;  // at the limit: fine
  auto fits = ps::ModelClient::connect(cluster.store(), 0, 1, co);
  ASSERT_TRUE(fits.ok()) << fits.status();
  (*fits)->close();
}

// While a daemon drains (SIGTERM), a push that completes a round already open is still taken,
// so the round completes instead of failing at the end of --drain-timeout-ms; a push that would
// open a new round is refused ("draining"). Every push used to be refused while draining.
TEST(AggregatorDaemon, DrainingTakesThePushesThatCompleteOpenRounds) {
  DaemonCluster cluster(1, 2, {"--drain-timeout-ms", "20000"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w0.ok() && w1.ok());
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 1, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack: round 0 of key 1 is open, waiting for worker 1
  cluster.signal(0, SIGTERM);
  bool draining = false;  // /healthz answers 503 once the daemon drains
  for (int i = 0; i < 2000 && !draining; ++i) {
    draining = !cluster.httpGet(0, "/healthz").ok();
    if (!draining) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(draining) << "the daemon never started draining";
  // A new round is refused. (Asked while the open round still keeps the daemon serving: once
  // that round is done the daemon exits, and a push after it races with the exit.)
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 2, 0, DType::kF32), std::vector<float>{1, 1}).ok());
  auto refused = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->isReject(ps::RejectReason::kDraining)) << refused->header.describe();
  // The push the open round waits for is taken, and the round completes.
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 1, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
  EXPECT_EQ(cluster.wait(0, Deadline::afterMs(30000)), 0);
}

// A pull while draining does not open a round of its own: no push could complete it now (they
// are refused), so the drain would wait for it until --drain-timeout-ms. Refused like a push
// that would open a round. (A Delivery::kPull client sends a push and then a pull: the push was
// refused, the pull taken.)
TEST(AggregatorDaemon, DrainingRefusesAPullThatWouldOpenARound) {
  DaemonCluster cluster(1, 2, {"--drain-timeout-ms", "20000"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w0.ok() && w1.ok());
  // An open round keeps the daemon draining (and serving) until worker 1 completes it.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 1, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack
  cluster.signal(0, SIGTERM);
  bool draining = false;
  for (int i = 0; i < 2000 && !draining; ++i) {
    draining = !cluster.httpGet(0, "/healthz").ok();
    if (!draining) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(draining) << "the daemon never started draining";
  wire::Header pull = RawPeer::push(1, 5, 0, DType::kF32);
  pull.type = wire::MessageType::kPull;
  pull.opcode = 0;
  ASSERT_TRUE((*w1)->send(pull, {}).ok());
  auto refused = (*w1)->recvSkippingAcks();
  ASSERT_TRUE(refused.ok()) << refused.status() << " (the pull was taken and waits)";
  EXPECT_TRUE(refused->isReject(ps::RejectReason::kDraining)) << refused->header.describe();
  // The open round still completes, and the daemon exits once it has.
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 1, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  auto sum = (*w0)->recvResult();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  EXPECT_EQ(cluster.wait(0, Deadline::afterMs(30000)), 0);
}

// SIGTERM while large results are still queued for workers that have not read them yet: the
// daemon lets them reach the sockets before it closes the connections. It closed them a fixed
// 20 ms after its engines stopped, cancelling what was still queued, and the workers saw the
// stream cut off in the middle of their result.
TEST(AggregatorDaemon, SigtermDeliversTheResultsAlreadyQueued) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  constexpr size_t kFloats = 8u << 20;  // 32 MiB: far more than the sockets buffer
  std::vector<std::unique_ptr<RawPeer>> w;
  for (int r = 0; r < 2; ++r) {
    auto p = RawPeer::connect(cluster.address(0), "worker " + std::to_string(r));
    ASSERT_TRUE(p.ok()) << p.status();
    w.push_back(std::move(*p));
    ASSERT_TRUE(w[r]->sendValues(RawPeer::push(r, 1, 0, DType::kF32),
                                 std::vector<float>(kFloats, static_cast<float>(r + 1)))
                    .ok());
  }
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_rounds_completed_total", 1).ok());
  cluster.signal(0, SIGTERM);  // the results are queued; nobody has read them yet
  for (int r = 0; r < 2; ++r) {
    auto sum = w[r]->recvResult();
    ASSERT_TRUE(sum.ok()) << "worker " << r << ": " << sum.status();
    ASSERT_EQ(sum->size(), kFloats);
    EXPECT_EQ((*sum)[0], 3.0f);
    EXPECT_EQ((*sum)[kFloats - 1], 3.0f);
  }
  EXPECT_EQ(cluster.wait(0, Deadline::afterMs(20000)), 0);
}

}  // namespace
}  // namespace cofab::testing

namespace cofab::testing {
namespace {

// The inverse of ps::mix64 (SplitMix64's finalizer): a key whose mix equals a given value.
uint64_t unmix64(uint64_t x) {
  const auto inverse = [](uint64_t odd) {  // Newton's iteration modulo 2^64
    uint64_t v = odd;
    for (int i = 0; i < 6; ++i) v *= 2 - odd * v;
    return v;
  };
  const auto unxorshift = [](uint64_t y, int shift) {
    uint64_t v = y;
    for (int i = 0; i * shift < 64; ++i) v = y ^ (v >> shift);
    return v;
  };
  x = unxorshift(x, 31);
  x *= inverse(0x94d049bb133111ebull);
  x = unxorshift(x, 27);
  x *= inverse(0xbf58476d1ce4e5b9ull);
  x = unxorshift(x, 30);
  return x - 0x9e3779b97f4a7c15ull;
}

// Two chunks that the daemon's old 64-bit slot id, mix64(key) ^ chunk * 0x9e3779b97f4a7c15,
// mapped to one slot (chunk 0 of one key, chunk 1 of another: a key anyone can compute) are
// two rounds. The daemon refused every push to the second one ("slot id collision"), and a pull
// of it waited on the first one's round and got its result.
TEST(AggregatorDaemon, ChunksWhoseHashedIdsCollideAreKeptApart) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  const uint64_t second = 5;
  const uint64_t first = unmix64(ps::mix64(second) ^ kGolden);
  ASSERT_EQ(ps::mix64(first), ps::mix64(second) ^ kGolden) << "not a collision of the old id";
  DaemonCluster cluster(1, 2, {"--engines", "1"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w0.ok() && w1.ok());
  // Round 0 of chunk 0 of `first` is open (worker 1 has not pushed) while worker 1 pulls
  // chunk 1 of `second`.
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, first, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack
  wire::Header chunk1 = RawPeer::push(1, second, 0, DType::kF32, 2);
  chunk1.chunkIndex = 1;
  wire::Header pull = chunk1;
  pull.type = wire::MessageType::kPull;
  pull.opcode = 0;
  ASSERT_TRUE((*w1)->send(pull, {}).ok());
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, first, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
  // The pull still waits for its own round, which both workers now complete.
  for (uint32_t rank : {0u, 1u}) {
    wire::Header push = chunk1;
    push.senderRank = rank;
    RawPeer& w = rank == 0 ? **w0 : **w1;
    ASSERT_TRUE(
        w.sendValues(push, rank == 0 ? std::vector<float>{3, 4} : std::vector<float>{30, 40}).ok());
  }
  for (RawPeer* w : {&**w0, &**w1, &**w1}) {  // worker 1: its pull's answer and its push's
    auto sum = w->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(sum->size(), 2u);
    EXPECT_EQ(*sum, (std::vector<float>{33, 44}));
  }
}

TEST(AggregatorCollectives, AllreduceThroughDaemonsMatchesTheDefinition) {
  const int kWorkers = 3;
  DaemonCluster cluster(2, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank));
    ps::AggregatorCollectives coll(*client);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> x(5000, static_cast<float>(rank + step));
      COFAB_RETURN_IF_ERROR(coll.allreduce(TensorView::of(x.data(), x.size(), DType::kF32)));
      const float want = static_cast<float>(0 + 1 + 2 + 3 * step);
      if (x[4999] != want) return Internal("sum " + std::to_string(x[4999]));
      comm::AllreduceOptions avg;
      avg.op = comm::ReduceOp::kAvg;
      std::vector<double> y(10, static_cast<double>(rank));
      COFAB_RETURN_IF_ERROR(coll.allreduce(TensorView::of(y.data(), y.size(), DType::kF64), avg));
      if (y[0] != 1.0) return Internal("avg " + std::to_string(y[0]));
    }
    comm::AllreduceOptions mx;
    mx.op = comm::ReduceOp::kMax;
    std::vector<float> z(4);
    if (coll.allreduce(TensorView::of(z.data(), 4, DType::kF32), mx).code() !=
        StatusCode::kUnimplemented) {
      return Internal("max should be Unimplemented");
    }
    client->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
}

}  // namespace
}  // namespace cofab::testing
