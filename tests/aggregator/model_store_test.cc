// The model store (docs/MODEL_STORE.md) on real cofab-aggd processes: init/pull/apply against a
// serial reference, the SSP staleness bound under random per-worker delays (returned staleness
// and the daemon's histogram), deferral that really blocks a fast worker and releases it, drops
// reported with a reason, leave() releasing the others, EASGD elastic math, and a killed worker
// that stops holding the others back after the dead-worker deadline.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "fabric/ps/model_client.h"
#include "fabric/ps/placement.h"
#include "fabric/ps/push_pull.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/model_store_test_util.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/support/process_group.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

using ps::ApplyOutcome;
using ps::ApplyResult;
using ps::ModelClient;

// Values that sum exactly in f32 in any order (multiples of 1/8, small), so the result of
// concurrent applies has one right answer.
std::vector<float> delta(size_t n, int rank, int t) {
  std::vector<float> d(n);
  for (size_t i = 0; i < n; ++i) {
    d[i] = static_cast<float>(
               static_cast<int>(
                   (i * 7 + static_cast<size_t>(rank) * 13 + static_cast<size_t>(t) * 5) % 17) -
               8) /
           8.0f;
  }
  return d;
}

double sumMetric(DaemonCluster& c, const std::string& name, const std::string& label = "") {
  double total = 0;
  for (int s = 0; s < c.servers(); ++s) {
    auto v = c.metric(s, name, label);
    EXPECT_TRUE(v.ok()) << v.status();
    if (v.ok()) total += *v;
  }
  return total;
}

TEST(ModelStore, InitPullApplyMatchASerialReference) {
  const int kWorkers = 3, kSteps = 5;
  const size_t kCount = 1000;  // 16 chunks of 64 floats over 2 daemons
  DaemonCluster cluster(2, kWorkers, {"--staleness", "100"});
  ASSERT_TRUE(cluster.start().ok());
  std::vector<float> w0(kCount);
  for (size_t i = 0; i < kCount; ++i) w0[i] = static_cast<float>(i % 11) - 5.0f;
  std::vector<std::vector<float>> finals(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto mc, connectModel(cluster, rank, 256));
    // The same worker also runs push-pull on its own client at the same time.
    COFAB_ASSIGN_OR_RETURN(auto pp, cluster.connect(rank));
    std::vector<float> init = w0;
    COFAB_RETURN_IF_ERROR(mc->init(1, view(init), kLong()));
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> d = delta(kCount, rank, t);
      COFAB_ASSIGN_OR_RETURN(ApplyResult r,
                             mc->apply(1, view(d), static_cast<uint64_t>(t), kLong()));
      if (r.outcome != ApplyOutcome::kApplied) return Internal("update dropped");
      std::vector<float> g(10, 1.0f);
      COFAB_RETURN_IF_ERROR(pp->pushPull(9, view(g), view(g)).wait(kLong()));
      if (g[0] != kWorkers)
        return Internal("push-pull next to the model store: " + std::to_string(g[0]));
    }
    pp->close();
    mc->close();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  auto reader = connectModel(cluster, 0, 256);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> got(kCount);
  auto version = (*reader)->pull(1, view(got), kLong());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, static_cast<uint64_t>(kWorkers * kSteps));
  std::vector<float> want = w0;
  for (int r = 0; r < kWorkers; ++r) {
    for (int t = 0; t < kSteps; ++t) {
      const auto d = delta(kCount, r, t);
      for (size_t i = 0; i < kCount; ++i) want[i] += d[i];
    }
  }
  EXPECT_EQ(got, want);
  const size_t chunks = ps::chunkLayout(kCount, 4, 256).chunkCount;
  EXPECT_EQ(sumMetric(cluster, "cofab_agg_model_applied_total"),
            static_cast<double>(chunks * kWorkers * kSteps));
  EXPECT_EQ(sumMetric(cluster, "cofab_agg_model_inits_total"), static_cast<double>(chunks))
      << "only the first init of each chunk sets it";
}

TEST(ModelStore, FirstInitWinsAndBadRequestsSayWhy) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto a = connectModel(cluster, 0);
  auto b = connectModel(cluster, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> first{1, 2, 3}, second{7, 8, 9}, out(3);
  ASSERT_TRUE((*a)->init(5, view(first), kLong()).ok());
  ASSERT_TRUE((*b)->init(5, view(second), kLong()).ok());
  auto v = (*b)->pull(5, view(out), kLong());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 0u);
  EXPECT_EQ(out, first);
  std::vector<float> wrong(4);
  Status st = (*b)->init(5, view(wrong), kLong());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("wrong_size"), std::string::npos) << st;
  EXPECT_NE(st.message().find("key=5"), std::string::npos) << st;
  // A pull into a tensor of another size than the key's is the caller's mistake, not data lost
  // on the way: InvalidArgument saying both sizes (it used to be DataLoss).
  auto wrongPull = (*b)->pull(5, view(wrong), kLong());
  EXPECT_EQ(wrongPull.status().code(), StatusCode::kInvalidArgument) << wrongPull.status();
  EXPECT_NE(wrongPull.status().message().find("holds 3 floats"), std::string::npos)
      << wrongPull.status();
  auto missing = (*a)->pull(6, view(out), kLong());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("init first"), std::string::npos) << missing.status();
  std::vector<double> f64(3);
  EXPECT_EQ((*a)->pull(5, TensorView::of(f64.data(), 3, DType::kF64), kLong()).status().code(),
            StatusCode::kInvalidArgument);
  auto r = (*a)->apply(5, view(first), 0, kLong());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 1u);
  ASSERT_TRUE((*b)->pull(5, view(out), kLong()).ok());
  EXPECT_EQ(out, (std::vector<float>{2, 4, 6}));
}

// Random per-worker delays, one worker much slower: every applied update's staleness (returned
// and in the daemon's histogram) stays within tau, and the final value is the exact sum.
TEST(ModelStore, StalenessBoundHoldsUnderRandomDelays) {
  const int kWorkers = 4, kSteps = 12, kTau = 2;
  const size_t kCount = 300;
  DaemonCluster cluster(2, kWorkers, {"--staleness", std::to_string(kTau)});
  ASSERT_TRUE(cluster.start().ok());
  std::vector<float> w0(kCount, 0.0f);
  std::vector<uint64_t> worst(kWorkers, 0);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(auto mc, connectModel(cluster, rank, 512));
    std::vector<float> w = w0;
    COFAB_RETURN_IF_ERROR(mc->init(3, view(w), kLong()));
    std::mt19937 rng(static_cast<uint32_t>(rank) * 77 + 1);
    std::uniform_int_distribution<int> ms(0, rank == 3 ? 25 : 6);
    for (int t = 0; t < kSteps; ++t) {
      COFAB_RETURN_IF_ERROR(mc->pull(3, view(w), kLong()).status());
      std::this_thread::sleep_for(std::chrono::milliseconds(ms(rng)));
      std::vector<float> d = delta(kCount, rank, t);
      COFAB_ASSIGN_OR_RETURN(ApplyResult r,
                             mc->apply(3, view(d), static_cast<uint64_t>(t), kLong()));
      if (r.outcome != ApplyOutcome::kApplied) return Internal("a live worker's update dropped");
      worst[static_cast<size_t>(rank)] = std::max(worst[static_cast<size_t>(rank)], r.staleness);
    }
    return OkStatus();  // close() on destruction: a finished worker leaves, holding no one back
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  for (int r = 0; r < kWorkers; ++r) EXPECT_LE(worst[static_cast<size_t>(r)], kTau) << r;
  expectDaemonStalenessWithin(cluster, kTau);
  EXPECT_EQ(sumMetric(cluster, "cofab_agg_model_dropped_total"), 0);
  const size_t chunks = ps::chunkLayout(kCount, 4, 512).chunkCount;
  EXPECT_EQ(sumMetric(cluster, "cofab_agg_model_applied_total"),
            static_cast<double>(chunks * kWorkers * kSteps));
  auto reader = connectModel(cluster, 0, 512);
  ASSERT_TRUE(reader.ok());
  std::vector<float> got(kCount), want(kCount, 0.0f);
  ASSERT_TRUE((*reader)->pull(3, view(got), kLong()).ok());
  for (int r = 0; r < kWorkers; ++r) {
    for (int t = 0; t < kSteps; ++t) {
      const auto d = delta(kCount, r, t);
      for (size_t i = 0; i < kCount; ++i) want[i] += d[i];
    }
  }
  EXPECT_EQ(got, want);
}

TEST(ModelStore, DeferralBlocksTheFastWorkerUntilTheSlowOneCatchesUp) {
  DaemonCluster cluster(1, 2, {"--staleness", "1"});
  ASSERT_TRUE(cluster.start().ok());
  auto fast = connectModel(cluster, 0);
  auto slow = connectModel(cluster, 1);
  ASSERT_TRUE(fast.ok() && slow.ok());
  std::vector<float> x{0, 0};
  ASSERT_TRUE((*fast)->init(4, view(x), kLong()).ok());
  std::vector<float> one{1, 1}, ten{10, 10};
  // Clock 0 is answered at once: computing clock 1 needs nobody's updates (1 - tau = 0 clocks).
  auto r0 = (*fast)->apply(4, view(one), 0, kLong());
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(r0->outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(r0->staleness, 0u);
  // Clock 1 is applied, but its answer (after which the fast worker would compute clock 2)
  // waits until the slow worker's clock 0 is in: SSP's read bound. The call blocks.
  auto held = std::async(std::launch::async, [&] {
    std::vector<float> d{1, 1};
    return (*fast)->apply(4, view(d), 1, kLong());
  });
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_model_deferred_now", 1).ok());
  EXPECT_EQ(held.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "the fast worker must wait while its answer is held";
  std::vector<float> out(2);
  auto v = (*slow)->pull(4, view(out), kLong());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2u) << "the held update is applied; only its answer waits";
  // The slow worker's clock 0 releases the answer.
  auto r = (*slow)->apply(4, view(ten), 0, kLong());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(r->staleness, 1u);  // the fast worker's clock 1 went in before it
  auto released = held.get();
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(released->version, 2u);  // the version its apply made
  EXPECT_EQ(released->staleness, 1u);
  // A deadline while held names the worker it waits for; the update was applied regardless.
  auto timedOut = (*fast)->apply(4, view(one), 2, Deadline::afterMs(1000));
  ASSERT_EQ(timedOut.status().code(), StatusCode::kDeadlineExceeded) << timedOut.status();
  EXPECT_NE(timedOut.status().message().find("waits for worker 1"), std::string::npos)
      << timedOut.status();
  ASSERT_TRUE((*slow)->apply(4, view(ten), 1, kLong()).ok());
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_model_deferred_now", 0).ok());
  ASSERT_TRUE((*slow)->pull(4, view(out), kLong()).ok());
  EXPECT_EQ(out, (std::vector<float>{23, 23}));  // 3 * 1 + 2 * 10
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_model_deferred_total"), 2);
}

// Clocks that skip (a job resumed at a later step, a key updated every few steps): both workers
// jump from clock 0 to 3 with tau = 1. Each used to be deferred behind the other's last applied
// clock 0, forever. A worker's update held here now counts as where that worker is.
TEST(ModelStore, ClocksThatSkipAheadDoNotDeferEachOtherForever) {
  TwoWorkers w({"--staleness", "1"});
  ASSERT_TRUE(w.start().ok());
  auto& a = w.a;
  auto& b = w.b;
  std::vector<float> x{0};
  ASSERT_TRUE(a->init(8, view(x), kLong()).ok());
  std::vector<float> one{1}, ten{10};
  ASSERT_TRUE(a->apply(8, view(one), 0, kLong()).ok());
  ASSERT_TRUE(b->apply(8, view(ten), 0, kLong()).ok());
  auto first = std::async(std::launch::async, [&] {
    std::vector<float> d{1};
    return a->apply(8, view(d), 3, Deadline::afterMs(10000));
  });
  ASSERT_TRUE(w.cluster.waitMetric(0, "cofab_agg_model_deferred_now", 1).ok());
  auto second = b->apply(8, view(ten), 3, Deadline::afterMs(10000));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->outcome, ApplyOutcome::kApplied);
  auto got = first.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->outcome, ApplyOutcome::kApplied);
  ASSERT_TRUE(w.cluster.waitMetric(0, "cofab_agg_model_deferred_now", 0).ok());
  std::vector<float> out(1);
  ASSERT_TRUE(a->pull(8, view(out), kLong()).ok());
  EXPECT_EQ(out[0], 22.0f);
}

// A worker that gives up waiting on a deferred update and goes on with its next clock, while
// the other one stays stalled: its held updates used to pile up, each with its delta, without
// bound. Past 16 of them, further ones are dropped with the reason.
TEST(ModelStore, HeldUpdatesOfOneWorkerAreBounded) {
  TwoWorkers w({"--staleness", "0"});
  ASSERT_TRUE(w.start().ok());
  std::vector<float> x{0};
  ASSERT_TRUE(w.a->init(11, view(x), kLong()).ok());
  std::vector<float> one{1};
  ASSERT_TRUE(w.a->apply(11, view(one), 0, Deadline::afterMs(200)).status().code() ==
              StatusCode::kDeadlineExceeded);  // answered only once worker 1's clock 0 is in
  // Clocks 1..16 are deferred (more than 0 ahead of worker 1, which sends nothing).
  for (int c = 1; c <= 16; ++c) {
    auto r = w.a->apply(11, view(one), static_cast<uint64_t>(c), Deadline::afterMs(100));
    ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << c << ": " << r.status();
  }
  ASSERT_TRUE(w.cluster.waitMetric(0, "cofab_agg_model_deferred_now", 17).ok());
  auto over = w.a->apply(11, view(one), 17, kLong());
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->outcome, ApplyOutcome::kDropped);
  EXPECT_EQ(*w.cluster.metric(0, "cofab_agg_model_deferred_now"), 17);
}

// tau = 0 is BSP: a worker's answer for clock c comes only once every live worker's clock c is
// in, so the pull that follows it (the model it computes clock c+1 on) holds all of them.
TEST(ModelStore, StalenessZeroIsBulkSynchronous) {
  TwoWorkers w({"--staleness", "0"});
  ASSERT_TRUE(w.start().ok());
  auto& a = w.a;
  auto& b = w.b;
  std::vector<float> x{0};
  ASSERT_TRUE(a->init(6, view(x), kLong()).ok());
  std::vector<float> one{1}, ten{10};
  // Worker 1 has not sent its clock 0: worker 0's answer waits, however long.
  auto early = a->apply(6, view(one), 0, Deadline::afterMs(500));
  ASSERT_EQ(early.status().code(), StatusCode::kDeadlineExceeded) << early.status();
  auto r = b->apply(6, view(ten), 0, kLong());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(r->staleness, 0u);
  ASSERT_TRUE(w.cluster.waitMetric(0, "cofab_agg_model_deferred_now", 0).ok());
  std::vector<float> out(1);
  ASSERT_TRUE(a->pull(6, view(out), kLong()).ok());
  EXPECT_EQ(out[0], 11.0f);  // both clock-0 updates
}

TEST(ModelStore, TooStaleUpdatesAreDroppedWithAReason) {
  DaemonCluster cluster(1, 2, {"--staleness", "1"});
  ASSERT_TRUE(cluster.start().ok());
  auto a = connectModel(cluster, 0);
  ASSERT_TRUE(a.ok());
  std::vector<float> x{0}, one{1};
  ASSERT_TRUE((*a)->init(8, view(x), kLong()).ok());
  {
    auto b = connectModel(cluster, 1);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE((*b)->apply(8, view(one), 0, kLong()).ok());
    (*b)->close();  // leaves: no longer holds worker 0 back
  }
  for (uint64_t t = 0; t < 6; ++t) {
    auto r = (*a)->apply(8, view(one), t, kLong());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outcome, ApplyOutcome::kApplied) << "worker 1 left; nothing to wait for";
  }
  // Worker 1 comes back with an update computed at clock 1: 4 clocks behind worker 0's 5.
  auto b = connectModel(cluster, 1);
  ASSERT_TRUE(b.ok());
  auto late = (*b)->apply(8, view(one), 1, kLong());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->outcome, ApplyOutcome::kDropped);
  EXPECT_EQ(late->staleness, 4u);
  // A clock that does not advance is dropped too.
  auto again = (*a)->apply(8, view(one), 5, kLong());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, ApplyOutcome::kDropped);
  std::vector<float> out(1);
  auto v = (*a)->pull(8, view(out), kLong());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7u);
  EXPECT_EQ(out[0], 7.0f) << "dropped updates are not applied";
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_model_dropped_total"), 2);
  // Resynchronised to a clock within the bound, it is applied again.
  auto resync = (*b)->apply(8, view(one), 5, kLong());
  ASSERT_TRUE(resync.ok());
  EXPECT_EQ(resync->outcome, ApplyOutcome::kApplied);
}

// --max-chunk-bytes allows up to 1 GiB, but an apply-and-pull answers with the chunk behind a
// kModelApplyReplyBytes record in one message: a model chunk whose answer could not be one
// message is refused when it arrives, with a reason, instead of failing the worker's connection
// at the answer. The daemon keeps serving that connection.
TEST(ModelStore, AChunkWhoseAnswerCannotBeOneMessageIsOversized) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer makes byte copies ~50x slower: a 1 GiB message would take "
                  "minutes (the plain and ASan suites run this case)";
#endif
  DaemonCluster cluster(1, 1, {"--max-chunk-bytes", std::to_string(wire::kDefaultMaxPayload)});
  ASSERT_TRUE(cluster.start().ok());
  auto w = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w.ok()) << w.status();
  wire::Header h = RawPeer::control(ps::ControlOp::kModelInit, 0, 3, DType::kF32);
  // Within --max-chunk-bytes and the wire's limit, a whole number of f32, yet 4 bytes too many
  // for the answer's record.
  const size_t bytes = wire::kDefaultMaxPayload - ps::kModelApplyReplyBytes + sizeof(float);
  const Status sent = (*w)->send(h, std::vector<uint8_t>(bytes), 60000);
  ASSERT_TRUE(sent.ok()) << sent;
  auto m = (*w)->recvSkippingAcks();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->isReject(ps::RejectReason::kOversized))
      << m->header.describe() << " " << m->text();
  EXPECT_NE(m->text().find("at most"), std::string::npos) << m->text();
  auto counted = cluster.metric(0, "cofab_agg_rejects_total", "reason=\"oversized\"");
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(*counted, 1);
  // The same connection still works: a small init is taken and its value pulled back.
  std::vector<float> x{1, 2};
  h.key = 4;
  ASSERT_TRUE((*w)->sendValues(h, x).ok());
  auto ok = (*w)->recvSkippingAcks();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->isControl(ps::ControlOp::kReject)) << ok->text();
}

// leave() without close(): a worker done applying (waiting at a barrier, say) stops holding the
// others back at once, and its later requests still work.
TEST(ModelStore, LeaveReleasesTheOthersWithoutClosing) {
  DaemonCluster cluster(1, 2, {"--staleness", "1"});
  ASSERT_TRUE(cluster.start().ok());
  auto a = connectModel(cluster, 0);
  auto b = connectModel(cluster, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> x{0}, one{1};
  ASSERT_TRUE((*a)->init(6, view(x), kLong()).ok());
  ASSERT_TRUE((*b)->apply(6, view(one), 0, kLong()).ok());
  (*b)->leave();  // at clock 0: without this, a's clock 3 would be held (3 - 1 > tau)
  for (uint64_t t = 0; t < 6; ++t) {
    auto r = (*a)->apply(6, view(one), t, kLong());
    ASSERT_TRUE(r.ok()) << "clock " << t << ": " << r.status();
    EXPECT_EQ(r->outcome, ApplyOutcome::kApplied);
  }
  std::vector<float> out(1);
  auto v = (*b)->pull(6, view(out), kLong());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(out[0], 7.0f);
}

TEST(ModelStore, ElasticStepsMatchTheEasgdDefinition) {
  const size_t kCount = 700;  // several chunks
  DaemonCluster cluster(2, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto a = connectModel(cluster, 0, 256);
  auto b = connectModel(cluster, 1, 256);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> center(kCount), x0(kCount), x1(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    center[i] = static_cast<float>(i) * 0.01f;
    x0[i] = std::sin(static_cast<float>(i));
    x1[i] = std::cos(static_cast<float>(i)) * 3.0f;
  }
  std::vector<float> init = center;
  ASSERT_TRUE((*a)->init(11, view(init), kLong()).ok());
  const float alpha = 0.25f;
  std::vector<float> d0(kCount);
  ASSERT_TRUE((*a)->elastic(11, view(x0), alpha, view(d0), kLong()).ok());
  std::vector<float> d1 = x1;  // diffOut aliasing x is allowed
  ASSERT_TRUE((*b)->elastic(11, view(d1), alpha, view(d1), kLong()).ok());
  // Serial reference: d = alpha * (x - center); center += d, worker 0 then worker 1.
  for (size_t i = 0; i < kCount; ++i) {
    const float e0 = alpha * (x0[i] - center[i]);
    center[i] += e0;
    ASSERT_FLOAT_EQ(d0[i], e0) << i;
    const float e1 = alpha * (x1[i] - center[i]);
    center[i] += e1;
    ASSERT_FLOAT_EQ(d1[i], e1) << i;
  }
  std::vector<float> got(kCount);
  auto v = (*a)->pull(11, view(got), kLong());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2u);
  for (size_t i = 0; i < kCount; ++i) ASSERT_FLOAT_EQ(got[i], center[i]) << i;
  EXPECT_EQ((*a)->elastic(11, view(x0), 1.5f, view(d0), kLong()).code(),
            StatusCode::kInvalidArgument);
}

// A worker process killed (SIGKILL, no goodbye) holds the others back (their updates are deferred
// behind it) only until the daemons' dead-worker deadline; then they run to the end.
TEST(ModelStore, KilledWorkerStopsBlockingAfterTheDeadWorkerDeadline) {
  DaemonCluster cluster(1, 3, {"--staleness", "1", "--dead-worker-ms", "400"});
  ASSERT_TRUE(cluster.start().ok());
  ProcessGroup pg;  // forked before this test creates any thread
  const int child = pg.spawn([&]() -> int {
    auto mc = connectModel(cluster, 2);
    if (!mc.ok()) return childFail(2, mc.status().toString());
    std::vector<float> x(64, 0.0f);
    if (Status st = (*mc)->init(21, view(x), kLong()); !st.ok()) return childFail(2, st.toString());
    auto r = (*mc)->apply(21, view(x), 0, kLong());
    if (!r.ok()) return childFail(2, r.status().toString());
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until killed
  });
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_model_applied_total", 1).ok());
  auto workers = std::async(std::launch::async, [&] {
    return runThreadRanks(2, [&](int rank) -> Status {
      COFAB_ASSIGN_OR_RETURN(auto mc, connectModel(cluster, rank));
      std::vector<float> d(64, 1.0f);
      for (uint64_t t = 0; t < 6; ++t) {
        COFAB_ASSIGN_OR_RETURN(ApplyResult r, mc->apply(21, view(d), t, kLong()));
        if (r.outcome != ApplyOutcome::kApplied) {
          return Internal("dropped at clock " + std::to_string(t));
        }
      }
      return OkStatus();
    });
  });
  // Clock 3 is 2 ahead of the child (at clock 1): both workers are held behind it.
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_model_deferred_now", 2).ok());
  pg.signal(child, SIGKILL);
  pg.wait(child, kLong());
  const auto statuses = workers.get();
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  // At least the two held behind the child; the two threads may also hold each other back
  // (staleness 1 between them too), which depends on scheduling.
  EXPECT_GE(*cluster.metric(0, "cofab_agg_model_deferred_total"), 2);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_workers_lost_total"), 1);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_model_applied_total"), 13);
}

}  // namespace
}  // namespace cofab::testing
