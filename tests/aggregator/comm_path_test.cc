// comm::allreduce through the aggregator daemons: a Communicator created with
// CommOptions::allreducePath = ps::aggregatorAllreducePath(client) sends sum/avg allreduces to
// real cofab-aggd processes (bit-exact against the documented reduction order, counted by the
// daemons' metrics) and keeps min/max and integer dtypes on its peers.
#include <gtest/gtest.h>

#include "fabric/comm/collectives.h"
#include "fabric/ps/aggregator_collectives.h"
#include "fabric/rendezvous/hash_store.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/test_data.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

constexpr int kWorkers = 3;

double roundsCompleted(DaemonCluster& cluster) {
  double total = 0;
  for (int i = 0; i < cluster.servers(); ++i) {
    auto v = cluster.metric(i, "cofab_agg_rounds_completed_total");
    EXPECT_TRUE(v.ok()) << v.status();
    if (v.ok()) total += *v;
  }
  return total;
}

TEST(CommAllreducePath, SumAndAverageGoThroughTheDaemonsBitExact) {
  DaemonCluster cluster(2, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  HashStore commStore;
  const size_t kCount = 3000;  // 3 chunks of 4 KiB f32 (and 2 for bf16), spread over 2 daemons
  std::vector<std::vector<uint8_t>> sums(kWorkers), avgs(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = 4096;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    std::shared_ptr<ps::PushPullClient> shared(std::move(client));
    comm::CommOptions o;
    o.name = "comm-path";
    o.allreducePath = ps::aggregatorAllreducePath(shared);
    COFAB_ASSIGN_OR_RETURN(auto c, comm::Communicator::create(rank, kWorkers, &commStore, o));
    if (c->allreducePath() == nullptr || c->allreducePath()->name() != "aggregators") {
      return Internal("communicator does not report its aggregator path");
    }
    // Sum, blocking, out of place.
    auto in = makeTensor(DType::kF32, kCount, rank, 1, 0);
    sums[static_cast<size_t>(rank)].resize(in.size());
    COFAB_RETURN_IF_ERROR(
        comm::allreduce(*c, TensorView(in.data(), kCount, DType::kF32),
                        TensorView(sums[static_cast<size_t>(rank)].data(), kCount, DType::kF32)));
    // Average, asynchronous, in place.
    avgs[static_cast<size_t>(rank)] = makeTensor(DType::kBF16, kCount, rank, 2, 0);
    comm::AllreduceOptions avg;
    avg.op = comm::ReduceOp::kAvg;
    TensorView v(avgs[static_cast<size_t>(rank)].data(), kCount, DType::kBF16);
    comm::CollectiveHandle h = comm::allreduceAsync(*c, v, v, avg);
    COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
    if (!h.test() || !h.status().ok()) return Internal("handle not complete after wait");
    shared->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  std::vector<std::vector<uint8_t>> sumIn, avgIn;
  for (int r = 0; r < kWorkers; ++r) {
    sumIn.push_back(makeTensor(DType::kF32, kCount, r, 1, 0));
    avgIn.push_back(makeTensor(DType::kBF16, kCount, r, 2, 0));
  }
  const auto wantSum = referenceReduce(DType::kF32, false, sumIn);
  const auto wantAvg = referenceReduce(DType::kBF16, true, avgIn);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(sums[static_cast<size_t>(r)], wantSum) << "rank " << r;
    EXPECT_EQ(avgs[static_cast<size_t>(r)], wantAvg) << "rank " << r;
  }
  // 3 f32 chunks + 2 bf16 chunks, each one round on its daemon: the daemons did the reducing.
  EXPECT_EQ(roundsCompleted(cluster), 5.0);
}

TEST(CommAllreducePath, MinMaxAndIntegersStayOnThePeers) {
  DaemonCluster cluster(1, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  HashStore commStore;
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank));
    std::shared_ptr<ps::PushPullClient> shared(std::move(client));
    comm::CommOptions o;
    o.name = "comm-path-peers";
    o.allreducePath = ps::aggregatorAllreducePath(shared);
    COFAB_ASSIGN_OR_RETURN(auto c, comm::Communicator::create(rank, kWorkers, &commStore, o));
    std::vector<float> x(100, static_cast<float>(rank));
    comm::AllreduceOptions mx;
    mx.op = comm::ReduceOp::kMax;
    COFAB_RETURN_IF_ERROR(comm::allreduce(*c, TensorView::of(x.data(), x.size(), DType::kF32), mx));
    if (x[99] != static_cast<float>(kWorkers - 1)) return Internal("max " + std::to_string(x[99]));
    std::vector<int32_t> y(10, rank + 1);
    COFAB_RETURN_IF_ERROR(comm::allreduce(*c, TensorView::of(y.data(), y.size(), DType::kI32)));
    if (y[0] != kWorkers * (kWorkers + 1) / 2) return Internal("i32 sum " + std::to_string(y[0]));
    shared->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  EXPECT_EQ(roundsCompleted(cluster), 0.0) << "max and i32 must not reach the daemons";
}

}  // namespace
}  // namespace cofab::testing
