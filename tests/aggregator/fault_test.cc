// Faults with real processes: a worker SIGKILLed mid-round (the daemon names it, releases the
// round after its deadline, the other workers fail with that error instead of hanging), and the
// primary daemon SIGKILLed mid-job with replication on (the job completes bit-identical to the
// serial reference: nothing lost, nothing applied twice).
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "fabric/ps/placement.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/raw_peer.h"
#include "tests/aggregator/test_data.h"
#include "tests/support/process_group.h"
#include "tests/support/thread_ranks.h"

namespace cofab::testing {
namespace {

// Worker 0 opens round 0 of key 3 and waits for it to be released: the RoundFailed text, or an
// error naming what came instead.
StatusOr<std::string> roundFailedText(RawPeer& w0) {
  COFAB_RETURN_IF_ERROR(
      w0.sendValues(RawPeer::push(0, 3, 0, DType::kF32), std::vector<float>{1, 2}));
  COFAB_ASSIGN_OR_RETURN(RawMessage failed, w0.recvSkippingAcks());
  if (!failed.isControl(ps::ControlOp::kRoundFailed)) {
    return FailedPrecondition("expected RoundFailed, got " + failed.header.describe());
  }
  return std::string(failed.payload.begin(), failed.payload.end());
}

TEST(AggregatorFaults, WorkerKilledMidRoundIsNamedAndTheRoundReleased) {
  const int kWorkers = 3;
  DaemonCluster cluster(1, kWorkers, {"--dead-worker-ms", "300"});
  ASSERT_TRUE(cluster.start().ok());
  const std::string url = cluster.storeUrl();
  ProcessGroup group;
  group.start(kWorkers, [&](int rank) -> int {
    auto store = openStore(url, Deadline::afterMs(10000));
    if (!store.ok()) return childFail(rank, store.status().toString());
    auto client = ps::PushPullClient::connect(**store, rank, kWorkers, {});
    if (!client.ok()) return childFail(rank, client.status().toString());
    std::vector<float> x(10000, 1.0f);
    const TensorView v = TensorView::of(x.data(), x.size(), DType::kF32);
    Status s = (*client)->pushPull(1, v, v).wait(Deadline::afterMs(20000));
    if (!s.ok()) return childFail(rank, "round 0: " + s.toString());
    if (rank == 2) {
      // Never pushes iteration 1: the test kills it while the others wait for it.
      (void)(*store)->set("test/worker2-ready", toBytes("1"));
      pause();
      return 0;
    }
    s = (*client)->pushPull(1, v, v).wait(Deadline::afterMs(20000));
    if (s.code() != StatusCode::kAborted) {
      return childFail(rank, "expected Aborted naming worker 2, got " + s.toString());
    }
    if (s.message().find("worker 2") == std::string::npos ||
        s.message().find("connection lost") == std::string::npos) {
      return childFail(rank, "the error does not name the dead worker: " + s.toString());
    }
    // Sticky: later operations fail with the same error instead of waiting.
    Status later = (*client)->pushPull(2, v, v).wait(Deadline::afterMs(5000));
    if (later.code() != StatusCode::kAborted) {
      return childFail(rank, "a later push-pull should fail fast, got " + later.toString());
    }
    return 0;
  });
  ASSERT_TRUE(cluster.store().get("test/worker2-ready", Deadline::afterMs(20000)).ok());
  group.signal(2, SIGKILL);
  auto exits = group.waitAll(Deadline::afterMs(30000));
  exits.erase(exits.begin() + 2);  // the one we killed
  EXPECT_EQ(failures(exits), "");
  EXPECT_GE(*cluster.metric(0, "cofab_agg_rounds_failed_total"), 1);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_workers_lost_total"), 1);
  auto health = cluster.httpGet(0, "/healthz");
  EXPECT_TRUE(health.ok()) << "the daemon must stay up: " << health.status();
}

// A worker whose connection broke and who connects again is waited for like any live worker:
// its old loss must not release the rounds it has not pushed yet (the dead-worker deadline,
// 1 ms here, passed long ago by then).
TEST(AggregatorFaults, AWorkerThatReconnectsIsNoLongerCountedAsLost) {
  DaemonCluster cluster(1, 2, {"--dead-worker-ms", "1"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 3, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack: round 0 of key 3 waits for worker 1
  {
    auto gone = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(gone.ok()) << gone.status();
    ASSERT_TRUE(
        (*gone)->sendValues(RawPeer::push(1, 9, 0, DType::kF32), std::vector<float>{5, 6}).ok());
    ASSERT_TRUE((*gone)->recv().ok());  // the ack: this link carries worker 1's state
  }                                     // broken without a goodbye: a lost worker
  // Round 0 of key 3 is released for the loss: the dead-worker deadline has passed.
  auto failed = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(failed.ok()) << failed.status();
  ASSERT_TRUE(failed->isControl(ps::ControlOp::kRoundFailed)) << failed->header.describe();

  // Worker 1 is back; worker 0 opens round 1 of key 3 before worker 1 pushes to it.
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w1.ok()) << w1.status();
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 3, 1, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack: the round is open
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 3, 1, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
}

// A worker whose only connection breaks before its first push (it died while starting up) is
// lost too: the rounds waiting for it are released after the dead-worker deadline, naming it as
// not yet pushed, not after the round timeout (an hour here) as if it were still connected.
TEST(AggregatorFaults, AConnectionThatBreaksBeforeItsFirstPushIsALostWorker) {
  DaemonCluster cluster(1, 2, {"--dead-worker-ms", "1", "--round-timeout-ms", "3600000"});
  ASSERT_TRUE(cluster.start().ok());
  {
    auto gone = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(gone.ok()) << gone.status();
  }  // broken without a goodbye, never pushed
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_workers_lost_total", 1).ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  auto why = roundFailedText(**w0);
  ASSERT_TRUE(why.ok()) << why.status();
  EXPECT_NE(why->find("worker 1 (connection lost"), std::string::npos) << *why;
  EXPECT_NE(why->find("(not yet pushed)"), std::string::npos) << *why;
}

// A fan-out round (coded shuffling: one uploader, the others pull) that only pulls have reached
// does not wait for every worker, so a lost worker cannot be the one it misses: the pulls wait
// for the upload. They were released after the dead-worker deadline, naming the lost worker,
// although the uploader was alive and uploaded a moment later.
TEST(AggregatorFaults, ALostWorkerDoesNotReleaseAPullWaitingForAFanOutUpload) {
  DaemonCluster cluster(1, 3, {"--dead-worker-ms", "1", "--round-timeout-ms", "3600000"});
  ASSERT_TRUE(cluster.start().ok());
  {
    auto gone = RawPeer::connect(cluster.address(0), "worker 2");
    ASSERT_TRUE(gone.ok()) << gone.status();
  }  // broken without a goodbye: worker 2 is lost
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_workers_lost_total", 1).ok());
  auto puller = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(puller.ok()) << puller.status();
  wire::Header pull = RawPeer::push(1, 7, 0, DType::kF32);
  pull.type = wire::MessageType::kPull;
  pull.opcode = 0;
  ASSERT_TRUE((*puller)->send(pull, {}).ok());
  // The engine checks its open rounds every 50 ms: give it several checks with the pull waiting
  // (this only makes the old behaviour show; the test cannot pass by timing).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto uploader = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(uploader.ok()) << uploader.status();
  const std::vector<float> rows{1, 2, 3, 4};
  ASSERT_TRUE(
      (*uploader)->sendValues(RawPeer::push(0, 7, 0, DType::kF32, 1, ps::kPushFanOut), rows).ok());
  auto got = (*puller)->recvResult();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, rows);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_failed_total"), 0);
}

// A worker that closed its client (Goodbye) with nothing else of it connected cannot push to
// the rounds still waiting for it: they are released after the dead-worker deadline, naming it
// as gone with that reason. They used to wait the round timeout (an hour here) and then named
// it "(connected, not yet pushed)", a process that had exited.
TEST(AggregatorFaults, AWorkerThatSaidGoodbyeIsNamedAsGoneAndItsRoundsReleased) {
  DaemonCluster cluster(1, 2, {"--dead-worker-ms", "1", "--round-timeout-ms", "3600000"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  {
    auto leaving = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(leaving.ok()) << leaving.status();
    wire::Header bye;
    bye.type = wire::MessageType::kGoodbye;
    bye.senderRank = 1;
    ASSERT_TRUE((*leaving)->send(bye, {}).ok());
  }
  auto why = roundFailedText(**w0);
  ASSERT_TRUE(why.ok()) << why.status();
  EXPECT_NE(why->find("worker 1 (left"), std::string::npos) << *why;
  EXPECT_NE(why->find("Goodbye"), std::string::npos) << *why;
  // Not a broken connection: the lost-worker count stays 0.
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_workers_lost_total"), 0);
}

// The same after the worker came back once: connect, Goodbye, close, twice over (a restarted
// process that left again before pushing). The reconnect posted Back but left the worker marked
// as gone, so the second Goodbye posted nothing, and its rounds waited the round timeout,
// naming it as connected.
TEST(AggregatorFaults, AWorkerThatLeavesAgainAfterReconnectingIsNamedAsGone) {
  DaemonCluster cluster(1, 2, {"--dead-worker-ms", "1", "--round-timeout-ms", "3600000"});
  ASSERT_TRUE(cluster.start().ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok()) << w0.status();
  auto visit = [&] {
    auto leaving = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(leaving.ok()) << leaving.status();
    wire::Header bye;
    bye.type = wire::MessageType::kGoodbye;
    bye.senderRank = 1;
    ASSERT_TRUE((*leaving)->send(bye, {}).ok());
  };
  visit();
  auto first = roundFailedText(**w0);  // round 0 of key 3: the first Goodbye is taken
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(first->find("worker 1 (left"), std::string::npos) << *first;
  visit();
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 4, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  auto failed = (*w0)->recvSkippingAcks();
  ASSERT_TRUE(failed.ok()) << failed.status() << " (the round waits for worker 1)";
  ASSERT_TRUE(failed->isControl(ps::ControlOp::kRoundFailed)) << failed->header.describe();
  const std::string why(failed->payload.begin(), failed->payload.end());
  EXPECT_NE(why.find("worker 1 (left"), std::string::npos) << why;
}

// A worker is lost only once no connection of it is left: while a second one is open (a
// reconnect the daemon accepted before it noticed the old link break, or a second client), the
// broken link does not release its rounds; that connection carries its pushes instead.
TEST(AggregatorFaults, ABrokenLinkWithAnotherConnectionOpenIsNotALostWorker) {
  DaemonCluster cluster(1, 2, {"--dead-worker-ms", "1"});
  ASSERT_TRUE(cluster.start().ok());
  auto spare = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(spare.ok()) << spare.status();
  {
    auto first = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(
        (*first)->sendValues(RawPeer::push(1, 3, 0, DType::kF32), std::vector<float>{5, 6}).ok());
    ASSERT_TRUE((*first)->recv().ok());  // the ack: this link carries worker 1's state
  }                                      // broken without a goodbye
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_connections_broken_total", 1).ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  ASSERT_TRUE(w0.ok());
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 4, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*w0)->recv().ok());  // the ack: the round is open
  ASSERT_TRUE(
      (*spare)->sendValues(RawPeer::push(1, 4, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*spare}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_workers_lost_total"), 0);
  // Its last connection breaks too: now it is lost.
  spare->reset();
  EXPECT_TRUE(cluster.waitMetric(0, "cofab_agg_workers_lost_total", 1).ok());
}

// Worker 1's link to daemon 0 breaks while daemon 0 lives, and worker 1 carries on through
// daemon 0's backup (daemon 1), which forwards its contributions to daemon 0's chunks back to
// daemon 0. Those forwards show daemon 0 that worker 1 is alive: its rounds wait for it. They
// were released after --dead-worker-ms instead, failing worker 0, whose pushes come first.
TEST(AggregatorFaults, AWorkerThatFailedOverToTheBackupIsNotLostOnThePrimary) {
  DaemonCluster cluster(2, 2, {"--replication", "on", "--dead-worker-ms", "300"});
  ASSERT_TRUE(cluster.start().ok());
  uint64_t key = 1;
  while (ps::primaryServer(key, 0, 2) != 0) ++key;
  {
    auto broken = RawPeer::connect(cluster.address(0), "worker 1");
    ASSERT_TRUE(broken.ok()) << broken.status();
  }  // broken without a goodbye, before its first push: worker 1 is lost on daemon 0
  ASSERT_TRUE(cluster.waitMetric(0, "cofab_agg_workers_lost_total", 1).ok());
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(1), "worker 1");  // failed over to the backup
  ASSERT_TRUE(w0.ok() && w1.ok());
  for (uint64_t it = 0; it < 2; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    ASSERT_TRUE(
        (*w0)->sendValues(RawPeer::push(0, key, it, DType::kF32), std::vector<float>{1, 2}).ok());
    if (it == 1) {  // worker 1 comes well after --dead-worker-ms
      auto ack = (*w0)->recv();
      ASSERT_TRUE(ack.ok() && ack->isControl(ps::ControlOp::kAck)) << ack.status();
      std::this_thread::sleep_for(Millis(1000));
    }
    ASSERT_TRUE(
        (*w1)->sendValues(RawPeer::push(1, key, it, DType::kF32), std::vector<float>{10, 20}).ok());
    for (auto* w : {&*w0, &*w1}) {
      auto sum = (*w)->recvResult();
      ASSERT_TRUE(sum.ok()) << sum.status();
      EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
    }
  }
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_failed_total"), 0);
}

// The backup refuses a forwarded chunk (here: it is draining after SIGTERM, held open by a
// round of its own): the primary must not wait for that chunk's ack until the round times out.
// Replication ends as if the backup were gone, and the primary's round completes.
TEST(AggregatorFaults, ABackupThatRefusesForwardedChunksEndsReplication) {
  DaemonCluster cluster(
      2, 2, {"--replication", "on", "--drain-timeout-ms", "30000", "--round-timeout-ms", "60000"});
  ASSERT_TRUE(cluster.start().ok());
  // Daemon 1 (daemon 0's backup) gets a round of its own that stays open: it drains, not exits.
  auto held = RawPeer::connect(cluster.address(1), "worker 0");
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(
      (*held)->sendValues(RawPeer::push(0, 9, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE((*held)->recv().ok());  // its ack
  cluster.signal(1, SIGTERM);
  const Deadline draining = Deadline::afterMs(15000);
  while (!draining.expired()) {
    auto h = cluster.httpGet(1, "/healthz");  // HTTP 503 "draining" comes back as an error
    if (!h.ok() && h.status().message().find("draining") != std::string::npos) break;
    std::this_thread::sleep_for(Millis(5));
  }
  ASSERT_FALSE(draining.expired()) << "daemon 1 never reported draining";
  auto w0 = RawPeer::connect(cluster.address(0), "worker 0");
  auto w1 = RawPeer::connect(cluster.address(0), "worker 1");
  ASSERT_TRUE(w0.ok() && w1.ok());
  ASSERT_TRUE(
      (*w0)->sendValues(RawPeer::push(0, 4, 0, DType::kF32), std::vector<float>{1, 2}).ok());
  ASSERT_TRUE(
      (*w1)->sendValues(RawPeer::push(1, 4, 0, DType::kF32), std::vector<float>{10, 20}).ok());
  for (auto* w : {&*w0, &*w1}) {
    auto sum = (*w)->recvResult();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, (std::vector<float>{11, 22}));
  }
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_backup_lost_total"), 1);
}

struct Tensor {
  uint64_t key;
  size_t count;
  DType dtype;
};

// 2 workers push-pull four tensors for kIterations; daemon `victim` (0) gets `sig` (SIGKILL)
// while chunks of iteration kKillAt are in flight. Every result must equal the serial reference, bit for bit,
// and every worker must have failed over once. Returns the total chunks per iteration.
constexpr int kKilledJobWorkers = 2;
constexpr int kKilledJobIterations = 16;

size_t runJobKillingDaemon0(DaemonCluster& cluster, ps::Delivery delivery, int victim = 0,
                            int sig = SIGKILL) {
  const int kWorkers = kKilledJobWorkers;
  const int kIterations = kKilledJobIterations;
  const int kKillAt = 6;
  const std::vector<Tensor> tensors = {{1, 30000, DType::kF32},
                                       {2, 3000, DType::kF16},
                                       {3, 100, DType::kF64},
                                       {4, 20000, DType::kBF16}};
  std::atomic<bool> killNow{false};
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    while (!killNow.load()) std::this_thread::sleep_for(Millis(1));
    cluster.signal(victim, sig);
    killed = true;
  });
  // results[rank][iteration][tensor]
  std::vector<std::vector<std::vector<std::vector<uint8_t>>>> results(kWorkers);
  std::vector<ps::ClientStats> stats(kWorkers);
  auto statuses = runThreadRanks(kWorkers, [&](int rank) -> Status {
    ps::ClientOptions co;
    co.chunkBytes = 8192;
    co.replication = 1;
    co.heartbeatMs = 100;
    co.failoverMs = 2000;
    COFAB_ASSIGN_OR_RETURN(auto client, cluster.connect(rank, co));
    for (int it = 0; it < kIterations; ++it) {
      std::vector<std::vector<uint8_t>> bufs;
      std::vector<ps::PushPullHandle> handles;
      for (const auto& t : tensors) {
        bufs.push_back(makeTensor(t.dtype, t.count, rank, t.key, static_cast<uint64_t>(it)));
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        const TensorView v(bufs[i].data(), tensors[i].count, tensors[i].dtype);
        ps::PushPullOptions po;
        po.delivery = delivery;
        handles.push_back(client->pushPull(tensors[i].key, v, v, po));  // in place
      }
      if (rank == 0 && it == kKillAt) killNow = true;  // chunks are in flight right now
      for (auto& h : handles) COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
      results[static_cast<size_t>(rank)].push_back(std::move(bufs));
    }
    stats[static_cast<size_t>(rank)] = client->stats();
    client->close();
    return OkStatus();
  });
  killNow = true;
  killer.join();
  EXPECT_TRUE(allOk(statuses).ok()) << allOk(statuses);
  EXPECT_TRUE(killed.load());
  if (!allOk(statuses).ok()) return 0;
  for (int it = 0; it < kIterations; ++it) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < kWorkers; ++r) {
        inputs.push_back(makeTensor(tensors[i].dtype, tensors[i].count, r, tensors[i].key,
                                    static_cast<uint64_t>(it)));
      }
      const auto expected = referenceReduce(tensors[i].dtype, false, inputs);
      for (int r = 0; r < kWorkers; ++r) {
        EXPECT_EQ(results[static_cast<size_t>(r)][static_cast<size_t>(it)][i], expected)
            << "worker " << r << " iteration " << it << " key " << tensors[i].key;
      }
    }
  }
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(stats[static_cast<size_t>(r)].failovers, 1u) << "worker " << r;
  }
  size_t chunks = 0;
  for (const auto& t : tensors) {
    chunks += ps::chunkLayout(t.count, dtypeSize(t.dtype), 8192).chunkCount;
  }
  return chunks;
}

class PrimaryKilledTest : public ::testing::TestWithParam<ps::Delivery> {};

TEST_P(PrimaryKilledTest, JobWithReplicationFinishesBitIdentical) {
  DaemonCluster cluster(2, kKilledJobWorkers, {"--replication", "on"});
  ASSERT_TRUE(cluster.start().ok());
  const size_t chunks = runJobKillingDaemon0(cluster, GetParam());
  ASSERT_GT(chunks, 0u);
  // The survivor applied every contribution exactly once: rounds = chunks x iterations.
  EXPECT_EQ(*cluster.metric(1, "cofab_agg_rounds_completed_total"),
            static_cast<double>(chunks * kKilledJobIterations));
  EXPECT_EQ(*cluster.metric(1, "cofab_agg_chunks_applied_total"),
            static_cast<double>(chunks * kKilledJobIterations * kKilledJobWorkers));
  EXPECT_EQ(*cluster.metric(1, "cofab_agg_rounds_failed_total"), 0);
  EXPECT_GT(*cluster.metric(1, "cofab_agg_forwarded_applied_total"), 0);
  cluster.signal(1, SIGTERM);
  EXPECT_EQ(cluster.wait(1, Deadline::afterMs(20000)), 0);
}

// A backup that goes silent without resetting its connections (SIGSTOP here; a host that
// vanishes): its primary waited for ForwardAcks that never came, each of its rounds until the
// round timeout, and the job failed. Replication now ends after --backup-ack-timeout-ms, and
// the workers' failover (heartbeat) moves the stopped daemon's chunks to the other one.
TEST(AggregatorFaults, ASilentBackupEndsReplicationAndTheJobFinishes) {
  DaemonCluster cluster(2, kKilledJobWorkers,
                        {"--replication", "on", "--backup-ack-timeout-ms", "1000",
                         "--round-timeout-ms", "15000"});
  ASSERT_TRUE(cluster.start().ok());
  ASSERT_GT(runJobKillingDaemon0(cluster, ps::Delivery::kPushBack, 1, SIGSTOP), 0u);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_backup_lost_total"), 1);
  EXPECT_EQ(*cluster.metric(0, "cofab_agg_rounds_failed_total"), 0);
  cluster.signal(1, SIGKILL);
}

// Three daemons: daemon 0's chunks fail over to daemon 1, its backup. Daemon 1 must not
// forward them on to its own backup, daemon 2, which holds no round for them: it rejected them
// as beyond its window, and daemon 1 dropped replication of its own chunks, healthy backup and
// all ("backup lost").
TEST(AggregatorFaults, FailedOverChunksAreNotForwardedToAThirdDaemon) {
  DaemonCluster cluster(3, kKilledJobWorkers, {"--replication", "on"});
  ASSERT_TRUE(cluster.start().ok());
  ASSERT_GT(runJobKillingDaemon0(cluster, ps::Delivery::kPushBack), 0u);
  EXPECT_EQ(*cluster.metric(1, "cofab_agg_backup_lost_total"), 0);
  EXPECT_EQ(*cluster.metric(2, "cofab_agg_rounds_failed_total"), 0);
  EXPECT_EQ(*cluster.metric(1, "cofab_agg_rounds_failed_total"), 0);
  EXPECT_GT(*cluster.metric(2, "cofab_agg_forwarded_applied_total"), 0);  // 1's own chunks
}

INSTANTIATE_TEST_SUITE_P(AggregatorFaults, PrimaryKilledTest,
                         ::testing::Values(ps::Delivery::kPushBack, ps::Delivery::kPull),
                         [](const auto& info) {
                           return info.param == ps::Delivery::kPull ? "pull" : "push";
                         });

}  // namespace
}  // namespace cofab::testing
