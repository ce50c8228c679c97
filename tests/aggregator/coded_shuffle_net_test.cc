// Coded shuffling over the network (fabric/coded/shuffle_relay.h): a master uploads each epoch's
// messages once to a real cofab-aggd (fan-out pushes), n workers pull what they need and rebuild
// their batches from their caches; every batch must equal the data set's rows exactly, coded and
// uncoded, and the master's egress must be what the plan says (coded: one upload per multicast,
// not one per receiving worker), and released epochs free the daemon's slots.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "coding/shuffle/coded_shuffle.h"
#include "fabric/coded/shuffle_relay.h"
#include "fabric/ps/ps_protocol.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

TEST(CodedShuffleNet, WorkersDecodeExactlyAndMasterEgressFollowsThePlan) {
  const int n = 4;
  const size_t rowBytes = 256;
  const int64_t rows = 4 * 6 * 10;  // n C(n, t) x 10 with t = 2: equal lists every epoch
  auto shuffle = coding::CodedShuffle::create({.workers = n, .cacheFraction = 0.5, .rows = rows});
  ASSERT_TRUE(shuffle.ok()) << shuffle.status();
  std::vector<uint8_t> data(rows * rowBytes);
  std::mt19937 rng(3);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<coding::WorkerCache> caches;
  for (int w = 0; w < n; ++w) {
    auto c = shuffle->buildCache(w, data, rowBytes);
    ASSERT_TRUE(c.ok()) << c.status();
    caches.push_back(std::move(*c));
  }

  DaemonCluster cluster(1, n + 1);  // ranks 0..n-1 workers, n the master
  ASSERT_TRUE(cluster.start().ok());
  auto master = coded::ShuffleEndpoint::connect(cluster.address(0), n, Deadline::afterMs(10000));
  ASSERT_TRUE(master.ok()) << master.status();
  std::vector<std::unique_ptr<coded::ShuffleEndpoint>> workers;
  for (int w = 0; w < n; ++w) {
    auto e = coded::ShuffleEndpoint::connect(cluster.address(0), w, Deadline::afterMs(10000));
    ASSERT_TRUE(e.ok()) << e.status();
    workers.push_back(std::move(*e));
  }
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (bool coded : {true, false}) {
      SCOPED_TRACE("epoch " + std::to_string(epoch) + (coded ? " coded" : " uncoded"));
      auto plan = shuffle->planEpoch(epoch, rowBytes);
      ASSERT_TRUE(plan.ok()) << plan.status();
      auto stats = coded::shuffleUploadEpoch(**master, *shuffle, *plan, coded, data, rowBytes,
                                             Deadline::afterMs(20000));
      ASSERT_TRUE(stats.ok()) << stats.status();
      const int64_t planned = coded ? plan->accounting.codedBytes : plan->accounting.uncodedBytes;
      EXPECT_EQ(static_cast<int64_t>(stats->payloadBytes), planned);
      EXPECT_EQ(stats->masterEgressBytes,
                stats->payloadBytes +
                    stats->messages * (wire::kHeaderSize + coded::kShufflePlanTagBytes));
      auto statuses = runThreadRanks(n, [&](int w) -> Status {
        std::vector<uint8_t> batch(plan->batch[w].size() * rowBytes);
        COFAB_RETURN_IF_ERROR(coded::shuffleReceiveEpoch(*workers[w], *shuffle, *plan, coded,
                                                         caches[w], rowBytes, batch,
                                                         Deadline::afterMs(20000)));
        for (size_t i = 0; i < plan->batch[w].size(); ++i) {
          if (std::memcmp(batch.data() + i * rowBytes, data.data() + plan->batch[w][i] * rowBytes,
                          rowBytes) != 0) {
            return DataLoss("worker " + std::to_string(w) + ": batch row " + std::to_string(i) +
                            " (data row " + std::to_string(plan->batch[w][i]) + ") differs");
          }
        }
        return OkStatus();
      });
      ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
    }
  }
}

// A long run: 20 epochs (coded and uncoded alternating) through one real cofab-aggd. Before each
// release the daemon holds exactly the epoch's uploads; after the master's release it holds none
// (cofab_agg_slots), so its memory does not grow with the number of epochs; a late pull for a
// released epoch is rejected as released instead of waiting for a round that never comes.
TEST(CodedShuffleNet, ReleasedEpochsKeepTheDaemonsSlotsBounded) {
  const int n = 4;
  const size_t rowBytes = 64;
  const int64_t rows = 4 * 6 * 4;
  auto shuffle = coding::CodedShuffle::create({.workers = n, .cacheFraction = 0.5, .rows = rows});
  ASSERT_TRUE(shuffle.ok()) << shuffle.status();
  std::vector<uint8_t> data(rows * rowBytes);
  std::mt19937 rng(5);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<coding::WorkerCache> caches;
  for (int w = 0; w < n; ++w) {
    auto c = shuffle->buildCache(w, data, rowBytes);
    ASSERT_TRUE(c.ok()) << c.status();
    caches.push_back(std::move(*c));
  }
  DaemonCluster cluster(1, n + 1);
  ASSERT_TRUE(cluster.start().ok());
  auto master = coded::ShuffleEndpoint::connect(cluster.address(0), n, Deadline::afterMs(10000));
  ASSERT_TRUE(master.ok()) << master.status();
  std::vector<std::unique_ptr<coded::ShuffleEndpoint>> workers;
  for (int w = 0; w < n; ++w) {
    auto e = coded::ShuffleEndpoint::connect(cluster.address(0), w, Deadline::afterMs(10000));
    ASSERT_TRUE(e.ok()) << e.status();
    workers.push_back(std::move(*e));
  }
  int64_t uploaded = 0;
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    const bool coded = epoch % 2 == 0;
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    auto plan = shuffle->planEpoch(epoch, rowBytes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto stats = coded::shuffleUploadEpoch(**master, *shuffle, *plan, coded, data, rowBytes,
                                           Deadline::afterMs(20000));
    ASSERT_TRUE(stats.ok()) << stats.status();
    uploaded += stats->messages;
    auto statuses = runThreadRanks(n, [&](int w) -> Status {
      std::vector<uint8_t> batch(plan->batch[w].size() * rowBytes);
      return coded::shuffleReceiveEpoch(*workers[w], *shuffle, *plan, coded, caches[w], rowBytes,
                                        batch, Deadline::afterMs(20000));
    });
    ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
    auto held = cluster.metric(0, "cofab_agg_slots");
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, double(stats->messages)) << "before the release: this epoch's uploads";
    ASSERT_TRUE(coded::shuffleReleaseEpoch(**master, *plan, coded, Deadline::afterMs(20000)).ok());
    held = cluster.metric(0, "cofab_agg_slots");
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, 0.0) << "after the release";
    auto released = cluster.metric(0, "cofab_agg_fanout_released_total");
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(*released, double(uploaded));
    if (coded && epoch == 18) {  // worker 0 pulls coded messages
      std::vector<uint8_t> batch(plan->batch[0].size() * rowBytes);
      Status late = coded::shuffleReceiveEpoch(*workers[0], *shuffle, *plan, coded, caches[0],
                                               rowBytes, batch, Deadline::afterMs(20000));
      EXPECT_FALSE(late.ok());
      EXPECT_NE(late.message().find("released"), std::string::npos) << late;
    }
  }
}

// Worker 0 plans with another seed than the master (same shape): its pulls get rows of the
// master's plan, which it used to XOR with the rows its own plan names and "decode" into a wrong
// batch with OK. Each row now carries the plan's tag: the pull fails naming the mismatch. A
// worker with another rowBytes fails naming both sizes before it pulls anything.
TEST(CodedShuffleNet, AWorkerWithAnotherPlanOrRowSizeFailsInsteadOfDecodingGarbage) {
  const int n = 2;
  const size_t rowBytes = 64;
  const int64_t rows = 2 * 1 * 10;  // n C(n, t) x 10 with t = 1
  auto masterShuffle =
      coding::CodedShuffle::create({.workers = n, .cacheFraction = 0.5, .rows = rows, .seed = 1});
  auto workerShuffle =
      coding::CodedShuffle::create({.workers = n, .cacheFraction = 0.5, .rows = rows, .seed = 2});
  ASSERT_TRUE(masterShuffle.ok() && workerShuffle.ok());
  std::vector<uint8_t> data(rows * rowBytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13 + 5);
  auto cache = workerShuffle->buildCache(0, data, rowBytes);
  ASSERT_TRUE(cache.ok()) << cache.status();

  DaemonCluster cluster(1, n + 1);
  ASSERT_TRUE(cluster.start().ok());
  auto master = coded::ShuffleEndpoint::connect(cluster.address(0), n, Deadline::afterMs(10000));
  auto worker = coded::ShuffleEndpoint::connect(cluster.address(0), 0, Deadline::afterMs(10000));
  ASSERT_TRUE(master.ok() && worker.ok());
  auto masterPlan = masterShuffle->planEpoch(0, rowBytes);
  auto workerPlan = workerShuffle->planEpoch(0, rowBytes);
  ASSERT_TRUE(masterPlan.ok() && workerPlan.ok());
  auto up = coded::shuffleUploadEpoch(**master, *masterShuffle, *masterPlan, /*coded=*/true, data,
                                      rowBytes, Deadline::afterMs(10000));
  ASSERT_TRUE(up.ok()) << up.status();
  std::vector<uint8_t> batch(workerPlan->batch[0].size() * rowBytes);
  const Status s = coded::shuffleReceiveEpoch(**worker, *workerShuffle, *workerPlan, true, *cache,
                                              rowBytes, batch, Deadline::afterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("another plan"), std::string::npos) << s;

  const Status wrongSize = coded::shuffleReceiveEpoch(**worker, *workerShuffle, *workerPlan, true,
                                                      *cache, rowBytes + 4, batch,
                                                      Deadline::afterMs(10000));
  EXPECT_EQ(wrongSize.code(), StatusCode::kInvalidArgument) << wrongSize;
  EXPECT_NE(wrongSize.message().find("rowBytes 68"), std::string::npos) << wrongSize;
}

// An upload to keys that still hold an unreleased upload with other bytes (a second shuffle of
// the same shape on the daemon, or a resumed job at an epoch it never released) is refused: the
// daemon used to take it for a resend of the finished round, ack it and keep the old rows, so
// workers decoded the old upload's messages with no error anywhere. A true resend (the same
// bytes) is still acknowledged.
TEST(CodedShuffleNet, ADifferentUploadToUnreleasedKeysIsRefused) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto master = coded::ShuffleEndpoint::connect(cluster.address(0), 1, Deadline::afterMs(10000));
  ASSERT_TRUE(master.ok()) << master.status();
  const std::vector<uint8_t> first(4 * 16, 1), second(4 * 16, 2);
  ASSERT_TRUE((*master)->upload(0, 500, first, 16, /*planTag=*/0, Deadline::afterMs(10000)).ok());
  EXPECT_TRUE((*master)->upload(0, 500, first, 16, /*planTag=*/0, Deadline::afterMs(10000)).ok())
      << "a resend of the same rows";
  auto other = (*master)->upload(0, 500, second, 16, /*planTag=*/0, Deadline::afterMs(10000));
  ASSERT_FALSE(other.ok()) << "other rows on keys that still hold an upload";
  EXPECT_NE(other.status().message().find("release"), std::string::npos) << other.status();
}

// An epoch may have up to 2^32 - 1 uploads, a daemon frees at most 2^24 keys per release
// request: the endpoint releases a larger range in pieces. It sent one request, the daemon
// refused it as malformed, and the epoch's slots stayed allocated.
TEST(CodedShuffleNet, AReleaseOfMoreKeysThanOneRequestTakesIsSplit) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto master = coded::ShuffleEndpoint::connect(cluster.address(0), 1, Deadline::afterMs(10000));
  ASSERT_TRUE(master.ok()) << master.status();
  const std::vector<uint8_t> rows(2 * 16, 3);
  ASSERT_TRUE((*master)->upload(0, 500, rows, 16, /*planTag=*/0, Deadline::afterMs(10000)).ok());
  const Status released =
      (*master)->release(500, ps::kMaxFanOutReleaseKeys + 1, Deadline::afterMs(60000));
  EXPECT_TRUE(released.ok()) << released;
  auto freed = cluster.metric(0, "cofab_agg_fanout_released_total");
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 2);
}

}  // namespace
}  // namespace cofab::testing
