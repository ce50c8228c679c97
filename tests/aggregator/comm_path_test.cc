// comm::allreduce through the aggregator daemons: a Communicator created with
// CommOptions::allreducePath = ps::aggregatorAllreducePath(client) sends sum/avg allreduces to
// real cofab-aggd processes (bit-exact against the documented reduction order, counted by the
// daemons' metrics) and keeps min/max and integer dtypes on its peers. An allreduce that fails
// at its deadline (on the path, or through ps::AggregatorCollectives) leaves the caller's `out`
// alone from the moment it returns, and fails the path for good.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "core/param.h"
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

// Rank `rank`'s communicator whose allreduces go through the daemons, and the push-pull client
// its aggregator path shares.
struct PathComm {
  std::shared_ptr<ps::PushPullClient> client;
  std::unique_ptr<comm::Communicator> comm;
};
StatusOr<PathComm> pathComm(DaemonCluster& cluster, Store* store, int rank, int size,
                            const std::string& name, const ps::ClientOptions& co = {}) {
  PathComm pc;
  COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
  pc.client = std::move(client);
  comm::CommOptions o;
  o.name = name;
  o.allreducePath = ps::aggregatorAllreducePath(pc.client);
  COFAB_ASSIGN_OR_RETURN(pc.comm, comm::Communicator::create(rank, size, store, o));
  return pc;
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
    COFAB_ASSIGN_OR_RETURN(PathComm pc,
                           pathComm(cluster, &commStore, rank, kWorkers, "comm-path", co));
    std::shared_ptr<ps::PushPullClient> shared = pc.client;
    std::unique_ptr<comm::Communicator> c = std::move(pc.comm);
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
    COFAB_ASSIGN_OR_RETURN(PathComm pc,
                           pathComm(cluster, &commStore, rank, kWorkers, "comm-path-peers"));
    std::shared_ptr<ps::PushPullClient> shared = pc.client;
    std::unique_ptr<comm::Communicator> c = std::move(pc.comm);
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

TensorView f32(std::vector<float>& v) { return TensorView::of(v.data(), v.size(), DType::kF32); }

// Rank 0 gives up on an allreduce rank 1 has not joined yet; rank 1 then joins and the daemon
// completes the round with rank 0's contribution. Before the fix, allreduce() returned after
// handle.wait()'s DeadlineExceeded with the push-pull still in flight, and the result (2) later
// landed in the `out` rank 0 had taken back. Now the client is closed first: `out` keeps its -7,
// and the object is failed for good.
TEST(AggregatorCollectives, ATimedOutAllreduceNeverWritesOutAfterwardsAndFailsForGood) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto client0 = cluster.connect(0);
  auto client1 = cluster.connect(1);
  ASSERT_TRUE(client0.ok()) << client0.status();
  ASSERT_TRUE(client1.ok()) << client1.status();
  ps::AggregatorCollectives coll0(**client0), coll1(**client1);
  const size_t kCount = 1000;  // one chunk on the one daemon

  std::vector<float> in0(kCount, 1.0f), out0(kCount, -7.0f);
  comm::AllreduceOptions shortWait;
  shortWait.timeout = Millis(1000);
  const Status timedOut = coll0.allreduce(f32(in0), f32(out0), shortWait);
  EXPECT_EQ(timedOut.code(), StatusCode::kDeadlineExceeded) << timedOut;
  // Rank 0's push reached the daemon (sent before the client's goodbye, on one connection).
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_chunks_applied_total", 1).ok());

  // Rank 1 joins: the round completes with both contributions.
  std::vector<float> in1(kCount, 1.0f), out1(kCount, 0.0f);
  comm::AllreduceOptions longWait;
  longWait.timeout = Millis(20000);
  const Status joined = coll1.allreduce(f32(in1), f32(out1), longWait);
  ASSERT_TRUE(joined.ok()) << joined;
  EXPECT_EQ(out1, std::vector<float>(kCount, 2.0f));

  // Whatever rank 0's client still had in flight has ended (before the fix: its push-pull,
  // which received the result too; now nothing, the client is closed).
  (*client0)->waitAll(Deadline::afterMs(20000)).ignoreError();
  EXPECT_EQ(out0, std::vector<float>(kCount, -7.0f))
      << "the timed-out allreduce wrote into `out` after returning its error";
  EXPECT_FALSE((*client0)->status().ok()) << "the client should have been closed";

  // Failed for good: the next call returns the latched error at once and touches nothing.
  std::vector<float> in2(kCount, 5.0f), out2(kCount, -3.0f);
  comm::AllreduceOptions laterWait;
  laterWait.timeout = Millis(5000);
  const Status later = coll0.allreduce(f32(in2), f32(out2), laterWait);
  EXPECT_EQ(later.code(), StatusCode::kDeadlineExceeded) << later;
  EXPECT_NE(later.message().find("failed for good"), std::string::npos) << later;
  EXPECT_EQ(out2, std::vector<float>(kCount, -3.0f));
  (*client1)->close();
}

// With neither options.timeout nor options.deadline, COFAB_COLLECTIVE_TIMEOUT_MS bounds the
// allreduce, as for every collective (comm::CollectiveOptions). It waited a fixed 300 s.
TEST(AggregatorCollectives, TheCollectiveTimeoutVariableBoundsAnAllreduceWithoutOne) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto client0 = cluster.connect(0);
  ASSERT_TRUE(client0.ok()) << client0.status();
  ps::AggregatorCollectives coll0(**client0);
  std::vector<float> in(1000, 1.0f), out(1000, -7.0f);
  {
    ScopedParamOverride garbage("COFAB_COLLECTIVE_TIMEOUT_MS", "soon");
    EXPECT_EQ(coll0.allreduce(f32(in), f32(out)).code(), StatusCode::kInvalidArgument);
  }
  ScopedParamOverride timeout("COFAB_COLLECTIVE_TIMEOUT_MS", "500");
  const Status st = coll0.allreduce(f32(in), f32(out));  // rank 1 never joins
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  EXPECT_EQ(out, std::vector<float>(1000, -7.0f));
}

// The same through a Communicator's aggregator path: comm::allreduce waits with no deadline of
// its own, so before the fix the collective's timeout was never enforced (rank 0 blocked until
// rank 1 joined, then got the sum). Now the timeout cancels the push-pull (closing the client),
// `out` stays untouched, later allreduces on the path fail at once with the latched error, and
// the communicator's asyncError() (its peers) stays OK.
TEST(CommAllreducePath, TheCollectiveTimeoutCancelsThePushPullAndFailsThePathForGood) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  HashStore commStore;
  const size_t kCount = 1000;
  std::vector<float> out0(kCount, -7.0f), out1(kCount, 0.0f), in2(kCount, 5.0f),
      out2(kCount, -3.0f);
  Status first, later, peersError, joined;
  std::promise<void> rank0GaveUp, rank1Done;
  std::shared_future<void> gaveUp = rank0GaveUp.get_future().share();
  std::shared_future<void> done = rank1Done.get_future().share();
  auto statuses = runThreadRanks(2, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(PathComm pc,
                           pathComm(cluster, &commStore, rank, 2, "comm-path-timeout"));
    std::shared_ptr<ps::PushPullClient> shared = pc.client;
    std::unique_ptr<comm::Communicator> c = std::move(pc.comm);
    std::vector<float> in(kCount, 1.0f);
    if (rank == 0) {
      comm::AllreduceOptions a;
      a.timeout = Millis(1000);
      first = comm::allreduce(*c, f32(in), f32(out0), a);
      rank0GaveUp.set_value();
      // Keep the communicator until rank 1 is done (bounded: it may fail).
      (void)done.wait_for(std::chrono::seconds(30));
      // Waited on with a deadline of our own: before the fix this one would never end (rank 1
      // is gone), and the path enforced no deadline.
      comm::AllreduceOptions b;
      b.timeout = Millis(10000);
      comm::CollectiveHandle h = comm::allreduceAsync(*c, f32(in2), f32(out2), b);
      later = h.wait(Deadline::afterMs(10000));
      peersError = c->asyncError();
      return OkStatus();
    }
    // Rank 1 joins once rank 0 gave up (bounded: before the fix rank 0 only returns once rank 1
    // has joined, so rank 1 goes ahead after 10 s).
    (void)gaveUp.wait_for(std::chrono::seconds(10));
    comm::AllreduceOptions a;
    a.timeout = Millis(20000);
    joined = comm::allreduce(*c, f32(in), f32(out1), a);
    rank1Done.set_value();
    shared->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;
  ASSERT_TRUE(joined.ok()) << joined;
  EXPECT_EQ(out1, std::vector<float>(kCount, 2.0f));
  EXPECT_EQ(out0, std::vector<float>(kCount, -7.0f))
      << "the timed-out allreduce wrote into `out` after returning its error";
  EXPECT_EQ(later.code(), StatusCode::kDeadlineExceeded) << later;
  EXPECT_NE(later.message().find("failed for good"), std::string::npos) << later;
  EXPECT_EQ(out2, std::vector<float>(kCount, -3.0f));
  EXPECT_TRUE(peersError.ok()) << "asyncError() covers the peers only: " << peersError;
}

// abort() cancels an allreduce running on the aggregator path (it runs outside the queue, and
// ran on until the daemons' round timeout): the handle fails with the abort, `out` is left
// alone, and the path's client is closed.
TEST(CommAllreducePath, AbortCancelsAnAllreduceRunningOnThePath) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  HashStore commStore;
  const size_t kCount = 1000;
  std::vector<float> in(kCount, 1.0f), out(kCount, -7.0f);
  Status waited;
  bool clientClosed = false;
  std::promise<void> rank0Done;
  std::shared_future<void> done = rank0Done.get_future().share();
  auto statuses = runThreadRanks(2, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(PathComm pc, pathComm(cluster, &commStore, rank, 2, "comm-path-abort"));
    std::shared_ptr<ps::PushPullClient> shared = pc.client;
    std::unique_ptr<comm::Communicator> c = std::move(pc.comm);
    if (rank == 1) {  // never joins the allreduce
      (void)done.wait_for(std::chrono::seconds(30));
      return OkStatus();
    }
    comm::AllreduceOptions a;
    a.timeout = Millis(60000);
    comm::CollectiveHandle h = comm::allreduceAsync(*c, f32(in), f32(out), a);
    c->abort();
    waited = h.wait(Deadline::afterMs(15000));
    clientClosed = !shared->status().ok();
    rank0Done.set_value();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  EXPECT_EQ(waited.code(), StatusCode::kAborted) << waited;
  EXPECT_EQ(out, std::vector<float>(kCount, -7.0f));
  EXPECT_TRUE(clientClosed);
}

// Polling test() enforces the collective's deadline as waiting does (docs/COLLECTIVES.md): a
// caller that overlaps compute with `while (!h.test())` gets DeadlineExceeded once the timeout
// has passed. On the aggregator path test() only asked the push-pull, which runs until the
// daemons' round timeout (minutes), and the loop spun all that time.
TEST(CommAllreducePath, PollingTestEnforcesTheCollectiveTimeout) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  HashStore commStore;
  const size_t kCount = 1000;
  std::vector<float> in(kCount, 1.0f), out(kCount, -7.0f);
  bool ended = false;
  Status polled;
  std::promise<void> rank0Done;
  std::shared_future<void> done = rank0Done.get_future().share();
  auto statuses = runThreadRanks(2, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(PathComm pc, pathComm(cluster, &commStore, rank, 2, "comm-path-poll"));
    std::shared_ptr<ps::PushPullClient> shared = pc.client;
    std::unique_ptr<comm::Communicator> c = std::move(pc.comm);
    if (rank == 1) {  // never joins the allreduce
      (void)done.wait_for(std::chrono::seconds(30));
      return OkStatus();
    }
    comm::AllreduceOptions a;
    a.timeout = Millis(500);
    comm::CollectiveHandle h = comm::allreduceAsync(*c, f32(in), f32(out), a);
    const Deadline bound = Deadline::afterMs(15000);
    while (!(ended = h.test()) && !bound.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (ended) polled = h.status();
    rank0Done.set_value();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  ASSERT_TRUE(ended) << "test() still false 15 s past a 500 ms timeout";
  EXPECT_EQ(polled.code(), StatusCode::kDeadlineExceeded) << polled;
  EXPECT_EQ(out, std::vector<float>(kCount, -7.0f));
}

}  // namespace
}  // namespace cofab::testing
