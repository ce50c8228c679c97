// TransferManager against real cofab-aggd processes: the send order of every policy (observed
// in the manager's records), preemption at a chunk boundary, results equal to the serial sum
// (fusion and chunking included), deadlines and cancellation.
#include "fabric/transfer/transfer_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>

#include "tests/aggregator/daemon_cluster.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

using transfer::GradientUpdate;
using transfer::TransferHandle;
using transfer::TransferManager;
using transfer::TransferOptions;
using transfer::TransferRecord;

constexpr size_t kChunk = 4096;  // client chunk: 1024 f32 per unit

std::unique_ptr<ps::PushPullClient> connectOrDie(DaemonCluster& c, int rank) {
  ps::ClientOptions co;
  co.chunkBytes = kChunk;
  auto client = c.connect(rank, co);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(client).value() : nullptr;
}

// One daemon and one worker's client: what most tests here start from.
struct OneWorker {
  DaemonCluster cluster{1, 1};
  std::unique_ptr<ps::PushPullClient> client;
};
// nullptr, with the failure recorded, when the daemon or the client cannot start.
std::unique_ptr<OneWorker> startOneWorker() {
  auto w = std::make_unique<OneWorker>();
  const Status started = w->cluster.start();
  if (!started.ok()) {
    ADD_FAILURE() << started;
    return nullptr;
  }
  w->client = connectOrDie(w->cluster, 0);
  return w->client ? std::move(w) : nullptr;
}

std::unique_ptr<TransferManager> makeManager(ps::PushPullClient& client, TransferOptions o) {
  auto m = TransferManager::create(client, o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

// One daemon (rounds released after `roundTimeoutMs`) and two workers, each with a client and a
// manager of its options: what the cross-worker round tests start from. Destroyed managers first.
struct TwoWorkers {
  explicit TwoWorkers(int64_t roundTimeoutMs)
      : cluster(1, 2, {"--round-timeout-ms", std::to_string(roundTimeoutMs)}) {}
  DaemonCluster cluster;
  std::unique_ptr<ps::PushPullClient> c0, c1;
  std::unique_ptr<TransferManager> m0, m1;
};
// nullptr, with the failure recorded, when something cannot start.
std::unique_ptr<TwoWorkers> startTwoWorkers(int64_t roundTimeoutMs, const TransferOptions& o0,
                                            const TransferOptions& o1) {
  auto w = std::make_unique<TwoWorkers>(roundTimeoutMs);
  const Status started = w->cluster.start();
  if (!started.ok()) {
    ADD_FAILURE() << started;
    return nullptr;
  }
  w->c0 = connectOrDie(w->cluster, 0);
  w->c1 = connectOrDie(w->cluster, 1);
  if (!w->c0 || !w->c1) return nullptr;
  w->m0 = makeManager(*w->c0, o0);
  w->m1 = makeManager(*w->c1, o1);
  return w->m0 && w->m1 ? std::move(w) : nullptr;
}

// Integer-valued data: sums are exact in any order.
std::vector<float> gradient(uint64_t key, int rank, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(static_cast<int64_t>((key * 31 + i * 7 + rank * 13) % 41) - 20);
  }
  return g;
}

// An in-place f32 update of `key` over `v`.
GradientUpdate f32Update(uint64_t key, std::vector<float>& v) {
  GradientUpdate g;
  g.key = key;
  g.tensor = TensorView::of(v.data(), v.size(), DType::kF32);
  return g;
}

// Units in send order, each named by its first key and chunk.
std::vector<std::pair<uint64_t, uint32_t>> sendOrder(const std::vector<TransferRecord>& recs) {
  std::vector<const TransferRecord*> sent;
  for (const auto& r : recs) {
    if (r.sendIndex != ~0ull) sent.push_back(&r);
  }
  std::sort(sent.begin(), sent.end(), [](const TransferRecord* a, const TransferRecord* b) {
    return a->sendIndex < b->sendIndex;
  });
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (const auto* r : sent) out.emplace_back(r->keys.at(0), r->chunk);
  return out;
}

// Waits until `mgr` has sent `n` units (records), or fails the test after 20 s.
void waitForSends(TransferManager& mgr, size_t n) {
  const Deadline d = Deadline::afterMs(20000);
  while (sendOrder(mgr.records()).size() < n) {
    ASSERT_FALSE(d.expired()) << "only " << sendOrder(mgr.records()).size() << " of " << n
                              << " units sent";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

struct Queued {
  uint64_t key;
  size_t floats;
  int priority;
  int deadlineMs;  // 0: none
};

// Queues `updates` on a paused manager with `policy`, releases them, and returns the send order.
std::vector<std::pair<uint64_t, uint32_t>> runPaused(const std::string& policy,
                                                     const std::vector<Queued>& updates) {
  auto w = startOneWorker();
  if (!w) return {};
  auto& client = w->client;
  TransferOptions o;
  o.policy = policy;
  o.maxInFlight = 1;
  o.fuseBelowBytes = 1;  // no fusion: every unit is a chunk
  o.startPaused = true;
  auto mgr = makeManager(*client, o);
  if (!mgr) return {};
  std::vector<std::vector<float>> data;
  std::vector<TransferHandle> handles;
  for (const auto& q : updates) {
    data.push_back(gradient(q.key, 0, q.floats));
    GradientUpdate g;
    g.key = q.key;
    g.tensor = TensorView::of(data.back().data(), q.floats, DType::kF32);
    g.priority = q.priority;
    if (q.deadlineMs) g.deadline = Deadline::afterMs(q.deadlineMs);
    handles.push_back(mgr->enqueue(g));
  }
  mgr->resume();
  for (auto& h : handles) EXPECT_TRUE(h.wait(Deadline::afterMs(20000)).ok()) << h.status();
  return sendOrder(mgr->records());
}

// Three updates: A (2 chunks, layer 5, no deadline), B (1 chunk, layer 0, deadline +60 s),
// C (2 chunks, layer 2, deadline +30 s), queued in that order.
const std::vector<Queued> kThree = {{1, 2048, 5, 0}, {2, 1024, 0, 60000}, {3, 2048, 2, 30000}};

TEST(TransferOrdering, FifoSendsInEnqueueOrder) {
  const std::vector<std::pair<uint64_t, uint32_t>> want = {{1, 0}, {1, 1}, {2, 0}, {3, 0}, {3, 1}};
  EXPECT_EQ(runPaused("fifo", kThree), want);
}

TEST(TransferOrdering, PrioritySendsLowestLayerFirst) {
  const std::vector<std::pair<uint64_t, uint32_t>> want = {{2, 0}, {3, 0}, {3, 1}, {1, 0}, {1, 1}};
  EXPECT_EQ(runPaused("priority", kThree), want);
}

TEST(TransferOrdering, DeadlineSendsEarliestDeadlineFirst) {
  const std::vector<std::pair<uint64_t, uint32_t>> want = {{3, 0}, {3, 1}, {2, 0}, {1, 0}, {1, 1}};
  EXPECT_EQ(runPaused("deadline", kThree), want);
}

// Layer 0's update of key 7 must wait for the queued layer-5 update of the same key (a key's
// rounds go in order), so that one takes its urgency and goes first, before key 8's layer 3,
// instead of holding layer 0 back behind it. Which of the other two goes next depends on when
// the first result is back (key 7's second update waits for it).
TEST(TransferOrdering, AnUpdateLendsItsUrgencyToTheQueuedOneOfItsKey) {
  const auto order = runPaused("priority", {{7, 1024, 5, 0}, {8, 1024, 3, 0}, {7, 1024, 0, 0}});
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0].first, 7u) << "key 8 (layer 3) went before key 7's layers 5 and 0";
}

// A later, more urgent update overtakes a big one at the next chunk boundary: with a window of
// one, its first chunk is the very next unit sent after it was queued, its chunks go back to
// back, and the big one's remaining chunks follow. Under FIFO it waits for all of them.
class Preemption : public ::testing::TestWithParam<std::string> {};

TEST_P(Preemption, UrgentUpdateOvertakesAtTheNextChunkBoundary) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.policy = GetParam();
  o.maxInFlight = 1;
  o.fuseBelowBytes = 1;
  auto mgr = makeManager(*client, o);
  ASSERT_TRUE(mgr);
  // Many chunks: between the check below and pause() a descheduled test thread must not find
  // all of A gone (64 were seen to go on a loaded 2-core machine).
  const size_t bigChunks = 512;
  auto big = gradient(10, 0, bigChunks * 1024);
  auto urgent = gradient(11, 0, 4 * 1024);
  GradientUpdate a;
  a.key = 10;
  a.tensor = TensorView::of(big.data(), big.size(), DType::kF32);
  a.priority = 9;
  a.deadline = Deadline::afterMs(60000);
  TransferHandle ha = mgr->enqueue(a);
  // Let a few of A's chunks go, then stop the dispatcher so B surely arrives mid-A.
  for (int i = 0; i < 20000 && mgr->stats().chunksSent < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  mgr->pause();
  GradientUpdate b;
  b.key = 11;
  b.tensor = TensorView::of(urgent.data(), urgent.size(), DType::kF32);
  b.priority = 0;
  b.deadline = Deadline::afterMs(30000);
  TransferHandle hb = mgr->enqueue(b);
  mgr->resume();
  ASSERT_TRUE(ha.wait(Deadline::afterMs(20000)).ok()) << ha.status();
  ASSERT_TRUE(hb.wait(Deadline::afterMs(20000)).ok()) << hb.status();

  const auto recs = mgr->records();
  uint64_t bQueuedAt = 0;
  std::vector<uint64_t> bSent, aSent;
  for (const auto& r : recs) {
    if (r.keys[0] == 11) {
      bQueuedAt = r.sendsAtEnqueue;
      bSent.push_back(r.sendIndex);
    } else {
      aSent.push_back(r.sendIndex);
    }
  }
  std::sort(bSent.begin(), bSent.end());
  ASSERT_EQ(bSent.size(), 4u);
  ASSERT_GE(bQueuedAt, 3u);
  ASSERT_LT(bQueuedAt, bigChunks) << "A had finished before B was queued";
  if (GetParam() == "fifo") {
    EXPECT_EQ(bSent.front(), bigChunks) << "FIFO: B waits for all of A";
  } else {
    EXPECT_EQ(bSent.front(), bQueuedAt) << "B's first chunk is the next unit sent";
    EXPECT_EQ(bSent.back(), bQueuedAt + 3) << "B's chunks go back to back";
    EXPECT_GT(*std::max_element(aSent.begin(), aSent.end()), bSent.back());
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, Preemption, ::testing::Values("fifo", "priority", "deadline"),
                         [](const auto& info) { return info.param; });

// Three workers, two daemons, a mix of fused small updates and chunked large ones over two
// iterations, every policy: every worker's results equal the serial sum.
class TransferSums : public ::testing::TestWithParam<std::string> {};

TEST_P(TransferSums, ResultsEqualTheSerialSum) {
  const int kWorkers = 3;
  DaemonCluster cluster(2, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  const std::vector<size_t> sizes = {5, 300, 1000, 7000, 1, 64, 2500, 12000, 900, 33};
  // Earliest-deadline order is deadlock-free only when the workers agree on the deadlines
  // (docs/TRANSFER.md): one absolute base for every worker, as a job would derive it from its
  // step start, not each worker's own "now" (those differ by more than the 1 ms spacing).
  const Clock::time_point deadlineBase = Clock::now() + std::chrono::seconds(60);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    TransferOptions o;
    o.policy = GetParam();
    o.maxInFlight = 3;
    o.fuseBelowBytes = 2048;  // 5, 300, 1, 64, 33 floats are fused
    COFAB_ASSIGN_OR_RETURN(auto mgr, TransferManager::create(*client, o));
    for (uint64_t it = 0; it < 2; ++it) {
      std::vector<std::vector<float>> in(sizes.size()), out(sizes.size());
      std::vector<TransferHandle> hs;
      // Backward order: last layer first, as a training step produces them.
      for (size_t l = sizes.size(); l-- > 0;) {
        const uint64_t key = 100 + l;
        in[l] = gradient(key + it, rank, sizes[l]);
        out[l].assign(sizes[l], -1.0f);
        GradientUpdate g;
        g.key = key;
        g.tensor = TensorView::of(in[l].data(), sizes[l], DType::kF32);
        g.out = TensorView::of(out[l].data(), sizes[l], DType::kF32);
        g.iteration = it;
        g.priority = static_cast<int>(l);
        g.deadline = Deadline::at(deadlineBase + Millis(static_cast<int64_t>(l) + 10 * it));
        hs.push_back(mgr->enqueue(g));
      }
      mgr->flush();
      for (auto& h : hs) COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
      for (size_t l = 0; l < sizes.size(); ++l) {
        std::vector<float> want(sizes[l], 0.0f);
        for (int r = 0; r < kWorkers; ++r) {
          const auto g = gradient(100 + l + it, r, sizes[l]);
          for (size_t i = 0; i < sizes[l]; ++i) want[i] += g[i];
        }
        for (size_t i = 0; i < sizes[l]; ++i) {
          if (out[l][i] != want[i]) {
            return Internal("key " + std::to_string(100 + l) + " element " + std::to_string(i) +
                            ": got " + std::to_string(out[l][i]) + ", want " +
                            std::to_string(want[i]));
          }
        }
      }
    }
    const auto st = mgr->stats();
    if (st.bucketsSent == 0 || st.chunksSent == 0) {
      return Internal("expected both buckets and chunks to be sent");
    }
    if (st.updatesCompleted != 2 * sizes.size()) return Internal("not every update completed");
    return OkStatus();
  });
  EXPECT_TRUE(allOk(statuses).ok()) << allOk(statuses);
}

INSTANTIATE_TEST_SUITE_P(Policies, TransferSums, ::testing::Values("fifo", "priority", "deadline"),
                         [](const auto& info) { return info.param; });

// Two workers that picked in opposite orders, with room for one unit awaiting its result: worker
// 0 sent A before B existed, worker 1 had both queued and sent B (more urgent) first. Each one's
// outstanding unit waits for the other's; the bypass (a unit more urgent than every outstanding,
// acknowledged one may go) lets worker 0 send B, and both finish instead of deadlocking.
TEST(TransferWindow, OppositeOrdersOnTwoWorkersDoNotDeadlock) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto statuses = runThreadRanks(2, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    TransferOptions o;
    o.policy = "priority";
    o.maxInFlight = 1;
    o.maxOutstanding = 1;
    o.fuseBelowBytes = 1;
    o.startPaused = rank == 1;
    COFAB_ASSIGN_OR_RETURN(auto mgr, TransferManager::create(*client, o));
    auto a = gradient(1, rank, 1000), b = gradient(2, rank, 1000);
    GradientUpdate ga;
    ga.key = 1;
    ga.tensor = TensorView::of(a.data(), a.size(), DType::kF32);
    ga.priority = 5;
    GradientUpdate gb = ga;
    gb.key = 2;
    gb.tensor = TensorView::of(b.data(), b.size(), DType::kF32);
    gb.priority = 0;
    TransferHandle ha = mgr->enqueue(ga);
    if (rank == 0) {
      for (int i = 0; i < 20000 && mgr->stats().chunksSent < 1; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    TransferHandle hb = mgr->enqueue(gb);
    mgr->resume();
    COFAB_RETURN_IF_ERROR(ha.wait(Deadline::afterMs(20000)));
    COFAB_RETURN_IF_ERROR(hb.wait(Deadline::afterMs(20000)));
    const auto order = sendOrder(mgr->records());
    const std::vector<std::pair<uint64_t, uint32_t>> want =
        rank == 0 ? std::vector<std::pair<uint64_t, uint32_t>>{{1, 0}, {2, 0}}
                  : std::vector<std::pair<uint64_t, uint32_t>>{{2, 0}, {1, 0}};
    if (order != want) return Internal("unexpected send order on worker " + std::to_string(rank));
    return OkStatus();
  });
  EXPECT_TRUE(allOk(statuses).ok()) << allOk(statuses);
}

TEST(TransferDeadline, QueuedUpdatePastItsDeadlineIsDroppedNotHung) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.startPaused = true;  // nothing can be sent before the deadline
  o.fuseBelowBytes = 1;
  auto mgr = makeManager(*client, o);
  ASSERT_TRUE(mgr);
  auto data = gradient(1, 0, 3000);
  GradientUpdate g = f32Update(1, data);
  g.deadline = Deadline::afterMs(50);
  TransferHandle h = mgr->enqueue(g);
  const Status st = h.wait(Deadline::afterMs(20000));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("key=1"), std::string::npos) << st;
  mgr->resume();
  // The dropped chunks never travel; a later update still goes through.
  auto more = gradient(2, 0, 100);
  GradientUpdate g2;
  g2.key = 2;
  g2.tensor = TensorView::of(more.data(), more.size(), DType::kF32);
  ASSERT_TRUE(mgr->enqueue(g2).wait(Deadline::afterMs(20000)).ok());
  for (const auto& r : mgr->records()) {
    if (r.keys[0] == 1) {
      EXPECT_EQ(r.sendIndex, ~0ull) << r.name;
      EXPECT_EQ(r.outcome, "deadline_exceeded");
    }
  }
  EXPECT_EQ(mgr->stats().deadlinesMissed, 1u);
  // Every worker (here the only one) dropped key 1's round, and drops it once more (cancelled):
  // the daemon never sees either, and the key's next update goes through all the same
  // (consecutive drops use one round, which the daemon passes over when the next round's push
  // comes to an empty one). Rounds used up without that were refused beyond_window for good.
  mgr->pause();
  auto dropped = gradient(1, 0, 100);
  TransferHandle hc = mgr->enqueue(f32Update(1, dropped));
  ASSERT_TRUE(mgr->cancel(hc).ok());
  mgr->resume();
  auto again = gradient(1, 0, 100);
  const std::vector<float> want = again;  // one worker: the sum is its own gradient
  const Status next = mgr->enqueue(f32Update(1, again)).wait(Deadline::afterMs(20000));
  ASSERT_TRUE(next.ok()) << next;
  EXPECT_EQ(again, want);
}

TEST(TransferDeadline, SentUpdateWhoseRoundNeverCompletesFailsAtItsDeadline) {
  DaemonCluster cluster(1, 2);  // worker 1 never pushes: the round cannot complete
  ASSERT_TRUE(cluster.start().ok());
  auto client = connectOrDie(cluster, 0);
  ASSERT_TRUE(client);
  auto mgr = makeManager(*client, {});
  ASSERT_TRUE(mgr);
  auto data = gradient(1, 0, 100);
  GradientUpdate g = f32Update(1, data);
  g.deadline = Deadline::afterMs(300);
  TransferHandle h = mgr->enqueue(g);
  mgr->flush();
  // A shorter wait only ends the wait; the update keeps running.
  waitForSends(*mgr, 1);
  const Status early = h.wait(Deadline::afterMs(20));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.message().find("aggregator 0 round 0"), std::string::npos)
      << "the wait names whom the update waits for: " << early;
  EXPECT_EQ(h.status().code(), StatusCode::kUnavailable) << "still in progress";
  const Status st = h.wait(Deadline::afterMs(20000));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  EXPECT_EQ(h.status().code(), StatusCode::kDeadlineExceeded);  // fused: copied at enqueue
}

// A fused update's deadline fires while its bucket is still open (nothing else happens: no
// flush, no other update): the dispatcher used to sleep without a deadline to wake for, so a
// caller polling test() (or the stats) waited forever. Whether it had gone to sleep before the
// update came is a race (it sees the deadline if it looks after), so the test repeats the case,
// each time after an update there and back (the dispatcher then goes to sleep).
TEST(TransferDeadline, FusedUpdateInAnOpenBucketFailsAtItsDeadline) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  auto mgr = makeManager(*client, {});
  ASSERT_TRUE(mgr);
  constexpr uint64_t kRounds = 20;
  for (uint64_t i = 0; i < kRounds; ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    auto before = gradient(100 + i, 0, 10);
    GradientUpdate g = f32Update(100 + i, before);
    TransferHandle there = mgr->enqueue(g);
    mgr->flush();
    ASSERT_TRUE(there.wait(Deadline::afterMs(20000)).ok()) << there.status();
    auto data = gradient(i, 0, 10);
    g.key = i;
    g.tensor = TensorView::of(data.data(), data.size(), DType::kF32);
    g.deadline = Deadline::afterMs(20);
    TransferHandle h = mgr->enqueue(g);  // fused, in a bucket closed only by the next round
    const Deadline d = Deadline::afterMs(20000);
    while (!h.test() && !d.expired()) std::this_thread::sleep_for(Millis(1));
    ASSERT_TRUE(h.test()) << "the update still waits in its open bucket";
    EXPECT_EQ(h.status().code(), StatusCode::kDeadlineExceeded) << h.status();
  }
  EXPECT_EQ(mgr->stats().deadlinesMissed, kRounds);
}

// Cancelling an update whose chunk the client already has: the status is decided, but the
// handle completes only once that chunk is back (it reads the tensor and writes the result
// until then), so the caller never gets the tensor back while the client still uses it.
TEST(TransferCancel, ACancelledUpdateCompletesOnlyOnceItsSentChunkIsBack) {
  DaemonCluster cluster(1, 2);
  ASSERT_TRUE(cluster.start().ok());
  auto c0 = connectOrDie(cluster, 0), c1 = connectOrDie(cluster, 1);
  ASSERT_TRUE(c0 && c1);
  TransferOptions o;
  o.fuseBelowBytes = 1;
  auto m0 = makeManager(*c0, o), m1 = makeManager(*c1, o);
  ASSERT_TRUE(m0 && m1);
  auto d0 = gradient(7, 0, 1000), d1 = gradient(7, 1, 1000);
  GradientUpdate g = f32Update(7, d0);
  TransferHandle h0 = m0->enqueue(g);
  for (int i = 0; i < 20000 && m0->stats().chunksSent < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ASSERT_EQ(m0->stats().chunksSent, 1u);
  ASSERT_TRUE(m0->cancel(h0).ok());
  // Worker 1 has not pushed: the round is open and the chunk is with worker 0's client.
  EXPECT_EQ(h0.wait(Deadline::afterMs(200)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(h0.status().code(), StatusCode::kUnavailable) << "the tensor is still lent";
  g.tensor = TensorView::of(d1.data(), d1.size(), DType::kF32);
  TransferHandle h1 = m1->enqueue(g);
  ASSERT_TRUE(h1.wait(Deadline::afterMs(20000)).ok()) << h1.status();
  EXPECT_EQ(h0.wait(Deadline::afterMs(20000)).code(), StatusCode::kCancelled);
  EXPECT_EQ(m0->stats().updatesCancelled, 1u);
}

TEST(TransferCancel, QueuedUpdateIsCancelledAndNeverSent) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.startPaused = true;
  o.fuseBelowBytes = 1024;
  auto mgr = makeManager(*client, o);
  ASSERT_TRUE(mgr);
  auto a = gradient(1, 0, 5000), b = gradient(2, 0, 5000);
  auto s1 = gradient(3, 0, 10), s2 = gradient(4, 0, 10);
  // Results go to separate buffers holding a sentinel: one worker's sum is its own gradient, so
  // an in-place result would look like no result at all.
  const std::vector<float> sentinel(10, -1234.0f);
  std::vector<float> out1 = sentinel, out2 = sentinel;
  auto enqueue = [&](uint64_t key, std::vector<float>& v, std::vector<float>* out = nullptr) {
    GradientUpdate g = f32Update(key, v);
    if (out != nullptr) g.out = TensorView::of(out->data(), out->size(), DType::kF32);
    return mgr->enqueue(g);
  };
  TransferHandle ha = enqueue(1, a), hb = enqueue(2, b);
  TransferHandle hs1 = enqueue(3, s1, &out1), hs2 = enqueue(4, s2, &out2);  // one bucket
  mgr->flush();
  ASSERT_TRUE(mgr->cancel(ha).ok());
  ASSERT_TRUE(mgr->cancel(hs1).ok());
  EXPECT_EQ(ha.wait(Deadline::afterMs(1000)).code(), StatusCode::kCancelled);
  EXPECT_EQ(hs1.wait(Deadline::afterMs(1000)).code(), StatusCode::kCancelled);
  mgr->resume();
  ASSERT_TRUE(hb.wait(Deadline::afterMs(20000)).ok()) << hb.status();
  ASSERT_TRUE(hs2.wait(Deadline::afterMs(20000)).ok()) << hs2.status();
  EXPECT_EQ(out1, sentinel) << "a cancelled fused update gets no result";
  EXPECT_EQ(out2, s2) << "its bucket-mate does";
  EXPECT_EQ(mgr->cancel(hb).code(), StatusCode::kFailedPrecondition);
  for (const auto& r : mgr->records()) {
    if (r.keys[0] == 1) {
      EXPECT_EQ(r.sendIndex, ~0ull) << "cancelled chunks never travel";
    }
  }
  EXPECT_EQ(mgr->stats().updatesCancelled, 2u);
}

// Worker 0 cancels its first update of key 7; worker 1 sends its own. Worker 0's next update
// of key 7 used to carry the dropped one's round number (the client numbered only what was
// sent), so the daemon summed it into worker 1's first round and both got an OK, wrong result
// (110 = 100 + 10). Now a dropped update uses its round up: worker 0's second update belongs to
// round 1. Depending on which push reaches the daemon first, it is refused while worker 1's
// round 0 waits for worker 0, or the daemon passes over the empty round 0 and worker 1's first
// update is refused instead; then the two second updates meet in round 1 (1100). Either way
// the contract breach (docs/TRANSFER.md: drop only what every worker drops) is loud, and no
// round mixes two steps.
TEST(TransferCancel, AnUpdateOneWorkerDroppedDoesNotShiftItsLaterRounds) {
  TransferOptions o;
  o.fuseBelowBytes = 1;
  TransferOptions paused = o;
  paused.startPaused = true;
  auto w = startTwoWorkers(1000, paused, o);
  ASSERT_TRUE(w);
  auto &m0 = w->m0, &m1 = w->m1;
  std::vector<float> dropped(1000, 1), first1(1000, 10), second0(1000, 100), second1(1000, 1000);
  TransferHandle hd = m0->enqueue(f32Update(7, dropped));
  ASSERT_TRUE(m0->cancel(hd).ok());
  m0->resume();
  TransferHandle h1 = m1->enqueue(f32Update(7, first1));
  TransferHandle h0 = m0->enqueue(f32Update(7, second0));
  TransferHandle h2 = m1->enqueue(f32Update(7, second1));
  const Status s0 = h0.wait(Deadline::afterMs(20000));
  if (s0.ok()) {
    EXPECT_EQ(second0[0], 1100.0f) << "worker 0's second update met another round than round 1";
  }
  EXPECT_FALSE(h1.wait(Deadline::afterMs(20000)).ok()) << "round 0 lacks worker 0";
  const Status s2 = h2.wait(Deadline::afterMs(20000));
  if (s2.ok()) {
    EXPECT_EQ(second1[0], 1100.0f);
  }
}

// Worker 0 cancels the later of two queued updates of key 7 before either left its queue;
// worker 1 sends the first and drops the second after it. Rounds were numbered when a unit left
// the queue, so worker 0's dropped update took round 0 and its first one round 1, while worker
// 1's first went to round 0: round 0 waited for worker 0 and failed at the round timeout. Now
// a unit's round is its place among its key's units at enqueue, the same on every worker.
TEST(TransferCancel, CancellingTheLaterOfTwoQueuedUpdatesKeepsTheEarlierInItsRound) {
  TransferOptions o;
  o.fuseBelowBytes = 1;
  o.startPaused = true;
  auto w = startTwoWorkers(1000, o, o);
  ASSERT_TRUE(w);
  auto &m0 = w->m0, &m1 = w->m1;
  std::vector<float> a0(1000, 1), b0(1000, 100), a1(1000, 10), b1(1000, 1000);
  TransferHandle hA0 = m0->enqueue(f32Update(7, a0));
  TransferHandle hB0 = m0->enqueue(f32Update(7, b0));
  ASSERT_TRUE(m0->cancel(hB0).ok());
  m0->resume();
  TransferHandle hA1 = m1->enqueue(f32Update(7, a1));
  m1->resume();
  const Status s0 = hA0.wait(Deadline::afterMs(20000));
  const Status s1 = hA1.wait(Deadline::afterMs(20000));
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(a0[0], 11.0f);
  EXPECT_EQ(a1[0], 11.0f);
  m1->pause();
  TransferHandle hB1 = m1->enqueue(f32Update(7, b1));
  ASSERT_TRUE(m1->cancel(hB1).ok());
  m1->resume();
  // Both dropped round 1: the key's next updates meet in round 2.
  std::vector<float> c0v(1000, 5), c1v(1000, 50);
  TransferHandle hC0 = m0->enqueue(f32Update(7, c0v));
  TransferHandle hC1 = m1->enqueue(f32Update(7, c1v));
  ASSERT_TRUE(hC0.wait(Deadline::afterMs(20000)).ok()) << hC0.status();
  ASSERT_TRUE(hC1.wait(Deadline::afterMs(20000)).ok()) << hC1.status();
  EXPECT_EQ(c0v[0], 55.0f);
  EXPECT_EQ(c1v[0], 55.0f);
}

// A more urgent update of a key queued behind a less urgent one of the same key on worker 0,
// while worker 1 had already sent its less urgent one. The urgent one used to overtake and take
// round 0, where worker 1's other update was: both were summed together, every handle OK
// (110). A key's units now travel in their enqueue order; other keys still overtake.
TEST(TransferOrdering, AnUrgentUpdateDoesNotOvertakeAnEarlierOneOfItsOwnKey) {
  TransferOptions o;
  o.policy = "priority";
  o.fuseBelowBytes = 1;
  TransferOptions paused = o;
  paused.startPaused = true;
  auto w = startTwoWorkers(8000, paused, o);
  ASSERT_TRUE(w);
  auto &m0 = w->m0, &m1 = w->m1;
  std::vector<float> a0(1000, 1), b0(1000, 100), a1(1000, 10), b1(1000, 1000);
  GradientUpdate ga0 = f32Update(7, a0), gb0 = f32Update(7, b0);
  GradientUpdate ga1 = f32Update(7, a1), gb1 = f32Update(7, b1);
  ga0.priority = ga1.priority = 5;
  gb0.priority = gb1.priority = 0;
  TransferHandle hA0 = m0->enqueue(ga0);
  TransferHandle hB0 = m0->enqueue(gb0);
  TransferHandle hA1 = m1->enqueue(ga1);
  waitForSends(*m1, 1);
  TransferHandle hB1 = m1->enqueue(gb1);
  m0->resume();
  for (TransferHandle* h : {&hA0, &hB0, &hA1, &hB1}) {
    const Status s = h->wait(Deadline::afterMs(20000));
    ASSERT_TRUE(s.ok()) << "key 7: " << s;
  }
  EXPECT_EQ(a0[0], 11.0f);
  EXPECT_EQ(a1[0], 11.0f);
  EXPECT_EQ(b0[0], 1100.0f);
  EXPECT_EQ(b1[0], 1100.0f);
}

// A key queued again while its previous update is still on the wire (here a fused update past
// its deadline: its handle completes at once, its bucket goes on waiting for worker 1) waits
// for that round's result before it travels. It used to go at once, for the next round, which
// the daemon refuses while the earlier one is open (one round at a time per chunk): worker 0's
// second update failed, and worker 1's later waited for worker 0 until the round timeout.
TEST(TransferDeadline, AKeyQueuedAgainWhileItsPreviousRoundIsOpenWaitsForIt) {
  auto w = startTwoWorkers(8000, {}, {});
  ASSERT_TRUE(w);
  auto &m0 = w->m0, &m1 = w->m1;
  std::vector<float> a0(100, 1), b0(100, 100), a1(100, 10), b1(100, 1000);
  GradientUpdate late = f32Update(5, a0);  // small: fused
  late.deadline = Deadline::afterMs(200);
  TransferHandle hLate = m0->enqueue(late);
  m0->flush();
  EXPECT_EQ(hLate.wait(Deadline::afterMs(20000)).code(), StatusCode::kDeadlineExceeded);
  TransferHandle hB0 = m0->enqueue(f32Update(5, b0));
  m0->flush();
  // Worker 1 comes late to round 0, then sends round 1.
  TransferHandle hA1 = m1->enqueue(f32Update(5, a1));
  m1->flush();
  ASSERT_TRUE(hA1.wait(Deadline::afterMs(20000)).ok()) << hA1.status();
  EXPECT_EQ(a1[0], 11.0f) << "round 0 is worker 0's late update and worker 1's first";
  TransferHandle hB1 = m1->enqueue(f32Update(5, b1));
  m1->flush();
  const Status s0 = hB0.wait(Deadline::afterMs(20000));
  const Status s1 = hB1.wait(Deadline::afterMs(20000));
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(b0[0], 1100.0f);
  EXPECT_EQ(b1[0], 1100.0f);
}

// A handle is cancelled through its own manager only: another manager would touch its state
// under the wrong mutex.
TEST(TransferCancel, AHandleFromAnotherManagerIsRefused) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.startPaused = true;
  auto m0 = makeManager(*client, o);
  auto m1 = makeManager(*client, o);
  ASSERT_TRUE(m0 && m1);
  auto a = gradient(1, 0, 5000);
  GradientUpdate g = f32Update(1, a);
  TransferHandle h = m0->enqueue(g);
  EXPECT_EQ(m1->cancel(h).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.wait(Deadline::afterMs(20)).code(), StatusCode::kDeadlineExceeded) << "still queued";
  EXPECT_TRUE(m0->cancel(h).ok());
  EXPECT_EQ(h.wait(Deadline::afterMs(1000)).code(), StatusCode::kCancelled);
}

// maxRecords bounds the records even when none of them finishes (here: a paused manager);
// they used to be dropped only from the front once finished, so they grew without limit.
TEST(TransferRecords, TheBoundHoldsWhileNothingFinishes) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.startPaused = true;
  o.fuseBelowBytes = 1;  // every update is its own unit and record
  o.maxRecords = 4;
  auto mgr = makeManager(*client, o);
  ASSERT_TRUE(mgr);
  std::vector<std::vector<float>> data;
  std::vector<TransferHandle> handles;
  for (uint64_t k = 1; k <= 20; ++k) {
    data.push_back(gradient(k, 0, 16));
    GradientUpdate g = f32Update(k, data.back());
    handles.push_back(mgr->enqueue(g));
  }
  const auto recs = mgr->records();
  EXPECT_LE(recs.size(), 2 * o.maxRecords);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.back().keys.at(0), 20u) << "the newest are kept";
  mgr->resume();  // the units whose records went still travel and complete
  for (auto& h : handles) EXPECT_TRUE(h.wait(Deadline::afterMs(20000)).ok()) << h.status();
}

TEST(TransferCancel, DestroyingTheManagerCancelsWhatIsQueued) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.startPaused = true;
  auto mgr = makeManager(*client, o);
  ASSERT_TRUE(mgr);
  auto a = gradient(1, 0, 5000), s = gradient(2, 0, 4);
  GradientUpdate g = f32Update(1, a);
  TransferHandle ha = mgr->enqueue(g);
  g.key = 2;
  g.tensor = TensorView::of(s.data(), s.size(), DType::kF32);
  TransferHandle hs = mgr->enqueue(g);  // in an open bucket
  EXPECT_EQ(hs.wait(Deadline::afterMs(30)).code(), StatusCode::kDeadlineExceeded);
  mgr.reset();
  EXPECT_EQ(ha.wait(Deadline::afterMs(1000)).code(), StatusCode::kCancelled);
  EXPECT_EQ(hs.wait(Deadline::afterMs(1000)).code(), StatusCode::kCancelled);
}

// A fusion bucket is never larger than one wire chunk, with fuseBelowBytes above the chunk size
// (clamped to it): two updates that together exceed a chunk go in separate buckets, and one
// larger than a chunk is chunked, not fused. Buckets of up to bucketBytes + fuseBelowBytes used
// to travel as several wire chunks, outside the manager's ordering and windows.
TEST(TransferFusion, ABucketIsNeverLargerThanOneChunk) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions o;
  o.startPaused = true;
  o.fuseBelowBytes = 1 << 20;  // above the 4 KiB chunk
  auto mgr = makeManager(*client, o);
  ASSERT_TRUE(mgr);
  const std::vector<size_t> floats = {750, 750, 2500, 10};  // 3000, 3000, 10000, 40 bytes
  std::vector<std::vector<float>> data, out;
  for (size_t k = 0; k < floats.size(); ++k) {
    data.push_back(gradient(k + 1, 0, floats[k]));
    out.emplace_back(floats[k], -1234.0f);  // a sentinel: results must replace it
  }
  std::vector<TransferHandle> handles;
  for (size_t k = 0; k < floats.size(); ++k) {
    GradientUpdate g = f32Update(k + 1, data[k]);
    g.out = TensorView::of(out[k].data(), out[k].size(), DType::kF32);
    handles.push_back(mgr->enqueue(g));
  }
  mgr->flush();
  mgr->resume();
  for (size_t k = 0; k < floats.size(); ++k) {
    ASSERT_TRUE(handles[k].wait(Deadline::afterMs(20000)).ok()) << handles[k].status();
    // One worker: the sum is its own gradient, scattered out of the bucket into out.
    EXPECT_EQ(out[k], data[k]) << "key " << k + 1;
  }
  for (const auto& r : mgr->records()) EXPECT_LE(r.bytes, kChunk) << r.name;
}

TEST(TransferManagerArgs, BadInputCompletesTheHandleAtOnce) {
  auto w = startOneWorker();
  ASSERT_TRUE(w);
  auto& client = w->client;
  TransferOptions bad;
  bad.policy = "random";
  EXPECT_EQ(TransferManager::create(*client, bad).status().code(), StatusCode::kInvalidArgument);
  auto mgr = makeManager(*client, {});
  ASSERT_TRUE(mgr);
  std::vector<int32_t> ints(10);
  GradientUpdate g;
  g.key = 1;
  g.tensor = TensorView::of(ints.data(), ints.size(), DType::kI32);
  const Status st = mgr->enqueue(g).wait(Deadline::afterMs(1000));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  std::vector<float> f(10), out(11);
  g.tensor = TensorView::of(f.data(), f.size(), DType::kF32);
  g.out = TensorView::of(out.data(), out.size(), DType::kF32);
  EXPECT_EQ(mgr->enqueue(g).wait(Deadline::afterMs(1000)).code(), StatusCode::kInvalidArgument);
  // `out` one chunk (1024 f32) past `tensor`: every chunk is its own pushPull with disjoint
  // slices, so the client's own check passed while chunk c's result overwrote chunk c + 1's
  // input before it went out, and the update completed OK with a wrong sum.
  const size_t perChunk = kChunk / sizeof(float);
  std::vector<float> shared = gradient(9, 0, 4 * perChunk);
  const std::vector<float> before = shared;
  g.tensor = TensorView::of(shared.data(), 3 * perChunk, DType::kF32);
  g.out = TensorView::of(shared.data() + perChunk, 3 * perChunk, DType::kF32);
  const Status overlap = mgr->enqueue(g).wait(Deadline::afterMs(10000));
  EXPECT_EQ(overlap.code(), StatusCode::kInvalidArgument) << overlap;
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos) << overlap;
  EXPECT_EQ(shared, before) << "nothing was written";
}

}  // namespace
}  // namespace cofab::testing
