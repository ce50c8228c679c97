// Failure and desync diagnostics on threads as ranks: mismatched collectives, counts, dtypes
// and sequences fail with InvalidArgument on every rank (never a wrong result or a hang), a
// rank that never arrives is named in DeadlineExceeded with the sequence number, abort() fails
// everyone, setup names the ranks that never showed up; plus split and 1-rank communicators.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/param.h"
#include "fabric/comm/collectives.h"
#include "fabric/rendezvous/hash_store.h"
#include "fabric/rendezvous/tcp_store.h"
#include "fabric/rendezvous/tcp_store_server.h"
#include "fabric/transport/registry.h"
#include "tests/fabric/comm/comm_test_util.h"
#include "tests/support/forwarding_store.h"
#include "tests/support/thread_ranks.h"

namespace cofab::comm {
namespace {

using cofab::testing::runThreadRanks;

std::string describe(const std::vector<Status>& st) {
  std::string s;
  for (size_t r = 0; r < st.size(); ++r) s += "\n  rank " + std::to_string(r) + ": " + st[r].toString();
  return s;
}

struct Group {
  HashStore store;
  std::vector<std::unique_ptr<Communicator>> comms;
};

std::unique_ptr<Group> makeGroup(int n) {
  auto g = std::make_unique<Group>();
  auto comms = testing::makeComms(n, &g->store, "tcp");
  EXPECT_TRUE(comms.ok()) << comms.status();
  if (!comms.ok()) return nullptr;
  g->comms = std::move(comms).value();
  return g;
}

AllreduceOptions quick(ReduceOp op = ReduceOp::kSum) {
  AllreduceOptions o;
  o.op = op;
  o.timeout = Millis(10000);
  return o;
}

// Every rank fails with InvalidArgument, and at least one message names the mismatch. The
// 10 s timeouts are far away: a DeadlineExceeded here would mean a hang was turned into a
// timeout, which is what must not happen.
void expectMismatch(const std::vector<Status>& st, const std::string& words) {
  bool named = false;
  for (const auto& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << describe(st);
    named = named || s.message().find(words) != std::string::npos;
  }
  EXPECT_TRUE(named) << "no rank's message contains '" << words << "':" << describe(st);
}

TEST(CommDesync, DifferentCollectivesAreReportedOnEveryRank) {
  auto g = makeGroup(3);
  ASSERT_TRUE(g);
  auto st = runThreadRanks(3, [&](int r) -> Status {
    std::vector<float> buf(12, 1.0f), out(36);
    if (r == 1) {
      CollectiveOptions o;
      o.timeout = Millis(10000);
      return allgather(*g->comms[r], TensorView(buf.data(), 12, DType::kF32),
                       TensorView(out.data(), 36, DType::kF32), o);
    }
    return allreduce(*g->comms[r], TensorView(buf.data(), 12, DType::kF32), quick());
  });
  expectMismatch(st, "mismatch");
  for (const auto& s : st) {
    EXPECT_NE(s.message().find("allreduce"), std::string::npos) << s;
  }
}

TEST(CommDesync, DifferentCountsAndDtypesAreReported) {
  for (bool dtypeCase : {false, true}) {
    auto g = makeGroup(3);
    ASSERT_TRUE(g);
    auto st = runThreadRanks(3, [&](int r) -> Status {
      std::vector<double> buf(100, 1.0);
      const size_t count = (!dtypeCase && r == 2) ? 10 : 12;
      const DType dtype = (dtypeCase && r == 0) ? DType::kI64 : DType::kF64;
      AllreduceOptions o = quick();
      o.algorithm = dtypeCase ? AllreduceAlgorithm::kDirect : AllreduceAlgorithm::kRing;
      return allreduce(*g->comms[r], TensorView(buf.data(), count, dtype), o);
    });
    expectMismatch(st, dtypeCase ? "x i64" : "10 x f64");
  }
}

TEST(CommDesync, ASkippedCollectiveIsASequenceMismatch) {
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  auto st = runThreadRanks(2, [&](int r) -> Status {
    std::vector<float> buf(8, 1.0f);
    if (r == 0) {
      CollectiveOptions o;
      o.timeout = Millis(10000);
      COFAB_RETURN_IF_ERROR(barrier(*g->comms[r], o));
    }
    COFAB_RETURN_IF_ERROR(allreduce(*g->comms[r], TensorView(buf.data(), 8, DType::kF32), quick()));
    return allreduce(*g->comms[r], TensorView(buf.data(), 8, DType::kF32), quick());
  });
  expectMismatch(st, "mismatch");
}

// A chain broadcast (0 -> 1 -> 2 -> 3) that rank 2 never calls: ranks 0 and 1 forward what
// they have and return OK, so, like rank 2, they publish no report; rank 3 times out. Its error
// named "rank(s) 0, 1, 2 did not arrive", and ranks 0 and 1 were then told (through the failure
// it published) that they had not arrived. Now it names rank 2, the break, and says that the
// ranks before it in the chain did their part.
TEST(CommDeadline, AChainBroadcastNamesTheBreakNotTheRanksBeforeIt) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "300");
  ScopedParamOverride chain("COFAB_BROADCAST_SMALL_BYTES", "0");
  auto g = makeGroup(4);
  ASSERT_TRUE(g);
  std::vector<Status> st(4);
  std::vector<std::thread> threads;
  for (int r : {0, 1, 3}) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(1000, 1.0f);
      COFAB_CHECK(barrier(*g->comms[r]).ok());
      BroadcastOptions o;
      o.root = 0;
      o.timeout = Millis(400);
      st[r] = broadcast(*g->comms[r], TensorView(buf.data(), buf.size(), DType::kF32), o);
    });
  }
  ASSERT_TRUE(barrier(*g->comms[2]).ok());  // takes part in the barrier, not the broadcast
  for (auto& t : threads) t.join();
  EXPECT_EQ(st[3].code(), StatusCode::kDeadlineExceeded) << describe(st);
  EXPECT_NE(st[3].message().find("rank(s) 2 did not arrive at sequence 1 (rank(s) 0, 1, before it "
                                 "in the broadcast's chain, did their part"),
            std::string::npos)
      << describe(st);
}

TEST(CommDeadline, NamesTheRankThatDidNotArriveOnEverySurvivor) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "300");
  auto g = makeGroup(4);
  ASSERT_TRUE(g);
  std::vector<Status> st(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(1000, 1.0f);
      COFAB_CHECK(barrier(*g->comms[r]).ok());
      AllreduceOptions o;
      o.timeout = Millis(400);
      o.algorithm = r == 0 ? AllreduceAlgorithm::kRing : AllreduceAlgorithm::kRing;
      st[r] = allreduce(*g->comms[r], TensorView(buf.data(), buf.size(), DType::kF32), o);
    });
  }
  // Rank 3 takes part in the barrier but never calls the allreduce.
  ASSERT_TRUE(barrier(*g->comms[3]).ok());
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << describe(st);
    EXPECT_NE(st[r].message().find("rank(s) 3 did not arrive at sequence 1"), std::string::npos)
        << describe(st);
  }
  // The failure is sticky: rank 3's next collective fails at once with the published cause.
  std::vector<float> buf(4);
  Status late = allreduce(*g->comms[3], TensorView(buf.data(), 4, DType::kF32), quick());
  EXPECT_FALSE(late.ok());
}

// The store goes away (its server stopped: under torchrun rank 0 hosts it) while a collective
// times out. The timeout report's store calls are bounded by the diagnosis grace, so the
// operation still ends soon after its deadline; each used to wait for the store's own call
// timeout (120 s here), and the report came minutes late.
TEST(CommDeadline, AStoreThatIsGoneDoesNotDelayTheTimeoutReport) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "300");
  ScopedParamOverride storeTimeout("COFAB_STORE_TIMEOUT_MS", "120000");
  auto server = TcpStoreServer::start({});
  ASSERT_TRUE(server.ok()) << server.status();
  // A store client per rank, as separate processes have (a TcpStore client serves one request
  // at a time: one rank's setup wait would hold the other's publish back).
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (int r = 0; r < 2; ++r) {
    auto st = TcpStore::connect("127.0.0.1", (*server)->port(), {}, Deadline::afterMs(10000));
    ASSERT_TRUE(st.ok()) << st.status();
    stores.push_back(std::move(st).value());
  }
  std::vector<std::unique_ptr<Communicator>> comms(2);
  auto made = cofab::testing::runThreadRanks(2, [&](int r) -> Status {
    CommOptions co;
    co.setupTimeout = Millis(20000);
    COFAB_ASSIGN_OR_RETURN(comms[static_cast<size_t>(r)],
                           Communicator::create(r, 2, stores[static_cast<size_t>(r)].get(), co));
    return OkStatus();
  });
  ASSERT_TRUE(cofab::testing::allOk(made).ok()) << cofab::testing::allOk(made);
  server->reset();  // gone: every later store call fails to connect, until its own deadline
  std::vector<float> buf(100, 1.0f);
  AllreduceOptions o;
  o.timeout = Millis(500);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = allreduce(*comms[0], TensorView(buf.data(), buf.size(), DType::kF32), o);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank(s) 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("could not be reached"), std::string::npos) << s;
  // Far below the store's 120 s: the report is bounded by the grace, not by the store.
  EXPECT_LT(took, std::chrono::seconds(60)) << s;
}

TEST(CommDeadline, AWaitDeadlineLeavesTheOperationRunning) {
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  auto h = allreduceAsync(*g->comms[0], TensorView(a.data(), 100, DType::kF32),
                          TensorView(a.data(), 100, DType::kF32), quick());
  Status early = h.wait(Deadline::afterMs(50));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early;
  EXPECT_FALSE(h.test());
  EXPECT_EQ(h.status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(allreduce(*g->comms[1], TensorView(b.data(), 100, DType::kF32), quick()).ok());
  ASSERT_TRUE(h.wait(Deadline::afterMs(10000)).ok());
  EXPECT_EQ(a[7], 3.0f);
}

// A caller that only polls test() gets the op's deadline too (before, only wait() enforced it,
// and a poller spun for as long as the missing rank stayed away).
TEST(CommDeadline, PollingTestAloneEnforcesTheOpsDeadline) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "100");
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  std::vector<float> a(100, 1.0f);
  AllreduceOptions o;
  o.timeout = Millis(200);
  auto h = allreduceAsync(*g->comms[0], TensorView(a.data(), 100, DType::kF32),
                          TensorView(a.data(), 100, DType::kF32), o);
  const Deadline giveUp = Deadline::afterMs(10000);
  while (!h.test() && !giveUp.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(h.test()) << "rank 1 never called the allreduce, and polling never timed it out";
  EXPECT_EQ(h.status().code(), StatusCode::kDeadlineExceeded) << h.status();
  EXPECT_NE(h.status().message().find("rank(s) 1 did not arrive"), std::string::npos)
      << h.status();
  EXPECT_EQ(g->comms[0]->asyncError().code(), StatusCode::kDeadlineExceeded);
}

// A queued op's deadline passing while an earlier op still runs (within its own, longer
// deadline) says so; before, it was reported as the running op missing its deadline, with the
// ranks this rank had not heard from (its own view only) named as absent.
TEST(CommDeadline, AQueuedOpsDeadlineNamesTheOpThatHeldTheQueue) {
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  std::vector<float> a(1000, 1.0f);
  AllreduceOptions slow;
  slow.timeout = Millis(60000);
  auto first = allreduceAsync(*g->comms[0], TensorView(a.data(), a.size(), DType::kF32),
                              TensorView(a.data(), a.size(), DType::kF32), slow);
  CollectiveOptions quickOne;
  quickOne.timeout = Millis(100);
  auto queued = barrierAsync(*g->comms[0], quickOne);
  const Status s = queued.wait(Deadline::afterMs(20000));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("barrier #1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("queued behind allreduce #0"), std::string::npos) << s;
  EXPECT_EQ(first.wait(Deadline::afterMs(20000)).code(), StatusCode::kDeadlineExceeded);
}

// Waiting on a later op first, when the op ahead of it is past its own deadline too: that op is
// timed out as usual, naming the rank that did not arrive (not "queued behind").
TEST(CommDeadline, WaitingOnALaterOpStillNamesWhoTheRunningOneMissed) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "100");
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
  AllreduceOptions o;
  o.timeout = Millis(200);
  auto first = allreduceAsync(*g->comms[0], TensorView(a.data(), a.size(), DType::kF32),
                              TensorView(a.data(), a.size(), DType::kF32), o);
  auto second = allreduceAsync(*g->comms[0], TensorView(b.data(), b.size(), DType::kF32),
                               TensorView(b.data(), b.size(), DType::kF32), o);
  const Status s = second.wait(Deadline::afterMs(20000));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank(s) 1 did not arrive"), std::string::npos) << s;
  EXPECT_EQ(first.wait(Deadline::afterMs(20000)).code(), StatusCode::kDeadlineExceeded);
}

// Waiting on a later op enforces the shorter deadline of the op it waits behind: the running
// allreduce's 300 ms pass, and the barrier queued behind it (no deadline of its own) fails with
// the report naming the rank that did not arrive. The wait slept to its own deadline (or for
// ever) instead.
TEST(CommDeadline, WaitingOnALaterOpEnforcesTheRunningOnesShorterDeadline) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "100");
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  std::vector<float> a(1000, 1.0f);
  AllreduceOptions o;
  o.timeout = Millis(300);
  auto first = allreduceAsync(*g->comms[0], TensorView(a.data(), a.size(), DType::kF32),
                              TensorView(a.data(), a.size(), DType::kF32), o);
  CollectiveOptions forever;
  forever.deadline = Deadline::never();
  auto behind = barrierAsync(*g->comms[0], forever);
  const Status s = behind.wait(Deadline::afterMs(30000));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank(s) 1 did not arrive"), std::string::npos) << s;
  EXPECT_EQ(first.wait(Deadline::afterMs(20000)).code(), StatusCode::kDeadlineExceeded);
}

// The same with the shorter deadline on an op queued ahead: the barrier's wait enforces it (the
// report says what held that op's queue up) instead of sleeping to the running op's deadline.
TEST(CommDeadline, WaitingOnALaterOpEnforcesAQueuedOnesShorterDeadline) {
  ScopedParamOverride grace("COFAB_COMM_DIAG_GRACE_MS", "100");
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
  AllreduceOptions slow, quickOne;
  slow.timeout = Millis(10000);
  quickOne.timeout = Millis(300);
  auto running = allreduceAsync(*g->comms[0], TensorView(a.data(), a.size(), DType::kF32),
                                TensorView(a.data(), a.size(), DType::kF32), slow);
  auto queued = allreduceAsync(*g->comms[0], TensorView(b.data(), b.size(), DType::kF32),
                               TensorView(b.data(), b.size(), DType::kF32), quickOne);
  CollectiveOptions forever;
  forever.deadline = Deadline::never();
  auto behind = barrierAsync(*g->comms[0], forever);
  const Status s = behind.wait(Deadline::afterMs(30000));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("reached its deadline still queued behind"), std::string::npos) << s;
  EXPECT_EQ(queued.wait(Deadline::afterMs(20000)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(running.wait(Deadline::afterMs(20000)).code(), StatusCode::kDeadlineExceeded);
}

TEST(CommAbort, AbortFailsPendingOperationsOnEveryRank) {
  auto g = makeGroup(3);
  ASSERT_TRUE(g);
  std::vector<float> buf0(10), buf1(10);
  auto h0 = allreduceAsync(*g->comms[0], TensorView(buf0.data(), 10, DType::kF32),
                           TensorView(buf0.data(), 10, DType::kF32), quick());
  auto h1 = allreduceAsync(*g->comms[1], TensorView(buf1.data(), 10, DType::kF32),
                           TensorView(buf1.data(), 10, DType::kF32), quick());
  g->comms[2]->abort();
  Status s0 = h0.wait(Deadline::afterMs(10000));
  Status s1 = h1.wait(Deadline::afterMs(10000));
  EXPECT_EQ(s0.code(), StatusCode::kAborted) << s0;
  EXPECT_EQ(s1.code(), StatusCode::kAborted) << s1;
  EXPECT_NE(s0.message().find("rank 2"), std::string::npos) << s0;
  // asyncError() becomes the sticky error once the failure has been handled.
  Status err = g->comms[2]->asyncError();
  for (int i = 0; i < 200 && err.ok(); ++i) {
    std::this_thread::sleep_for(Millis(10));
    err = g->comms[2]->asyncError();
  }
  EXPECT_EQ(err.code(), StatusCode::kAborted);
  EXPECT_FALSE(barrier(*g->comms[2]).ok());
}

TEST(CommSetup, NamesTheRanksThatNeverShowedUp) {
  HashStore store;
  std::vector<Status> st(4);
  runThreadRanks(2, [&](int r) {
    CommOptions o;
    o.setupTimeout = Millis(300);
    // Ranks 0 and 2 of 4 start; 1 and 3 never do.
    auto c = Communicator::create(r * 2, 4, &store, o);
    st[r] = c.status();
    return OkStatus();
  });
  EXPECT_EQ(st[0].code(), StatusCode::kDeadlineExceeded) << st[0];
  EXPECT_NE(st[0].message().find("3"), std::string::npos) << st[0];
  EXPECT_EQ(st[1].code(), StatusCode::kDeadlineExceeded) << st[1];
  EXPECT_NE(st[1].message().find("rank(s) 1"), std::string::npos) << st[1];
}

// A rank that started before the others and timed out retries: its failed setup must not move
// it to another store namespace than the one the others use (every create() used to count a
// generation, so the retry waited for addresses the others published elsewhere, forever).
TEST(CommSetup, ARankWhoseSetupTimedOutJoinsTheOthersWhenItRetries) {
  HashStore store;
  CommOptions early;
  early.setupTimeout = Millis(300);
  auto alone = Communicator::create(1, 3, &store, early);
  ASSERT_EQ(alone.status().code(), StatusCode::kDeadlineExceeded) << alone.status();
  std::vector<float> sums(3, 0.0f);
  const std::vector<Status> st = runThreadRanks(3, [&](int r) -> Status {
    CommOptions o;
    o.setupTimeout = Millis(20000);
    COFAB_ASSIGN_OR_RETURN(auto c, Communicator::create(r, 3, &store, o));
    float v = float(r + 1);
    COFAB_RETURN_IF_ERROR(allreduce(*c, TensorView(&v, 1, DType::kF32)));
    sums[size_t(r)] = v;
    return OkStatus();
  });
  ASSERT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
  for (float v : sums) EXPECT_EQ(v, 6.0f);
}

// A rank that is waiting for the others in a generation that another rank has given up (an
// outcome is set there) stops at once with Aborted instead of waiting out its deadline there,
// and the next setup of the name skips that generation: both ranks meet in the next one.
TEST(CommSetup, AGenerationGivenUpIsLeftAndSkipped) {
  HashStore store;
  Status alone;
  std::thread waiting([&] {
    CommOptions o;
    o.setupTimeout = Millis(20000);
    alone = Communicator::create(0, 2, &store, o).status();
  });
  // Rank 1's part of a failed attempt: it gave generation 1 up.
  ASSERT_TRUE(store.wait({"cofab-comm/1/addr/0"}, Deadline::afterMs(20000)).ok());
  ASSERT_TRUE(store.compareSet("cofab-comm/1/outcome", {}, toBytes("failed")).ok());
  waiting.join();
  EXPECT_EQ(alone.code(), StatusCode::kAborted) << alone;
  const std::vector<Status> st = runThreadRanks(2, [&](int r) -> Status {
    CommOptions o;
    o.setupTimeout = Millis(20000);
    COFAB_ASSIGN_OR_RETURN(auto c, Communicator::create(r, 2, &store, o));
    return barrier(*c);
  });
  ASSERT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
  auto second = store.check({"cofab-comm/2/outcome"});
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(*second) << "the ranks met in generation 2";
}

// Rank 1 of 2 dials an address rank 0 left behind (a listener that is gone: refused): it keeps
// dialling only while the attempt is on, and leaves with Aborted once another rank gave the
// generation up, instead of dialling until its own deadline.
TEST(CommSetup, ADialerLeavesAGenerationGivenUp) {
  HashStore store;
  ASSERT_TRUE(store.set("cofab-comm/1/addr/0", toBytes("127.0.0.1:1")).ok());
  Status dialing;
  std::thread rank1([&] {
    CommOptions o;
    o.setupTimeout = Millis(20000);
    dialing = Communicator::create(1, 2, &store, o).status();
  });
  // Rank 1 is in generation 1 once it published its own address there (it dials after that).
  ASSERT_TRUE(store.wait({"cofab-comm/1/addr/1"}, Deadline::afterMs(20000)).ok());
  ASSERT_TRUE(store.compareSet("cofab-comm/1/outcome", {}, toBytes("failed")).ok());
  rank1.join();
  EXPECT_EQ(dialing.code(), StatusCode::kAborted) << dialing;
}

// Rank 1 of 2 has its connection (this test plays rank 0's listener) and waits for the
// attempt's outcome; rank 0 then gives the attempt up. Rank 1 learns it at once (Aborted), not
// at its own deadline while waiting for rank 0 to report in.
TEST(CommSetup, AConnectedRankLearnsAtOnceThatTheAttemptFailed) {
  HashStore store;
  auto ctx = transport::Registry::create("tcp", {.localId = "rank 0 stand-in"});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto listener = (*ctx)->listen({});
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_TRUE(store.set("cofab-comm/1/addr/0", toBytes((*listener)->address())).ok());
  Status waiting;
  std::thread rank1([&] {
    CommOptions o;
    o.setupTimeout = Millis(20000);
    waiting = Communicator::create(1, 2, &store, o).status();
  });
  auto conn = (*listener)->accept(Deadline::afterMs(20000));
  ASSERT_TRUE(conn.ok()) << conn.status();
  // Rank 1 counts itself in once its one connection is up.
  for (const Deadline d = Deadline::afterMs(20000); !d.expired();) {
    auto up = store.check({"cofab-comm/1/up"});
    if (up.ok() && *up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(store.compareSet("cofab-comm/1/outcome", {}, toBytes("failed")).ok());
  rank1.join();
  EXPECT_EQ(waiting.code(), StatusCode::kAborted) << waiting;
  (*ctx)->join();
}

// A store whose add() to the setup's "up" counter is applied but answers Unavailable (a reply
// lost with the connection), and answers only once the attempt's outcome is there.
class UpReplyLost final : public cofab::testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  StatusOr<int64_t> add(std::string_view k, int64_t x) override {
    StatusOr<int64_t> r = to_->add(k, x);
    if (!r.ok() || !k.ends_with("/up")) return r;
    const std::string outcome = std::string(k.substr(0, k.size() - 2)) + "outcome";
    to_->wait({outcome}, Deadline::afterMs(20000)).ignoreError();
    return Unavailable("injected: the connection broke before add()'s reply");
  }
};

// A store whose add() to the "up" counter waits until another rank has counted itself in.
class UpAfterAnother final : public cofab::testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  StatusOr<int64_t> add(std::string_view k, int64_t x) override {
    if (k.ends_with("/up")) {
      COFAB_RETURN_IF_ERROR(to_->wait({std::string(k)}, Deadline::afterMs(20000)));
    }
    return to_->add(k, x);
  }
};

// Rank 1's count is applied but its reply lost; rank 0 completes the count and decides "ok".
// Rank 1 must follow "ok" (its connections are up, and "ok" means it was counted): it used to
// fail while rank 0 went on with a communicator whose peer had given up.
TEST(CommSetup, ARankWhoseCountReplyWasLostFollowsTheOutcome) {
  HashStore store;
  UpReplyLost lossy(&store);
  UpAfterAnother second(&store);  // rank 0 counts itself in after rank 1, completing the count
  const std::vector<Status> st = runThreadRanks(2, [&](int r) -> Status {
    CommOptions o;
    o.setupTimeout = Millis(20000);
    Store* mine = r == 1 ? static_cast<Store*>(&lossy) : &second;
    COFAB_ASSIGN_OR_RETURN(auto c, Communicator::create(r, 2, mine, o));
    return barrier(*c);
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

TEST(CommSetup, RejectsBadArguments) {
  HashStore store;
  EXPECT_EQ(Communicator::create(2, 2, &store).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Communicator::create(0, 1, &store, CommOptions{.transport = "nope"}).ok(), true);
  auto c = Communicator::create(0, 1, &store);
  ASSERT_TRUE(c.ok());
  std::vector<uint8_t> u(4);
  EXPECT_EQ(allreduce(**c, TensorView(u.data(), 4, DType::kU8)).code(),
            StatusCode::kInvalidArgument);
  std::vector<float> f(4);
  EXPECT_EQ(allreduce(**c, TensorView(f.data(), 4, DType::kF32), TensorView(f.data(), 3, DType::kF32))
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(send(**c, TensorView(f.data(), 4, DType::kF32), 0).code(),
            StatusCode::kInvalidArgument);
  BroadcastOptions bo;
  bo.root = 5;
  EXPECT_EQ(broadcast(**c, TensorView(f.data(), 4, DType::kF32), bo).code(),
            StatusCode::kInvalidArgument);
}

// A rank that destroys its communicator right after a blocking collective returned is not
// "destroyed while operations were pending": the op's completion wakes the caller before the
// op leaves the communicator, and a destructor that ran in that gap published a failure (and
// waited out the diagnostic grace), which a slower peer then reported as its cause.
TEST(CommLifecycle, DestroyingRightAfterABlockingCallReportsNoFailure) {
  for (int i = 0; i < 200; ++i) {
    HashStore store;
    const std::string name = "quick-" + std::to_string(i);
    auto comms = testing::makeComms(2, &store, "tcp", name);
    ASSERT_TRUE(comms.ok()) << comms.status();
    auto st = runThreadRanks(2, [&](int r) -> Status {
      float x = 1.0f;
      Status s = allreduce(*(*comms)[r], TensorView(&x, 1, DType::kF32), quick());
      (*comms)[r].reset();
      return s;
    });
    ASSERT_TRUE(cofab::testing::allOk(st).ok()) << describe(st);
    for (int r = 0; r < 2; ++r) {
      const std::string key = name + "/1/fail/" + std::to_string(r);
      auto published = store.check({key});
      ASSERT_TRUE(published.ok()) << published.status();
      ASSERT_FALSE(*published) << "iteration " << i << ": rank " << r << " published "
                               << toString(*store.get(key, Deadline::afterMs(0)));
    }
  }
}

// A store whose writes of failure reports wait until the test lets them through.
class HeldFailureReports final : public cofab::testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Status set(std::string_view k, const Bytes& v) override {
    if (k.find("/fail/") != std::string_view::npos) {
      (void)released_.wait_for(std::chrono::seconds(20));
    }
    return to_->set(k, v);
  }
  void release() { release_.set_value(); }

 private:
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
};

// asyncError() is not OK from abort() on. It stayed OK until the failure procedure had
// written its report to the store and closed the connections (up to the diagnostic grace),
// though the communicator had already failed.
TEST(CommLifecycle, AsyncErrorIsTheFailureFromAbortOn) {
  HashStore store;
  HeldFailureReports held(&store);
  auto comms = testing::makeComms(2, &held, "tcp", "held");
  ASSERT_TRUE(comms.ok()) << comms.status();
  (*comms)[0]->abort();
  const Status early = (*comms)[0]->asyncError();
  held.release();
  EXPECT_EQ(early.code(), StatusCode::kAborted) << early;
  EXPECT_NE(early.message().find("aborted by the application"), std::string::npos) << early;
}

// An allreduce path whose operations run until cancelled (aggregators that never answer).
class StuckPath final : public AllreducePath {
 public:
  class Op final : public PendingOp {
   public:
    Status wait(Deadline deadline) override {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_until(lock, deadline.when(), [&] { return cancelled_; })) {
        return DeadlineExceeded("still running on the stuck path");
      }
      return why_;
    }
    bool test() const override {
      std::lock_guard<std::mutex> lock(mu_);
      return cancelled_;
    }
    Status status() const override {
      std::lock_guard<std::mutex> lock(mu_);
      return why_;
    }
    void cancel(const Status& why) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return;
      cancelled_ = true;
      why_ = why;
      cv_.notify_all();
    }

   private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool cancelled_ = false;
    Status why_;
  };
  std::string name() const override { return "stuck"; }
  bool serves(ReduceOp, DType) const override { return true; }
  std::shared_ptr<PendingOp> start(const TensorView&, const TensorView&, ReduceOp,
                                   Deadline) override {
    started.push_back(std::make_shared<Op>());
    return started.back();
  }
  std::vector<std::shared_ptr<Op>> started;
};

// Allreduces handed to CommOptions::allreducePath run outside the communicator's queue, and
// abort() and the destructor did not know them: after abort() they ran on (and a new one still
// started), and a communicator destroyed under one left it reading `in` and writing `out`
// after the caller had taken them back. Both now cancel them; a failed communicator starts none.
TEST(CommLifecycle, AllreducesOnThePathAreCancelledByAbortAndByDestruction) {
  HashStore store;
  auto path = std::make_shared<StuckPath>();
  CommOptions o;
  o.name = "aborted";
  o.allreducePath = path;
  auto aborted = Communicator::create(0, 1, &store, o);
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  float x = 1.0f;
  const TensorView one(&x, 1, DType::kF32);
  AllreduceOptions a;
  a.timeout = Millis(60000);
  CollectiveHandle running = allreduceAsync(**aborted, one, one, a);
  (*aborted)->abort();
  const Status cancelled = running.wait(Deadline::afterMs(5000));
  EXPECT_EQ(cancelled.code(), StatusCode::kAborted) << cancelled;
  const Status later = allreduceAsync(**aborted, one, one, a).wait(Deadline::afterMs(5000));
  EXPECT_EQ(later.code(), StatusCode::kAborted) << later;
  EXPECT_EQ(path->started.size(), 1u) << "an aborted communicator started an allreduce";

  o.name = "destroyed";
  auto destroyed = Communicator::create(0, 1, &store, o);
  ASSERT_TRUE(destroyed.ok()) << destroyed.status();
  CollectiveHandle orphan = allreduceAsync(**destroyed, one, one, a);
  ASSERT_EQ(path->started.size(), 2u);
  destroyed->reset();
  EXPECT_TRUE(path->started[1]->test()) << "destroyed with its allreduce running on the path";
  EXPECT_EQ(orphan.wait(Deadline::afterMs(0)).code(), StatusCode::kAborted);
}

// The block check of reduce_scatter and allgather cannot wrap: with 9 ranks, 9 blocks of
// 2049638230412172402 bytes (under validate()'s bound) "made" 2 bytes, the call was taken and
// ran on absurd sizes. Refused before anything is sent.
TEST(CommSetup, BlockCountsThatWouldWrapAreRefused) {
  auto g = makeGroup(9);
  ASSERT_TRUE(g);
  Communicator& c1 = *g->comms[1];
  constexpr size_t kBlock = 2049638230412172402u;  // ceil(2^64 / 9)
  static_assert(kBlock * 9 == 2);
  uint8_t bytes[4] = {};  // `huge` only starts past `two`: the buffers must not overlap
  const TensorView huge(bytes + 2, kBlock, DType::kU8), two(bytes, 2, DType::kU8);
  ReduceScatterOptions o;
  o.timeout = Millis(2000);
  const Status rs = reduceScatter(c1, two, huge, o);
  EXPECT_EQ(rs.code(), StatusCode::kInvalidArgument) << rs;
  const Status ag = allgather(c1, huge, two, o);
  EXPECT_EQ(ag.code(), StatusCode::kInvalidArgument) << ag;
}

// Buffers that overlap without being the documented in-place form (allreduce: the same view;
// allgather / reduce_scatter: the small buffer is the rank's block of the large one) are refused
// before anything is sent: chunked sends read the input late, so a peer would receive bytes
// already overwritten by a result.
TEST(CommSetup, OverlappingBuffersOtherThanTheInPlaceFormAreRefused) {
  auto g = makeGroup(2);
  ASSERT_TRUE(g);
  Communicator& c1 = *g->comms[1];
  std::vector<float> f(16, 1.0f);
  const auto view = [&](size_t from, size_t n) { return TensorView(f.data() + from, n, DType::kF32); };
  const Status shifted = allreduce(c1, view(0, 8), view(4, 8));
  EXPECT_EQ(shifted.code(), StatusCode::kInvalidArgument) << shifted;
  // allgather on rank 1: in must be out's block 1 (f[4..8)) or apart from out (f[0..8)).
  EXPECT_EQ(allgather(c1, view(0, 4), view(0, 8)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(allgather(c1, view(2, 4), view(0, 8)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduceScatter(c1, view(0, 8), view(0, 4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduceScatter(c1, view(0, 8), view(6, 4)).code(), StatusCode::kInvalidArgument);
  // The documented forms, and disjoint buffers, still run (both ranks take part).
  auto st = runThreadRanks(2, [&](int r) -> Status {
    std::vector<float> buf(8, static_cast<float>(r + 1)), in(4, 1.0f), out(8);
    Communicator& c = *g->comms[r];
    const TensorView whole(buf.data(), 8, DType::kF32);
    const TensorView mine(buf.data() + 4 * r, 4, DType::kF32);
    CollectiveOptions ao;
    ao.timeout = Millis(10000);
    ReduceScatterOptions ro;
    ro.timeout = Millis(10000);
    COFAB_RETURN_IF_ERROR(allgather(c, mine, whole, ao));
    COFAB_RETURN_IF_ERROR(reduceScatter(c, whole, mine, ro));
    COFAB_RETURN_IF_ERROR(allreduce(c, TensorView(in.data(), 4, DType::kF32),
                                    TensorView(out.data(), 4, DType::kF32), quick()));
    return OkStatus();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

// A sub-communicator listens on its parent's host (with a port of its own): split() used to
// drop CommOptions::listenAddress, so on a multi-host job without COFAB_SOCKET_IFNAME the
// sub-communicator published 127.0.0.1 and remote ranks dialled their own loopback.
TEST(CommSplit, SubCommunicatorsListenOnTheParentsHost) {
  HashStore store;
  std::vector<std::unique_ptr<Communicator>> subs(2);
  auto st = runThreadRanks(2, [&](int r) -> Status {
    CommOptions o;
    o.name = "split-listen";
    o.listenAddress = r == 0 ? "127.0.0.2" : "127.0.0.2:0";  // both forms, port or not
    o.setupTimeout = Millis(20000);
    COFAB_ASSIGN_OR_RETURN(auto parent, Communicator::create(r, 2, &store, o));
    COFAB_ASSIGN_OR_RETURN(subs[static_cast<size_t>(r)], parent->split(0, r, Millis(10000)));
    CollectiveOptions bo;
    bo.timeout = Millis(10000);
    COFAB_RETURN_IF_ERROR(barrier(*subs[static_cast<size_t>(r)], bo));
    subs[static_cast<size_t>(r)].reset();
    return barrier(*parent, bo);
  });
  ASSERT_TRUE(cofab::testing::allOk(st).ok()) << describe(st);
  for (int r = 0; r < 2; ++r) {
    // "<name>/<generation>/split<i>/color<c>" + "/<generation>/addr/<rank>"
    auto addr = store.get("split-listen/1/split0/color0/1/addr/" + std::to_string(r),
                          Deadline::afterMs(1000));
    ASSERT_TRUE(addr.ok()) << addr.status();
    EXPECT_EQ(toString(*addr).rfind("127.0.0.2:", 0), 0u) << "rank " << r << ": " << toString(*addr);
  }
}

TEST(CommSplit, SubCommunicatorsReduceWithinTheirColor) {
  auto g = makeGroup(5);
  ASSERT_TRUE(g);
  auto st = runThreadRanks(5, [&](int r) -> Status {
    // Rank 4 opts out; the others form {0, 2} and {1, 3}, ordered by descending rank.
    const int color = r == 4 ? -1 : r % 2;
    COFAB_ASSIGN_OR_RETURN(auto sub, g->comms[r]->split(color, -r, Millis(10000)));
    CollectiveOptions bo;
    bo.timeout = Millis(10000);
    if (r == 4) {
      if (sub != nullptr) return Internal("expected no communicator");
      return barrier(*g->comms[r], bo);
    }
    if (sub->size() != 2) return Internal("sub size " + std::to_string(sub->size()));
    const int want = r >= 2 ? 0 : 1;
    if (sub->rank() != want) return Internal("sub rank " + std::to_string(sub->rank()));
    std::vector<int32_t> v(5, r);
    COFAB_RETURN_IF_ERROR(allreduce(*sub, TensorView(v.data(), 5, DType::kI32), quick()));
    const int sum = color == 0 ? 0 + 2 : 1 + 3;
    if (v[4] != sum) return Internal("sub allreduce gave " + std::to_string(v[4]));
    // The parent still works after the split.
    return barrier(*g->comms[r], bo);
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << describe(st);
}

// A scratch the ring cannot have is the operation's error on every rank, not an abort of the
// process (a COFAB_CHECK used to end it). Reduce-scatter over 3 ranks keeps a block in scratch:
// blocks of 2^47 bytes fit no address space, so the allocation fails wherever this runs. The
// tensors are never touched before it (nothing is posted), so their addresses are made up:
// disjoint, and far from any real mapping.
TEST(CommResources, AScratchThatCannotBeAllocatedIsAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer aborts on an allocation past its maximum size "
                  "(allocator_may_return_null is off), before the library can see the failure";
#endif
  auto g = makeGroup(3);
  ASSERT_TRUE(g);
  const size_t block = size_t{1} << 45;  // f32: 2^47 bytes
  auto st = runThreadRanks(3, [&](int r) -> Status {
    const TensorView in(reinterpret_cast<void*>(uintptr_t{1} << 49), 3 * block, DType::kF32);
    const TensorView out(reinterpret_cast<void*>(uintptr_t{1} << 12), block, DType::kF32);
    ReduceScatterOptions o;
    o.timeout = Millis(10000);
    return reduceScatter(*g->comms[r], in, out, o);
  });
  bool named = false;
  for (const auto& s : st) {
    EXPECT_FALSE(s.ok()) << describe(st);
    named = named || (s.code() == StatusCode::kResourceExhausted &&
                      s.message().find("scratch") != std::string::npos);
  }
  EXPECT_TRUE(named) << "no rank says the scratch could not be allocated:" << describe(st);
}

}  // namespace
}  // namespace cofab::comm
