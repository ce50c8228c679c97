// Central scheduling (MLfabric's request -> grant -> delivered, cofab-sched): TransferManagers
// on threads-as-workers, real cofab-aggd daemons, and the scheduler in process (to read its
// counters) or as a real cofab-sched process (to kill it). Checks: a destination's granted and
// undelivered bytes never exceed the configured budget (on the scheduler) and the daemons'
// receive backlog stays within it (on the aggregators); every unit is granted and delivered
// exactly once; results equal the serial sum; pacing spaces the grants; a killed scheduler is a
// clear error naming it, and a stopped one a DeadlineExceeded, never a hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "core/param.h"
#include "fabric/transfer/central_scheduler.h"
#include "fabric/transfer/sched_client.h"
#include "fabric/transfer/transfer_manager.h"
#include "fabric/transport/registry.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/support/process_group.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

constexpr size_t kChunk = 16 << 10;
constexpr uint64_t kDestBytes = 32 << 10;  // two chunks per daemon at a time, job-wide

float valueOf(size_t i, int rank, int it, uint64_t key) {
  return static_cast<float>((i + static_cast<size_t>(rank) * 3 + static_cast<size_t>(it) + key) %
                            13);
}

// One iteration of `keys` updates (sizes from 1 KiB, fused, to 80 KiB, 5 chunks) through a
// manager in central mode; checks every result against the serial sum.
Status runIteration(transfer::TransferManager& mgr, int rank, int workers, int it) {
  const std::vector<size_t> counts = {256, 20480, 1024, 12288, 4096, 20000};
  std::vector<std::vector<float>> grads(counts.size());
  std::vector<transfer::TransferHandle> hs;
  for (size_t k = 0; k < counts.size(); ++k) {
    grads[k].resize(counts[k]);
    for (size_t i = 0; i < counts[k]; ++i) grads[k][i] = valueOf(i, rank, it, k);
    transfer::GradientUpdate g;
    g.key = 100 + k;
    g.tensor = TensorView::of(grads[k].data(), counts[k], DType::kF32);
    g.iteration = static_cast<uint64_t>(it);
    g.priority = static_cast<int>(k);
    hs.push_back(mgr.enqueue(g));
  }
  mgr.flush();
  for (size_t k = 0; k < counts.size(); ++k) {
    COFAB_RETURN_IF_ERROR(hs[k].wait(Deadline::afterMs(20000)));
    for (size_t i = 0; i < counts[k]; ++i) {
      float want = 0;
      for (int r = 0; r < workers; ++r) want += valueOf(i, r, it, k);
      if (grads[k][i] != want) {
        return Internal("key " + std::to_string(100 + k) + " element " + std::to_string(i) +
                        " differs from the serial sum");
      }
    }
  }
  return OkStatus();
}

TEST(CentralScheduler, GrantsAreNeverExceededEveryUnitOnceResultsExact) {
  const int kWorkers = 4, kServers = 2;
  DaemonCluster cluster(kServers, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  transfer::SchedulerOptions so;
  so.numDestinations = kServers;
  so.destBytes = kDestBytes;
  so.listenAddress = "127.0.0.1:0";
  auto sched = transfer::CentralScheduler::create(so);
  ASSERT_TRUE(sched.ok()) << sched.status();
  ASSERT_TRUE(cluster.store()
                  .set(transfer::schedulerAddressKey("cofab/sched"),
                       Bytes((*sched)->address().begin(), (*sched)->address().end()))
                  .ok());

  std::vector<transfer::TransferStats> mstats(kWorkers);
  std::vector<transfer::SchedClientStats> cstats(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    COFAB_ASSIGN_OR_RETURN(auto sc, transfer::SchedClient::connect(cluster.store(), rank));
    transfer::TransferOptions o;
    o.scheduler = sc.get();
    o.fuseBelowBytes = 8 << 10;
    o.maxInFlight = 3;
    o.policy = "priority";
    COFAB_ASSIGN_OR_RETURN(auto mgr, transfer::TransferManager::create(*client, o));
    for (int it = 0; it < 2; ++it) COFAB_RETURN_IF_ERROR(runIteration(*mgr, rank, kWorkers, it));
    mstats[static_cast<size_t>(rank)] = mgr->stats();
    mgr.reset();
    cstats[static_cast<size_t>(rank)] = sc->stats();
    return OkStatus();
  });
  ASSERT_TRUE(allOk(statuses).ok()) << allOk(statuses);

  // Deliveries travel asynchronously after the results: wait (bounded) until all arrived.
  uint64_t units = 0;
  std::vector<uint64_t> unitsTo(kServers, 0);
  for (const auto& m : mstats) {
    units += m.chunksSent + m.bucketsSent;
    for (int d = 0; d < kServers; ++d) unitsTo[d] += m.destinations[d].unitsSent;
  }
  const Deadline settle = Deadline::afterMs(10000);
  transfer::SchedulerStats st;
  for (;;) {
    st = (*sched)->stats();
    uint64_t delivered = 0;
    for (const auto& d : st.destinations) delivered += d.delivered;
    if (delivered >= units || settle.expired()) break;
    std::this_thread::sleep_for(Millis(10));
  }
  EXPECT_EQ(st.protocolErrors, 0u);
  for (int d = 0; d < kServers; ++d) {
    const auto& ds = st.destinations[static_cast<size_t>(d)];
    EXPECT_GT(ds.granted, 0u) << "daemon " << d;
    EXPECT_EQ(ds.granted, unitsTo[d]) << "daemon " << d << ": one grant per unit sent to it";
    EXPECT_EQ(ds.delivered, ds.granted) << "daemon " << d;
    EXPECT_EQ(ds.released, 0u) << "daemon " << d;
    EXPECT_EQ(ds.load, 0u) << "daemon " << d;
    EXPECT_LE(ds.maxGrant, kDestBytes);
    EXPECT_LE(ds.maxLoad, kDestBytes) << "daemon " << d << ": budget exceeded on the scheduler";
    // 4 workers x 3 in flight = 12 chunks wanted, 2 allowed: requests had to queue.
    EXPECT_GT(ds.maxQueued, 0u) << "daemon " << d;
    // The aggregator's side: what it received and had not consumed yet never exceeded the
    // budget (a grant is returned only after the daemon acknowledged, i.e. consumed, the unit).
    auto backlog = cluster.metric(d, "cofab_agg_backlog_max_bytes");
    ASSERT_TRUE(backlog.ok()) << backlog.status();
    EXPECT_GT(*backlog, 0.0);
    EXPECT_LE(*backlog, static_cast<double>(kDestBytes)) << "daemon " << d;
  }
  for (int r = 0; r < kWorkers; ++r) {
    const auto& c = cstats[static_cast<size_t>(r)];
    const auto& m = mstats[static_cast<size_t>(r)];
    EXPECT_EQ(c.requests, m.chunksSent + m.bucketsSent) << "worker " << r;
    EXPECT_EQ(c.grants, c.requests) << "worker " << r;
    EXPECT_EQ(c.delivered, c.grants) << "worker " << r;
  }
}

// An in-process scheduler on loopback (pacing at `rate` bytes/s, 0: none), and the options to
// reach it.
StatusOr<std::unique_ptr<transfer::CentralScheduler>> localScheduler(int destinations,
                                                                     uint64_t destBytes,
                                                                     uint64_t rate = 0) {
  transfer::SchedulerOptions so;
  so.numDestinations = destinations;
  so.destBytes = destBytes;
  so.rateBytesPerSec = rate;
  so.listenAddress = "127.0.0.1:0";
  return transfer::CentralScheduler::create(so);
}
transfer::SchedClientOptions reach(const transfer::CentralScheduler& sched) {
  transfer::SchedClientOptions co;
  co.address = sched.address();
  return co;
}

// After the client failed over from daemon 0 to its backup, the units placed on daemon 0 go
// to daemon 1, and their grants are booked there: booked against the dead daemon, daemon 1's
// load went unaccounted (its budget could be exceeded) while daemon 0's queue kept granting.
TEST(CentralScheduler, AfterAFailoverGrantsAreBookedAgainstTheBackup) {
  DaemonCluster cluster(2, 1, {"--replication", "on"});
  ASSERT_TRUE(cluster.start().ok());
  auto sched = localScheduler(2, kDestBytes);
  ASSERT_TRUE(sched.ok()) << sched.status();
  ps::ClientOptions co;
  co.chunkBytes = kChunk;
  co.replication = 1;
  auto client = cluster.connect(0, co);
  ASSERT_TRUE(client.ok()) << client.status();
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  transfer::TransferOptions o;
  o.scheduler = sc->get();
  o.fuseBelowBytes = 1;
  auto mgr = transfer::TransferManager::create(**client, o);
  ASSERT_TRUE(mgr.ok()) << mgr.status();
  // 8 chunks: both daemons get some by placement (checked below, on the fault-free iteration).
  std::vector<float> g(8 * kChunk / sizeof(float), 1.0f);
  auto once = [&] {
    transfer::GradientUpdate u;
    u.key = 11;
    u.tensor = TensorView::of(g.data(), g.size(), DType::kF32);
    return (*mgr)->enqueue(u).wait(Deadline::afterMs(20000));
  };
  ASSERT_TRUE(once().ok());
  const transfer::TransferStats before = (*mgr)->stats();
  ASSERT_GT(before.destinations[0].unitsSent, 0u);
  ASSERT_GT(before.destinations[1].unitsSent, 0u);
  cluster.signal(0, SIGKILL);
  const Deadline noticed = Deadline::afterMs(20000);
  while ((*client)->stats().failovers == 0) {
    ASSERT_FALSE(noticed.expired()) << "the client never failed over from daemon 0";
    std::this_thread::sleep_for(Millis(2));
  }
  ASSERT_TRUE(once().ok());
  const transfer::TransferStats after = (*mgr)->stats();
  EXPECT_EQ(after.destinations[0].unitsSent, before.destinations[0].unitsSent);
  EXPECT_EQ(after.destinations[1].unitsSent, before.destinations[1].unitsSent + 8);
  const std::vector<transfer::TransferRecord> recs = (*mgr)->records();
  ASSERT_EQ(recs.size(), 16u);
  for (size_t i = 8; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].destination, 1) << recs[i].name << ": its record names where it went";
  }
  // The scheduler granted daemon 1 one grant per unit that went there, and no more to daemon 0.
  const uint64_t granted0 = before.destinations[0].unitsSent;
  const Deadline settle = Deadline::afterMs(10000);
  transfer::SchedulerStats st;
  do {
    st = (*sched)->stats();
    if (st.destinations[0].delivered + st.destinations[1].delivered == 16) break;
    std::this_thread::sleep_for(Millis(2));
  } while (!settle.expired());
  EXPECT_EQ(st.destinations[0].granted, granted0);
  EXPECT_EQ(st.destinations[1].granted, 16 - granted0);
}

// A store that answers every call with the same failure (its server gone).
class FailingStore final : public Store {
 public:
  explicit FailingStore(Status st) : st_(std::move(st)) {}
  Status set(std::string_view, const Bytes&) override { return st_; }
  StatusOr<Bytes> get(std::string_view, Deadline) override { return st_; }
  StatusOr<int64_t> add(std::string_view, int64_t) override { return st_; }
  Status wait(const std::vector<std::string>&, Deadline) override { return st_; }
  StatusOr<Bytes> compareSet(std::string_view, const Bytes&, const Bytes&) override { return st_; }
  StatusOr<bool> remove(std::string_view) override { return st_; }
  StatusOr<bool> check(const std::vector<std::string>&) override { return st_; }
  std::string describe() const override { return "failing://"; }

 private:
  Status st_;
};

// Finding the scheduler's address: a store that fails is reported as that failure, not as a
// scheduler that did not register in time (every store error used to become DeadlineExceeded).
TEST(CentralScheduler, AFailingStoreIsNotReportedAsAnUnregisteredScheduler) {
  FailingStore gone(Unavailable("the store server is gone"));
  auto sc = transfer::SchedClient::connect(gone, 0);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), StatusCode::kUnavailable) << sc.status();
  EXPECT_NE(sc.status().message().find("cofab-sched"), std::string::npos) << sc.status();
  FailingStore slow(DeadlineExceeded("timed out waiting for the key"));
  auto late = transfer::SchedClient::connect(slow, 0);
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_NE(late.status().message().find("did not register"), std::string::npos) << late.status();
}

TEST(CentralScheduler, GrantsArePacedAtTheConfiguredRate) {
  auto sched = localScheduler(1, 1 << 20, 1000000);  // 100 kB take 100 ms
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  const auto start = Clock::now();
  for (int i = 0; i < 4; ++i) {
    auto g = (*sc)->acquire(0, 100000, Deadline::afterMs(10000));
    ASSERT_TRUE(g.ok()) << g.status();
    (*sc)->delivered(*g);
  }
  // Not a performance threshold: the 4th grant may start no earlier than 3 x 100 kB at 1 MB/s
  // after the first, whatever the machine's speed.
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_GT((*sc)->stats().pacedUs, 0);
  // A request for a destination that does not exist is refused, not queued forever.
  auto bad = (*sc)->acquire(5, 100, Deadline::afterMs(10000));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
}

// An explicit rate of 0 (cofab-sched --rate 0) turns pacing off even where COFAB_SCHED_RATE
// sets one; only an unset rate takes the environment's. 0 used to mean "the environment's", so
// --rate 0 was overridden by the variable.
TEST(CentralScheduler, AnExplicitZeroRateIsUnpacedWhateverTheEnvironmentSays) {
  ScopedParamOverride env("COFAB_SCHED_RATE", "1000");  // 100 kB would take 100 s
  transfer::SchedulerOptions so;
  so.listenAddress = "127.0.0.1:0";
  auto fromEnv = transfer::CentralScheduler::create(so);
  ASSERT_TRUE(fromEnv.ok()) << fromEnv.status();
  EXPECT_EQ((*fromEnv)->stats().rateBytesPerSec, 1000u);
  so.rateBytesPerSec = 0;
  auto sched = transfer::CentralScheduler::create(so);
  ASSERT_TRUE(sched.ok()) << sched.status();
  EXPECT_EQ((*sched)->stats().rateBytesPerSec, 0u);
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  for (int i = 0; i < 2; ++i) {  // paced, the second would start 100 s after the first
    auto g = (*sc)->acquire(0, 100000, Deadline::afterMs(30000));
    ASSERT_TRUE(g.ok()) << "grant " << i << ": " << g.status();
    (*sc)->delivered(*g);
  }
}

// A grant whose pacing ends after the caller's deadline is given back at once and fails: the
// caller used to sleep until its deadline first, holding the scheduler's bytes all that time.
// A request without a deadline is refused before anything is sent.
TEST(CentralScheduler, AGrantPacedPastTheDeadlineIsGivenBackAtOnce) {
  auto sched = localScheduler(1, 1 << 20, 1000);  // 100 kB take 100 s
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  auto first = (*sc)->acquire(0, 100000, Deadline::afterMs(30000));  // starts now
  ASSERT_TRUE(first.ok()) << first.status();
  (*sc)->delivered(*first);
  const Deadline deadline = Deadline::afterMs(30000);
  auto second = (*sc)->acquire(0, 100000, deadline);  // would start 100 s from now
  EXPECT_EQ(second.status().code(), StatusCode::kDeadlineExceeded) << second.status();
  EXPECT_NE(second.status().message().find("after the deadline"), std::string::npos)
      << second.status();
  EXPECT_FALSE(deadline.expired()) << "refused without waiting the deadline out";
  // Both grants came back: nothing stays counted as in flight at the scheduler.
  for (int i = 0; i < 100; ++i) {
    const auto ds = (*sched)->stats().destinations.at(0);
    if (ds.delivered == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto ds = (*sched)->stats().destinations.at(0);
  EXPECT_EQ(ds.granted, 2u);
  EXPECT_EQ(ds.delivered, 2u);
  EXPECT_EQ(ds.load, 0u);
  auto never = (*sc)->acquire(0, 100, Deadline::never());
  EXPECT_EQ(never.status().code(), StatusCode::kInvalidArgument) << never.status();
  EXPECT_EQ((*sched)->stats().destinations.at(0).granted, 2u) << "nothing was requested";
}

// Grants given back unused (paced past their deadline) give their pacing slot back too. They
// used to push the destination's pacing clock on by a full slot each, so a burst of refusals
// ran it seconds ahead of real time and every later request failed "after the deadline".
TEST(CentralScheduler, AGrantGivenBackUnusedReturnsItsPacingSlot) {
  auto sched = localScheduler(1, 1 << 20, 1000);  // 1000 B take 1 s
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  auto first = (*sc)->acquire(0, 1000, Deadline::afterMs(30000));  // starts now, busy 1 s
  ASSERT_TRUE(first.ok()) << first.status();
  (*sc)->delivered(*first);
  for (int i = 0; i < 10; ++i) {  // each would start 1 s or more from now
    auto refused = (*sc)->acquire(0, 1000, Deadline::afterMs(500));
    EXPECT_EQ(refused.status().code(), StatusCode::kDeadlineExceeded) << refused.status();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the first slot is over
  auto later = (*sc)->acquire(0, 100, Deadline::afterMs(500));
  ASSERT_TRUE(later.ok()) << later.status() << " (the pacing clock ran ahead)";
  (*sc)->delivered(*later);
}

TEST(CentralScheduler, GrantGoesToTheLeastLoadedCandidateExactlyOnce) {
  auto sched = localScheduler(2, 100);
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  auto get = [&](std::vector<int> cands, uint64_t bytes) {
    auto g = (*sc)->acquire(cands, bytes, Deadline::afterMs(10000));
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : transfer::SchedGrant{};
  };
  const auto g1 = get({0}, 60);     // load 60 | 0
  const auto g2 = get({0, 1}, 30);  // -> 1: load 60 | 30
  const auto g3 = get({0, 1}, 30);  // -> 1: load 60 | 60
  const auto g4 = get({0, 1}, 30);  // tie -> 0: load 90 | 60
  EXPECT_EQ(g1.destination, 0);
  EXPECT_EQ(g2.destination, 1);
  EXPECT_EQ(g3.destination, 1);
  EXPECT_EQ(g4.destination, 0);
  // Neither has room for 50 now: the request waits in both queues, and is granted once, by the
  // first destination that gets room.
  transfer::SchedGrant g5;
  std::thread waiter([&] { g5 = get({0, 1}, 50); });
  const Deadline queued = Deadline::afterMs(10000);
  while (!queued.expired()) {
    const auto st = (*sched)->stats();
    if (st.destinations[0].queued + st.destinations[1].queued == 2) break;
    std::this_thread::sleep_for(Millis(2));
  }
  (*sc)->delivered(g2);  // load 90 | 30: the waiting request goes to 1
  waiter.join();
  EXPECT_EQ(g5.destination, 1);
  for (const auto& g : {g1, g3, g4, g5}) (*sc)->delivered(g);
  const Deadline settle = Deadline::afterMs(10000);
  transfer::SchedulerStats st;
  do {
    st = (*sched)->stats();
    if (st.destinations[0].delivered + st.destinations[1].delivered == 5) break;
    std::this_thread::sleep_for(Millis(2));
  } while (!settle.expired());
  EXPECT_EQ(st.destinations[0].granted, 2u);
  EXPECT_EQ(st.destinations[1].granted, 3u);
  EXPECT_EQ(st.destinations[0].delivered, 2u);
  EXPECT_EQ(st.destinations[1].delivered, 3u);
  EXPECT_EQ(st.destinations[0].load + st.destinations[1].load, 0u);
  EXPECT_LE(st.destinations[0].maxLoad, 100u);
  EXPECT_LE(st.destinations[1].maxLoad, 100u);
  EXPECT_EQ(st.protocolErrors, 0u);
  // A delivery reported twice is a protocol error, not a second release.
  (*sc)->delivered(g1);
  const Deadline seen = Deadline::afterMs(10000);
  while ((*sched)->stats().protocolErrors == 0 && !seen.expired()) {
    std::this_thread::sleep_for(Millis(2));
  }
  EXPECT_EQ((*sched)->stats().protocolErrors, 1u);
  EXPECT_EQ((*sched)->stats().destinations[0].delivered, 2u);
}

// A grant that comes after its acquire() gave up goes straight back to the scheduler: the
// destination's load does not keep those bytes, and the client is not broken by an answer it
// no longer waits for.
TEST(CentralScheduler, AGrantAfterItsAcquireGaveUpIsGivenBack) {
  auto sched = localScheduler(1, 100);
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto a = transfer::SchedClient::connect(0, reach(**sched));
  auto b = transfer::SchedClient::connect(1, reach(**sched));
  ASSERT_TRUE(a.ok() && b.ok());
  auto ga = (*a)->acquire(0, 100, Deadline::afterMs(10000));
  ASSERT_TRUE(ga.ok()) << ga.status();
  auto gb = (*b)->acquire(0, 100, Deadline::afterMs(100));  // waits behind A's 100 bytes
  EXPECT_EQ(gb.status().code(), StatusCode::kDeadlineExceeded) << gb.status();
  (*a)->delivered(*ga);  // now the scheduler grants B's request, which nobody waits for
  const Deadline settle = Deadline::afterMs(10000);
  transfer::SchedulerStats st;
  do {
    st = (*sched)->stats();
    if (st.destinations[0].granted == 2 && st.destinations[0].load == 0) break;
    std::this_thread::sleep_for(Millis(2));
  } while (!settle.expired());
  EXPECT_EQ(st.destinations[0].granted, 2u);
  EXPECT_EQ(st.destinations[0].load, 0u) << "the late grant's bytes were not given back";
  EXPECT_TRUE((*b)->status().ok()) << (*b)->status();
  EXPECT_EQ((*b)->stats().lateGrantsReturned, 1u);
  auto again = (*b)->acquire(0, 100, Deadline::afterMs(10000));
  EXPECT_TRUE(again.ok()) << again.status();
}

// A request id already waiting or granted on a connection is refused: a second grant under it
// would overwrite the first, whose bytes would then never come back. So are candidate lists with
// repeats or longer than the destinations.
TEST(CentralScheduler, ARepeatedRequestIdOrCandidateIsRefused) {
  auto sched = localScheduler(1, 100);
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto ctx = transport::Registry::create("tcp", {});
  ASSERT_TRUE(ctx.ok());
  auto conn =
      (*ctx)->connect((*sched)->address(), {.localId = "worker 0"}, Deadline::afterMs(10000));
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto message = [](transfer::SchedOp op, uint64_t id, uint64_t bytes) {
    wire::Header h;
    h.type = wire::MessageType::kControl;
    h.opcode = static_cast<uint8_t>(op);
    h.key = id;
    h.iteration = bytes;
    return h;
  };
  const std::vector<uint8_t> dest0(4, 0);  // candidate destination 0, u32 little-endian
  auto answer = [&]() {
    std::promise<wire::Header> got;
    auto f = got.get_future();
    (*conn)->recvOwned([&got](const Status& s, const wire::Header& h, std::vector<uint8_t>&&) {
      got.set_value(s.ok() ? h : wire::Header{});
    });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    return f.get();
  };
  auto ignore = [](const Status&) {};
  (*conn)->send(message(transfer::SchedOp::kRequest, 5, 10), dest0.data(), dest0.size(), ignore);
  EXPECT_EQ(answer().opcode, static_cast<uint8_t>(transfer::SchedOp::kGrant));
  (*conn)->send(message(transfer::SchedOp::kRequest, 5, 10), dest0.data(), dest0.size(), ignore);
  EXPECT_EQ(answer().opcode, static_cast<uint8_t>(transfer::SchedOp::kRefuse));
  EXPECT_EQ((*sched)->stats().protocolErrors, 1u);
  (*conn)->send(message(transfer::SchedOp::kDelivered, 5, 0), nullptr, 0, ignore);
  const Deadline settle = Deadline::afterMs(10000);
  while ((*sched)->stats().destinations[0].load != 0 && !settle.expired()) {
    std::this_thread::sleep_for(Millis(2));
  }
  EXPECT_EQ((*sched)->stats().destinations[0].load, 0u);
  // A candidate listed twice, and a list longer than the destinations (here 1), are refused:
  // either would queue the request several times over (a peer could send millions).
  const std::vector<uint8_t> dest0Twice(8, 0);
  (*conn)->send(message(transfer::SchedOp::kRequest, 6, 10), dest0Twice.data(), dest0Twice.size(),
                ignore);
  EXPECT_EQ(answer().opcode, static_cast<uint8_t>(transfer::SchedOp::kRefuse));
  std::vector<uint8_t> tooMany(4 * 1000, 0);
  for (size_t i = 0; i < 1000; ++i) tooMany[4 * i] = static_cast<uint8_t>(i % 2);
  (*conn)->send(message(transfer::SchedOp::kRequest, 7, 10), tooMany.data(), tooMany.size(),
                ignore);
  EXPECT_EQ(answer().opcode, static_cast<uint8_t>(transfer::SchedOp::kRefuse));
  EXPECT_EQ((*sched)->stats().protocolErrors, 3u);
  EXPECT_EQ((*sched)->stats().destinations[0].queued, 0u) << "nothing was queued";
  (*ctx)->close();
  (*ctx)->join();
}

// Whether `pred` holds within 10 s (checked every 5 ms): a condition, not a timing.
template <typename Pred>
bool waitFor(Pred pred) {
  for (int i = 0; i < 2000 && !pred(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// One worker in central mode against one daemon whose whole grant budget (100 bytes) another
// client's grant holds: the manager's first request waits until `held` is delivered.
struct HeldDestination {
  DaemonCluster cluster{1, 1};
  std::unique_ptr<transfer::CentralScheduler> sched;
  std::unique_ptr<transfer::SchedClient> holder;
  transfer::SchedGrant held;
  std::unique_ptr<ps::PushPullClient> client;
  std::unique_ptr<transfer::SchedClient> sc;
  std::unique_ptr<transfer::TransferManager> mgr;

  Status start(int64_t grantTimeoutMs) {
    COFAB_RETURN_IF_ERROR(cluster.start());
    COFAB_ASSIGN_OR_RETURN(sched, localScheduler(1, 100));
    COFAB_ASSIGN_OR_RETURN(holder, transfer::SchedClient::connect(1, reach(*sched)));
    COFAB_ASSIGN_OR_RETURN(held, holder->acquire(0, 100, Deadline::afterMs(20000)));
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    COFAB_ASSIGN_OR_RETURN(client, cluster.connect(0, co));
    COFAB_ASSIGN_OR_RETURN(sc, transfer::SchedClient::connect(0, reach(*sched)));
    transfer::TransferOptions o;
    o.scheduler = sc.get();
    o.grantTimeoutMs = grantTimeoutMs;
    o.fuseBelowBytes = 1;
    COFAB_ASSIGN_OR_RETURN(mgr, transfer::TransferManager::create(*client, o));
    return OkStatus();
  }
  // Whether the manager's request reached the scheduler (queued behind `held`) within 10 s.
  bool requestQueued() const {
    return waitFor([&] { return sched->stats().destinations.at(0).queued == 1; });
  }
};

// One f32 update of `key` over `values` (lent until the handle completes).
transfer::GradientUpdate updateOf(uint64_t key, std::vector<float>& values) {
  transfer::GradientUpdate u;
  u.key = key;
  u.tensor = TensorView::of(values.data(), values.size(), DType::kF32);
  return u;
}

// A unit whose grant failed (here: timed out, another worker's grant holds the destination's
// whole budget) never travelled: it is not counted as sent in the stats (units, bytes) nor given
// a send index in its record. It used to be counted like a unit handed to the transport.
TEST(CentralScheduler, AUnitWhoseGrantFailedIsNotCountedAsSent) {
  HeldDestination job;
  // `held` is never delivered: no grant can come, and any grant timeout expires.
  const Status started = job.start(/*grantTimeoutMs=*/200);
  ASSERT_TRUE(started.ok()) << started;
  auto* mgr = &job.mgr;
  std::vector<float> g(2 * kChunk / sizeof(float), 1.0f);  // 2 chunks
  transfer::GradientUpdate u;
  u.key = 7;
  u.tensor = TensorView::of(g.data(), g.size(), DType::kF32);
  const Status st = (*mgr)->enqueue(u).wait(Deadline::afterMs(20000));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  const transfer::TransferStats s = (*mgr)->stats();
  EXPECT_EQ(s.chunksSent, 0u);
  EXPECT_EQ(s.bucketsSent, 0u);
  EXPECT_EQ(s.bytesSent, 0u);
  EXPECT_EQ(s.destinations[0].unitsSent, 0u);
  EXPECT_EQ(s.destinations[0].bytesSent, 0u);
  for (const auto& r : (*mgr)->records()) EXPECT_EQ(r.sendIndex, ~0ull) << r.name;
}

// pause() while the dispatcher waits for a grant: the grant that comes is given back, and the
// unit waits for resume(). It used to be sent anyway, after pause() had returned.
TEST(CentralScheduler, AGrantThatArrivesAfterPauseIsGivenBackNotUsed) {
  HeldDestination job;
  const Status started = job.start(/*grantTimeoutMs=*/20000);
  ASSERT_TRUE(started.ok()) << started;
  auto* mgr = &job.mgr;
  auto* sched = &job.sched;
  std::vector<float> g(kChunk / sizeof(float), 1.0f);  // one chunk
  transfer::TransferHandle h = (*mgr)->enqueue(updateOf(9, g));
  ASSERT_TRUE(job.requestQueued()) << "the dispatcher's request never reached the scheduler";
  (*mgr)->pause();
  job.holder->delivered(job.held);  // the scheduler now grants the manager's request
  ASSERT_TRUE(waitFor([&] { return (*sched)->stats().destinations.at(0).delivered == 2; }))
      << "the grant was neither given back nor used";
  EXPECT_EQ((*mgr)->stats().chunksSent, 0u) << "a unit went out after pause() returned";
  (*mgr)->resume();
  ASSERT_TRUE(h.wait(Deadline::afterMs(20000)).ok()) << h.status();
  EXPECT_EQ((*mgr)->stats().chunksSent, 1u);
}

// An update whose deadline passes while the dispatcher waits for another unit's grant: test()
// and status() see it fail at its deadline, as wait() does. They used to report it in progress
// until the other grant came or timed out (grantTimeoutMs, here 20 s), so a caller polling
// test() missed the deadline by that long.
TEST(CentralScheduler, TestAndStatusSeeADeadlinePassWhileTheDispatcherAwaitsAGrant) {
  HeldDestination job;
  const Status started = job.start(/*grantTimeoutMs=*/20000);
  ASSERT_TRUE(started.ok()) << started;
  auto* mgr = &job.mgr;
  std::vector<float> a(kChunk / sizeof(float), 1.0f);
  std::vector<float> b(kChunk / sizeof(float), 2.0f);
  transfer::TransferHandle ha = (*mgr)->enqueue(updateOf(1, a));
  ASSERT_TRUE(job.requestQueued()) << "the dispatcher's request never reached the scheduler";
  transfer::GradientUpdate ub = updateOf(2, b);
  ub.deadline = Deadline::afterMs(100);
  transfer::TransferHandle hb = (*mgr)->enqueue(ub);
  EXPECT_TRUE(waitFor([&] { return hb.test(); }))
      << "test() still false 10 s after the update's 100 ms deadline";
  EXPECT_EQ(hb.status().code(), StatusCode::kDeadlineExceeded) << hb.status();
  EXPECT_FALSE(ha.test()) << "the update without a deadline must still wait for its grant";
  job.holder->delivered(job.held);
  EXPECT_TRUE(ha.wait(Deadline::afterMs(20000)).ok()) << ha.status();
}

// A request for more than 1 GiB (transfer::kMaxRequestBytes) is refused with an error that says
// so, whatever the destination's load: the scheduler used to grant any claimed size to an idle
// destination, and its load and pacing arithmetic overflowed on absurd ones.
TEST(CentralScheduler, ARequestAboveOneGibIsRefused) {
  auto sched = localScheduler(1, 1 << 20);
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto sc = transfer::SchedClient::connect(0, reach(**sched));
  ASSERT_TRUE(sc.ok()) << sc.status();
  constexpr uint64_t kGib = uint64_t{1} << 30;
  for (uint64_t bytes : {kGib + 1, ~uint64_t{0}}) {
    auto g = (*sc)->acquire(0, bytes, Deadline::afterMs(20000));
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << bytes << ": " << g.status();
    EXPECT_NE(g.status().message().find(std::to_string(kGib)), std::string::npos) << g.status();
  }
  EXPECT_EQ((*sched)->stats().destinations[0].granted, 0u);
  auto atLimit = (*sc)->acquire(0, kGib, Deadline::afterMs(20000));  // an idle destination
  ASSERT_TRUE(atLimit.ok()) << atLimit.status();
  (*sc)->delivered(*atLimit);
}

// COFAB_TRANSFER_SCHEDULER=central: an unchanged training loop (no TransferOptions::scheduler)
// finds the scheduler through COFAB_STORE. Worker processes, so the environment is their own.
TEST(CentralScheduler, EnvironmentSelectsCentralMode) {
  const int kWorkers = 2;
  DaemonCluster cluster(1, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  const std::string url = cluster.storeUrl();
  ProcessGroup group;
  group.start(kWorkers, [&](int rank) -> int {
    ::setenv("COFAB_STORE", url.c_str(), 1);
    ::setenv("COFAB_TRANSFER_SCHEDULER", "central", 1);
    auto store = openStore(url, Deadline::afterMs(10000));
    if (!store.ok()) return childFail(rank, store.status().toString());
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    auto client = ps::PushPullClient::connect(**store, rank, kWorkers, co);
    if (!client.ok()) return childFail(rank, client.status().toString());
    auto mgr = transfer::TransferManager::create(**client, {});
    if (!mgr.ok()) return childFail(rank, mgr.status().toString());
    Status st = runIteration(**mgr, rank, kWorkers, 0);
    return st.ok() ? 0 : childFail(rank, st.toString());
  });
  // The scheduler starts after the fork (no threads in the children's image).
  transfer::SchedulerOptions so;
  so.listenAddress = "127.0.0.1:0";
  auto sched = transfer::CentralScheduler::create(so);
  ASSERT_TRUE(sched.ok()) << sched.status();
  ASSERT_TRUE(cluster.store()
                  .set(transfer::schedulerAddressKey("cofab/sched"),
                       Bytes((*sched)->address().begin(), (*sched)->address().end()))
                  .ok());
  EXPECT_EQ(failures(group.waitAll(Deadline::afterMs(30000))), "");
  const auto st = (*sched)->stats();
  EXPECT_GT(st.destinations[0].granted, 0u) << "the managers did not ask the scheduler";
  EXPECT_EQ(st.protocolErrors, 0u);
}

// A real cofab-sched process: registers in the store, serves; SIGSTOP makes grants time out
// (DeadlineExceeded naming the scheduler), SIGKILL fails waiting units at once (Unavailable).
class SchedProcess {
 public:
  explicit SchedProcess(const std::string& storeUrl) {
    std::vector<std::string> args = {
        COFAB_SCHED_PATH, "--store", storeUrl, "--destinations", "1", "--listen", "127.0.0.1:0"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::execv(COFAB_SCHED_PATH, argv.data());
      ::_exit(127);
    }
  }
  ~SchedProcess() { kill(); }
  bool stop() { return stopAndWait(pid_, Deadline::afterMs(10000)); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

TEST(CentralScheduler, StoppedOrKilledSchedulerIsAClearErrorNotAHang) {
  const int kWorkers = 2;
  DaemonCluster cluster(1, kWorkers);
  ASSERT_TRUE(cluster.start().ok());
  SchedProcess proc(cluster.storeUrl());
  std::atomic<int> phase{0};
  std::atomic<int> ready{0};
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = kChunk;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    transfer::SchedClientOptions sco;
    sco.connectTimeoutMs = 20000;
    COFAB_ASSIGN_OR_RETURN(auto sc, transfer::SchedClient::connect(cluster.store(), rank, sco));
    transfer::TransferOptions o;
    o.scheduler = sc.get();
    {  // works while it serves (default grant timeout: a loaded machine must not fail this)
      COFAB_ASSIGN_OR_RETURN(auto first, transfer::TransferManager::create(*client, o));
      COFAB_RETURN_IF_ERROR(runIteration(*first, rank, kWorkers, 0));
    }
    // Stopped, the scheduler grants nothing, so any grant timeout expires: keep it short.
    o.grantTimeoutMs = 500;
    COFAB_ASSIGN_OR_RETURN(auto mgr, transfer::TransferManager::create(*client, o));
    // Both workers done with the phase; rank 0 flips the process. A rank that failed never
    // arrives: the other says so instead of going on against a process in the wrong state.
    auto sync = [&](int want) -> Status {
      ready++;
      const Deadline d = Deadline::afterMs(20000);
      while (phase.load() < want && !d.expired()) {
        if (rank == 0 && ready.load() == kWorkers * want) {
          // Stopped for sure, not about to be; reaped: gone for sure.
          if (want == 1 && !proc.stop()) {
            return Internal("cofab-sched still runs 10 s after SIGSTOP");
          }
          if (want == 2) proc.kill();
          phase = want;
        }
        std::this_thread::sleep_for(Millis(2));
      }
      if (phase.load() >= want) return OkStatus();
      return DeadlineExceeded("phase " + std::to_string(want) + " never came: the other rank " +
                              "stopped before it");
    };
    COFAB_RETURN_IF_ERROR(sync(1));                          // stopped: no grant comes
    std::vector<float> g(4 * kChunk / sizeof(float), 1.0f);  // 4 chunks
    transfer::GradientUpdate u;
    u.key = 7;
    u.tensor = TensorView::of(g.data(), g.size(), DType::kF32);
    Status st = mgr->enqueue(u).wait(Deadline::afterMs(20000));
    if (st.code() != StatusCode::kDeadlineExceeded ||
        st.message().find("cofab-sched at") == std::string::npos) {
      return Internal("stopped scheduler: want DeadlineExceeded naming it, got " + st.toString());
    }
    // The update failed with its first chunk's grant: the other three were dropped, not left
    // to wait for grants one after the other.
    if (mgr->stats().destinations[0].queued != 0) {
      return Internal("chunks of a failed update are still queued");
    }
    COFAB_RETURN_IF_ERROR(sync(2));  // killed: the connection breaks
    // A long grant timeout from here: the broken connection must end the wait, however late a
    // loaded machine lets the client notice it (with 500 ms it could time out first).
    o.grantTimeoutMs = 15000;
    COFAB_ASSIGN_OR_RETURN(auto afterKill, transfer::TransferManager::create(*client, o));
    std::vector<float> g2(4096, 1.0f);
    u.key = 8;
    u.tensor = TensorView::of(g2.data(), g2.size(), DType::kF32);
    st = afterKill->enqueue(u).wait(Deadline::afterMs(20000));
    if (st.code() != StatusCode::kUnavailable ||
        st.message().find("cofab-sched at") == std::string::npos) {
      return Internal("killed scheduler: want Unavailable naming it, got " + st.toString());
    }
    return OkStatus();
  });
  EXPECT_TRUE(allOk(statuses).ok()) << allOk(statuses);
}

}  // namespace
}  // namespace cofab::testing
