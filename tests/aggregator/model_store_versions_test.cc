// The model store's version-bounded apply-and-pull (docs/MODEL_STORE.md "Staleness units") on
// real cofab-aggd processes: the applied staleness never exceeds --version-staleness under random
// per-worker delays (returned, and in the daemons' histogram), and every applied update, and no
// dropped one, is in the final value; a stale update is dropped, reported and answered with the
// current value; a fast worker is never blocked by a stopped one; apply-and-pull needs a pull
// first and refuses a version from the future; one that cannot send all of its updates sends
// none of them.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "fabric/ps/model_client.h"
#include "fabric/ps/placement.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/model_store_test_util.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

using ps::ApplyOutcome;
using ps::ApplyResult;
using ps::ModelClient;
using ps::ModelUpdate;

// One key's apply-and-pull.
StatusOr<ApplyResult> applyPull(ModelClient& mc, uint64_t key, std::vector<float>& delta,
                                std::vector<float>& out) {
  ModelUpdate u{key, view(delta), view(out)};
  COFAB_ASSIGN_OR_RETURN(std::vector<ApplyResult> rs, mc.applyAndPull({&u, 1}, kLong()));
  return rs.at(0);
}

// Random per-worker delays, worker 3 much slower, a small bound, three keys of one chunk each
// (spread over both daemons) in one apply-and-pull per step: updates get dropped, and
// (a) no applied update's staleness exceeds the bound (returned, and in the daemons' histogram),
// (b) each key's final value is exactly the number of updates reported applied (every delta is 1):
//     an applied update lost, or a dropped one applied, would show.
TEST(ModelStoreVersions, AppliedStalenessNeverExceedsTheBoundUnderRandomDelays) {
  const int kWorkers = 4, kSteps = 40, kTau = 2, kKeys = 3;
  const size_t kCount = 100;
  DaemonCluster cluster(2, kWorkers, {"--version-staleness", std::to_string(kTau)});
  ASSERT_TRUE(cluster.start().ok());
  std::vector<uint64_t> worst(kWorkers, 0);
  std::vector<std::vector<uint64_t>> applied(kWorkers, std::vector<uint64_t>(kKeys, 0));
  std::vector<uint64_t> dropped(kWorkers, 0);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    const auto r = static_cast<size_t>(rank);
    COFAB_ASSIGN_OR_RETURN(auto mc, connectModel(cluster, rank));
    std::vector<std::vector<float>> w(kKeys, std::vector<float>(kCount, 0.0f)), d = w;
    for (int k = 0; k < kKeys; ++k) {
      COFAB_RETURN_IF_ERROR(mc->init(uint64_t(k), view(w[size_t(k)]), kLong()));
      COFAB_RETURN_IF_ERROR(mc->pull(uint64_t(k), view(w[size_t(k)]), kLong()).status());
    }
    std::mt19937 rng(static_cast<uint32_t>(rank) * 31 + 7);
    std::uniform_int_distribution<int> ms(0, rank == 3 ? 30 : 4);
    for (int t = 0; t < kSteps; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms(rng)));
      std::vector<ModelUpdate> updates;
      for (int k = 0; k < kKeys; ++k) {
        d[size_t(k)].assign(kCount, 1.0f);
        updates.push_back(ModelUpdate{uint64_t(k), view(d[size_t(k)]), view(w[size_t(k)])});
      }
      COFAB_ASSIGN_OR_RETURN(std::vector<ApplyResult> rs, mc->applyAndPull(updates, kLong()));
      if (rs.size() != size_t(kKeys)) return Internal("one result per update expected");
      for (int k = 0; k < kKeys; ++k) {
        const ApplyResult& res = rs[size_t(k)];
        if (res.chunks != 1) return Internal("a key of one chunk expected");
        if (res.outcome == ApplyOutcome::kDropped) {
          if (res.droppedChunks != 1 || res.dropReason.empty() || res.staleness <= kTau) {
            return Internal("a drop without its chunk, reason or staleness > tau: " +
                            res.dropReason);
          }
          dropped[r]++;
          continue;
        }
        applied[r][size_t(k)]++;
        worst[r] = std::max(worst[r], res.staleness);
        // The answer is the value after this update: at least everything applied so far.
        if (w[size_t(k)][0] < float(applied[r][size_t(k)])) return Internal("stale answer");
      }
    }
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  for (int r = 0; r < kWorkers; ++r) EXPECT_LE(worst[static_cast<size_t>(r)], kTau) << r;
  double appliedTotal = 0, droppedTotal = 0;
  expectDaemonStalenessWithin(cluster, kTau);
  for (int s = 0; s < cluster.servers(); ++s) {
    appliedTotal += *cluster.metric(s, "cofab_agg_model_applied_total");
    droppedTotal += *cluster.metric(s, "cofab_agg_model_dropped_total");
  }
  uint64_t workerDropped = 0;
  for (uint64_t n : dropped) workerDropped += n;
  EXPECT_EQ(droppedTotal, double(workerDropped)) << "every drop is reported to its worker";
  RecordProperty("dropped_updates", std::to_string(workerDropped));  // how much the bound bit
  EXPECT_EQ(appliedTotal + droppedTotal, double(kKeys * kWorkers * kSteps));
  auto reader = connectModel(cluster, 0);
  ASSERT_TRUE(reader.ok());
  for (int k = 0; k < kKeys; ++k) {
    uint64_t want = 0;
    for (int r = 0; r < kWorkers; ++r) want += applied[size_t(r)][size_t(k)];
    std::vector<float> got(kCount);
    auto version = (*reader)->pull(uint64_t(k), view(got), kLong());
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, want) << "key " << k << ": one version per applied update";
    EXPECT_EQ(got, std::vector<float>(kCount, float(want))) << "key " << k;
  }
}

// A worker reads version 0, another applies three updates, then the first sends its update
// computed on version 0 with a bound of 2: dropped, reported (staleness 3, reason), answered
// with the current value; its next update, based on that answer, is applied.
TEST(ModelStoreVersions, AStaleUpdateIsDroppedReportedAndAnsweredWithTheCurrentValue) {
  TwoWorkers w({"--version-staleness", "2"});
  ASSERT_TRUE(w.start().ok());
  auto& a = w.a;
  auto& b = w.b;
  std::vector<float> wa{0, 0}, wb{0, 0};
  ASSERT_TRUE(a->init(9, view(wa), kLong()).ok());
  ASSERT_TRUE(a->pull(9, view(wa), kLong()).ok());
  ASSERT_TRUE(b->pull(9, view(wb), kLong()).ok());
  for (int i = 0; i < 3; ++i) {
    std::vector<float> one{1, 1};
    auto r = applyPull(*b, 9, one, wb);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, ApplyOutcome::kApplied);
    EXPECT_EQ(r->staleness, 0u) << "b always works on the newest value";
    EXPECT_EQ(r->version, uint64_t(i + 1));
  }
  std::vector<float> hundred{100, 100};
  auto late = applyPull(*a, 9, hundred, wa);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->outcome, ApplyOutcome::kDropped);
  EXPECT_EQ(late->staleness, 3u);
  EXPECT_EQ(late->droppedChunks, 1u);
  EXPECT_NE(late->dropReason.find("bound 2"), std::string::npos) << late->dropReason;
  EXPECT_EQ(wa, (std::vector<float>{3, 3})) << "the answer carries the current value";
  EXPECT_EQ(*w.cluster.metric(0, "cofab_agg_model_dropped_total"), 1);
  std::vector<float> ten{10, 10};
  auto next = applyPull(*a, 9, ten, wa);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(next->staleness, 0u);
  EXPECT_EQ(wa, (std::vector<float>{13, 13})) << "the dropped 100 was never added";
}

// Worker 1 pulls and then stops (connected, silent). Clock-based SSP with tau 1 would hold
// worker 0 after two clocks; by versions nothing waits: worker 0 applies 30 updates, each
// answered (a held apply would never be, and fail at the deadline). Worker 1's update, 30
// versions old, is then dropped.
TEST(ModelStoreVersions, AFastWorkerIsNotBlockedByAStoppedOne) {
  DaemonCluster cluster(1, 2, {"--staleness", "1", "--version-staleness", "4"});
  ASSERT_TRUE(cluster.start().ok());
  auto fast = connectModel(cluster, 0);
  auto stopped = connectModel(cluster, 1);
  ASSERT_TRUE(fast.ok() && stopped.ok());
  std::vector<float> wf(8, 0.0f), ws(8, 0.0f);
  ASSERT_TRUE((*fast)->init(4, view(wf), kLong()).ok());
  ASSERT_TRUE((*fast)->pull(4, view(wf), kLong()).ok());
  ASSERT_TRUE((*stopped)->pull(4, view(ws), kLong()).ok());
  for (int t = 0; t < 30; ++t) {
    std::vector<float> one(8, 1.0f);
    ModelUpdate u{4, view(one), view(wf)};
    auto r = (*fast)->applyAndPull({&u, 1}, kLong());
    ASSERT_TRUE(r.ok()) << "step " << t << ": " << r.status();
    EXPECT_EQ(r->at(0).outcome, ApplyOutcome::kApplied);
  }
  EXPECT_EQ(wf, std::vector<float>(8, 30.0f));
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_model_deferred_total"), 0);
  std::vector<float> one(8, 1.0f);
  auto late = applyPull(**stopped, 4, one, ws);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->outcome, ApplyOutcome::kDropped);
  EXPECT_EQ(late->staleness, 30u);
  EXPECT_EQ(ws, std::vector<float>(8, 30.0f));
}

// Apply-and-pull without a known version is refused on the client; a version from the future
// (another client's) is refused by the daemon, saying why.
TEST(ModelStoreVersions, NeedsAPullFirstAndRefusesAVersionFromTheFuture) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto a = connectModel(cluster, 0);
  auto b = connectModel(cluster, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> w{0}, one{1};
  ASSERT_TRUE((*a)->init(2, view(w), kLong()).ok());
  auto noBase = applyPull(**b, 2, one, w);
  EXPECT_EQ(noBase.status().code(), StatusCode::kFailedPrecondition) << noBase.status();
  ASSERT_TRUE((*a)->pull(2, view(w), kLong()).ok());
  ASSERT_TRUE(applyPull(**a, 2, one, w).ok());
  ASSERT_TRUE(applyPull(**a, 2, one, w).ok());  // a's base is now version 2
  // The key with another size: a's remembered versions are for one chunk of 1 float... the
  // layout is the same (one chunk), so the daemon says the size is wrong.
  std::vector<float> two{0, 0};
  auto wrongSize = applyPull(**a, 2, two, two);
  EXPECT_EQ(wrongSize.status().code(), StatusCode::kInvalidArgument) << wrongSize.status();
  // A hand-made request claiming version 7 of a chunk at version 2.
  auto raw = RawPeer::connect(cluster.address(0), ps::workerPeerId(1));
  ASSERT_TRUE(raw.ok()) << raw.status();
  const wire::Header h = RawPeer::control(ps::ControlOp::kModelApplyPull, 1, 2, DType::kF32, 7);
  ASSERT_TRUE((*raw)->sendValues(h, std::vector<float>{1.0f}).ok());
  auto answer = (*raw)->recv();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->isReject(ps::RejectReason::kMalformed)) << answer->header.describe();
  EXPECT_NE(answer->text().find("version 7"), std::string::npos) << answer->text();
  std::vector<float> now{0};
  auto v = (*a)->pull(2, view(now), kLong());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2u);
  EXPECT_EQ(now[0], 2.0f) << "the refused update was not applied";
}

// An applyAndPull one of whose updates cannot go (key 2 was never pulled on this client) is
// refused before any request is sent. Before the fix key 1's update went out first: it was
// applied and its `out` written, yet the caller got only the error, and the natural retry (pull
// key 2, run the step again) applied key 1's update twice.
TEST(ModelStoreVersions, ARefusedApplyAndPullAppliesNoneOfItsUpdates) {
  DaemonCluster cluster(1, 1);
  ASSERT_TRUE(cluster.start().ok());
  auto mc = connectModel(cluster, 0);
  ASSERT_TRUE(mc.ok()) << mc.status();
  std::vector<float> w1{1, 2, 3}, w2{4, 5, 6};
  ASSERT_TRUE((*mc)->init(1, view(w1), kLong()).ok());
  ASSERT_TRUE((*mc)->init(2, view(w2), kLong()).ok());
  std::vector<float> got1(3, 0.0f);
  auto pulled = (*mc)->pull(1, view(got1), kLong());  // key 1 only
  ASSERT_TRUE(pulled.ok()) << pulled.status();

  std::vector<float> d1(3, 10.0f), d2(3, 10.0f), out1(3, -7.0f), out2(3, -7.0f);
  const std::vector<ModelUpdate> updates{{1, view(d1), view(out1)}, {2, view(d2), view(out2)}};
  auto refused = (*mc)->applyAndPull(updates, kLong());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("key=2"), std::string::npos) << refused.status();
  EXPECT_EQ(out1, std::vector<float>(3, -7.0f)) << "key 1's update went out";
  EXPECT_EQ(out2, std::vector<float>(3, -7.0f));
  std::vector<float> now(3, 0.0f);
  auto v = (*mc)->pull(1, view(now), kLong());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 0u) << "key 1's update was applied by the refused step";
  EXPECT_EQ(now, w1);

  // The retry after pulling key 2 applies each update once.
  std::vector<float> got2(3, 0.0f);
  ASSERT_TRUE((*mc)->pull(2, view(got2), kLong()).ok());
  auto retried = (*mc)->applyAndPull(updates, kLong());
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(out1, (std::vector<float>{11, 12, 13}));
  EXPECT_EQ(out2, (std::vector<float>{14, 15, 16}));
  auto after = (*mc)->pull(1, view(now), kLong());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, 1u);
  (*mc)->close();
}

}  // namespace
}  // namespace cofab::testing
