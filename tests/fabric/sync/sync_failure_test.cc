// Failures of the training-sync algorithms (fabric/sync). A step whose push-pull timed out fails
// for good: the later steps and finish() return that Status, and no operation is left running on
// the algorithm's buffers (its other tensors are waited for, or cancelled by closing the client).
// Worker 0 is the algorithm, the other worker a raw push-pull client that the test drives: it
// takes part in start(), then does not push the first round, so worker 0's short operation
// timeout certainly expires; it then pushes that round and the next, which would let a later
// step() of worker 0 go through on buffers the first step's operations still targeted.
// finish() after a start() that failed on its layout is FailedPrecondition, never an abort, and
// so is step() after any failed start() (on its layout, or connecting after the layout was set).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "aggregator/daemon_config.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/hash_store.h"
#include "fabric/sync/sync_algorithm.h"
#include "tests/support/forwarding_store.h"

namespace cofab::sync {
namespace {

// The keys of start() (bsp_sync.cc, gradcode_sync.cc); rounds use the keys below them.
constexpr uint64_t kInitialKeys = 1u << 20;
constexpr uint64_t kCheckKey = 1u << 21;  // gradcode's configuration check
// Two tensors, so that one can still be in flight when the first one's wait gives up.
const std::vector<size_t> kLayout = {64, 32};
constexpr size_t kModel = 96;
// Worker 0's timeout: start()'s rounds complete as soon as its chunks arrive (the peer pushed
// its part first); the first step's never do (the peer has not pushed it).
constexpr int64_t kTimeoutMs = 3000;
// The test's own bounded waits, for operations that complete without waiting on a timeout.
constexpr int64_t kWaitMs = 20000;

// drainTimeoutMs 0: the peer's last round stays open, do not wait for it at shutdown.
std::unique_ptr<aggregator::AggregatorServer> makeServer(int workers, int gradientStragglers,
                                                         int64_t drainTimeoutMs = 0) {
  aggregator::ServerOptions so;
  so.numWorkers = workers;
  so.listenAddress = "127.0.0.1:0";
  so.drainTimeoutMs = drainTimeoutMs;
  so.engine.gradientStragglers = gradientStragglers;
  auto server = aggregator::AggregatorServer::create(so);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  return std::move(*server);
}

// A worker that is not a SyncAlgorithm: a push-pull client whose pushes the test makes. Every
// push has a buffer of its own, kept until the client is closed (the destructor, first).
class RawWorker {
 public:
  ~RawWorker() {
    if (client_ != nullptr) client_->close();
  }

  Status connect(int rank, int worldSize, const std::string& address) {
    ps::ClientOptions options;
    options.serverAddresses = {address};
    COFAB_ASSIGN_OR_RETURN(client_, ps::PushPullClient::connect(rank, worldSize, options));
    return OkStatus();
  }

  // The next iteration of `key` (the client's own counter), `count` floats of `value`.
  ps::PushPullHandle push(uint64_t key, size_t count, float value, ps::ReduceOp op) {
    buffers_.push_back(std::make_unique<std::vector<float>>(count, value));
    TensorView view(buffers_.back()->data(), count, DType::kF32);
    ps::PushPullOptions options;
    options.op = op;
    return client_->pushPull(key, view, view, options);
  }

  // One push per tensor of kLayout, on keys keyBase + t.
  std::vector<ps::PushPullHandle> pushLayout(uint64_t keyBase, float value, ps::ReduceOp op) {
    std::vector<ps::PushPullHandle> handles;
    for (size_t t = 0; t < kLayout.size(); ++t) {
      handles.push_back(push(keyBase + t, kLayout[t], value, op));
    }
    return handles;
  }

 private:
  std::vector<std::unique_ptr<std::vector<float>>> buffers_;
  std::unique_ptr<ps::PushPullClient> client_;  // after the buffers: closed before they go
};

// Worker 0 of 2 running "sync" against `daemon`, plain SGD (lr 1, no momentum).
StatusOr<std::unique_ptr<SyncAlgorithm>> makeWorker0Sync(const std::string& daemon,
                                                         int64_t timeoutMs) {
  SyncEnv env;
  env.rank = 0;
  env.worldSize = 2;
  env.client.serverAddresses = {daemon};
  SyncOptions o;
  o.algorithm = "sync";
  o.lr = 1.0f;
  o.momentum = 0.0f;
  o.timeoutMs = timeoutMs;
  return makeSyncAlgorithm(o, env);
}

Status waitEvery(const std::vector<ps::PushPullHandle>& handles) {
  const Deadline d = Deadline::afterMs(kWaitMs);
  for (const ps::PushPullHandle& h : handles) COFAB_RETURN_IF_ERROR(h.wait(d));
  return OkStatus();
}

// sync with 2 workers: the first step times out while the peer holds back round 0; the peer
// then pushes rounds 0 and 1, so a second step would complete round 1 (before the fix it did,
// returning OK, while round 0's late results were still being received into the buffer it was
// refilling). It must return the first step's error instead, and finish() too, with the model
// untouched by the failed steps.
TEST(SyncFailureTest, BspStepThatTimedOutFailsEveryLaterStep) {
  auto server = makeServer(/*workers=*/2, /*gradientStragglers=*/-1);
  ASSERT_TRUE(server != nullptr);
  RawWorker peer;
  Status connected = peer.connect(/*rank=*/1, /*worldSize=*/2, server->address());
  ASSERT_TRUE(connected.ok()) << connected;
  // The peer's part of start(): the exact average of the initial models (all ones).
  std::vector<ps::PushPullHandle> initial =
      peer.pushLayout(kInitialKeys, 1.0f, ps::ReduceOp::kAverage);

  auto algo = makeWorker0Sync(server->address(), kTimeoutMs);
  ASSERT_TRUE(algo.ok()) << algo.status();
  std::vector<float> model(kModel, 1.0f);
  Status started = (*algo)->start(model, kLayout);
  ASSERT_TRUE(started.ok()) << started;
  Status initialDone = waitEvery(initial);
  ASSERT_TRUE(initialDone.ok()) << initialDone;

  std::vector<float> grad(kModel, 2.0f);
  const Status first = (*algo)->step(0, grad, 0, 1);
  ASSERT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;

  // The peer pushes round 0, which completes with worker 0's contributions (applied by the
  // daemon before its step gave up), then round 1 (a slot takes its next round only once the
  // previous one completed, hence the wait; its outcome does not matter here).
  for (const ps::PushPullHandle& h : peer.pushLayout(0, 4.0f, ps::ReduceOp::kAverage)) {
    h.wait(Deadline::afterMs(kWaitMs)).ignoreError();
  }
  peer.pushLayout(0, 4.0f, ps::ReduceOp::kAverage);  // round 1, never waited for

  const Status second = (*algo)->step(0, grad, 1, 1);
  EXPECT_EQ(second, first) << "second step: " << second;
  std::vector<float> out(kModel, 0.0f);
  const Status finished = (*algo)->finish(out);
  EXPECT_EQ(finished, first) << "finish: " << finished;
  for (float v : out) {
    ASSERT_EQ(v, 1.0f) << "a failed step changed the model";
  }
}

// sync with 2 workers: worker 0's first start() times out (the peer has not pushed its initial
// model yet); the peer then pushes it and worker 0 starts again, which must succeed, and so must
// its first step: a failed start() used to leave its error behind, so every step of the retried
// run returned the old DeadlineExceeded.
TEST(SyncFailureTest, AStartRetriedAfterATimeoutStepsNormally) {
  auto server = makeServer(/*workers=*/2, /*gradientStragglers=*/-1);
  ASSERT_TRUE(server != nullptr);
  auto algo = makeWorker0Sync(server->address(), /*timeoutMs=*/300);
  ASSERT_TRUE(algo.ok()) << algo.status();
  const std::vector<float> model(kModel, 1.0f);
  const Status early = (*algo)->start(model, kLayout);
  ASSERT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early;

  RawWorker peer;
  Status connected = peer.connect(/*rank=*/1, /*worldSize=*/2, server->address());
  ASSERT_TRUE(connected.ok()) << connected;
  std::vector<ps::PushPullHandle> initial =
      peer.pushLayout(kInitialKeys, 1.0f, ps::ReduceOp::kAverage);
  Status started = (*algo)->start(model, kLayout);
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(waitEvery(initial).ok());

  std::vector<ps::PushPullHandle> round0 = peer.pushLayout(0, 4.0f, ps::ReduceOp::kAverage);
  std::vector<float> grad(kModel, 2.0f);
  const Status step = (*algo)->step(0, grad, 0, 1);
  EXPECT_TRUE(step.ok()) << step;
  ASSERT_TRUE(waitEvery(round0).ok());
  std::vector<float> out(kModel, 0.0f);
  const Status finished = (*algo)->finish(out);
  EXPECT_TRUE(finished.ok()) << finished;
  for (float v : out) ASSERT_EQ(v, 1.0f - 3.0f) << "model = 1 - lr x average(2, 4)";
}

// A step whose round misses a live worker fails with the daemon's RoundFailed, which names the
// worker, when the daemon's round timeout ends before the step's own timeout. With the
// defaults that is so: cofab-aggd's --round-timeout-ms (120 s) is below SyncOptions::timeoutMs
// (150 s). They used to be equal, and the worker's own deadline (started before its push) came
// first: the error then said "1 of 1 chunks still missing ... (aggregator 0)", not who.
TEST(SyncFailureTest, AStepMissingAWorkerNamesItWhenTheRoundTimesOutFirst) {
  auto daemon = aggregator::parseDaemonArgs({"--workers", "2", "--store", "file:///tmp/unused"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_LT(daemon->server.engine.roundTimeoutMs, SyncOptions{}.timeoutMs)
      << "the sync timeout must outlast cofab-aggd's round timeout by default";

  aggregator::ServerOptions so;
  so.numWorkers = 2;
  so.listenAddress = "127.0.0.1:0";
  so.drainTimeoutMs = 0;
  so.engine.roundTimeoutMs = 300;
  auto server = aggregator::AggregatorServer::create(so);
  ASSERT_TRUE(server.ok()) << server.status();
  RawWorker peer;
  Status connected = peer.connect(/*rank=*/1, /*worldSize=*/2, (*server)->address());
  ASSERT_TRUE(connected.ok()) << connected;
  std::vector<ps::PushPullHandle> initial =
      peer.pushLayout(kInitialKeys, 1.0f, ps::ReduceOp::kAverage);
  auto algo = makeWorker0Sync((*server)->address(), kWaitMs);  // far beyond the round timeout
  ASSERT_TRUE(algo.ok()) << algo.status();
  std::vector<float> model(kModel, 1.0f);
  ASSERT_TRUE((*algo)->start(model, kLayout).ok());
  ASSERT_TRUE(waitEvery(initial).ok());
  std::vector<float> grad(kModel, 2.0f);
  const Status st = (*algo)->step(0, grad, 0, 1);  // the peer never pushes round 0
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st;
  EXPECT_NE(st.message().find("worker 1"), std::string::npos) << st;
}

// A gradcode job of 4 workers, s = 1 (groups {0,1} and {2,3}), past start(): worker 0 is the
// algorithm, rank 2 the peer that stands for group {2,3}. Members in destruction order: the
// algorithm's client closes before the peer's, both before the daemon.
struct GradcodeRig {
  std::unique_ptr<aggregator::AggregatorServer> server;
  RawWorker peer;
  HashStore store;
  std::unique_ptr<SyncAlgorithm> algo;
};

// Starts the daemon, the peer's part of start() (the configuration check, one per group: 1 + 1 =
// 2 groups, and the initial model, its group's: ones; the sum over the groups divided by 2 is
// ones again) and worker 0's start() with `o` (algorithm and stragglers are set here).
Status startGradcode(GradcodeRig& rig, SyncOptions o, int64_t drainTimeoutMs) {
  rig.server = makeServer(/*workers=*/4, /*gradientStragglers=*/1, drainTimeoutMs);
  if (rig.server == nullptr) return Internal("no aggregator daemon");
  COFAB_RETURN_IF_ERROR(rig.peer.connect(/*rank=*/2, /*worldSize=*/4, rig.server->address()));
  std::vector<ps::PushPullHandle> initial =
      rig.peer.pushLayout(kInitialKeys, 1.0f, ps::ReduceOp::kSum);
  initial.push_back(rig.peer.push(kCheckKey, 1, 1.0f, ps::ReduceOp::kSum));
  SyncEnv env;
  env.rank = 0;
  env.worldSize = 4;
  env.store = &rig.store;
  env.client.serverAddresses = {rig.server->address()};
  o.algorithm = "gradcode";
  o.gradientStragglers = 1;
  COFAB_ASSIGN_OR_RETURN(rig.algo, makeSyncAlgorithm(o, env));
  const std::vector<float> model(kModel, 1.0f);
  COFAB_RETURN_IF_ERROR(rig.algo->start(model, kLayout).withContext("worker 0's start()"));
  return waitEvery(initial).withContext("the peer's part of start()");
}

// gradcode (GradcodeRig): worker 0's first step times out (group {2,3} has not pushed round 0;
// before the fix its second tensor's operation kept reading the caller's gradient and writing
// result_ after step() returned); the peer then pushes rounds 0 and 1, and the later
// needsGradient() and step() must return the first step's error.
TEST(SyncFailureTest, GradcodeStepThatTimedOutFailsEveryLaterStep) {
  GradcodeRig rig;
  SyncOptions o;
  o.lr = 1.0f;
  o.momentum = 0.0f;
  o.timeoutMs = kTimeoutMs;
  Status started = startGradcode(rig, o, /*drainTimeoutMs=*/0);
  ASSERT_TRUE(started.ok()) << started;
  SyncAlgorithm* algo = rig.algo.get();
  RawWorker& peer = rig.peer;

  StatusOr<bool> need = algo->needsGradient(0, 0);
  ASSERT_TRUE(need.ok()) << need.status();
  EXPECT_TRUE(*need);
  std::vector<float> grad(kModel, 2.0f);
  const Status first = algo->step(0, grad, 0, 1);
  ASSERT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;

  // Round r travels on keys (r mod window) x tensors + t at iteration r / window: round 0 on
  // keys 0 and 1, round 1 on keys 2 and 3, both the peer's first push on those keys.
  for (const ps::PushPullHandle& h : peer.pushLayout(0, 4.0f, ps::ReduceOp::kSum)) {
    h.wait(Deadline::afterMs(kWaitMs)).ignoreError();
  }
  peer.pushLayout(kLayout.size(), 4.0f, ps::ReduceOp::kSum);  // round 1, never waited for

  StatusOr<bool> needLater = algo->needsGradient(0, 1);
  EXPECT_EQ(needLater.status(), first) << "needsGradient: " << needLater.status();
  const Status second = algo->step(0, grad, 1, 1);
  EXPECT_EQ(second, first) << "second step: " << second;
  std::vector<float> out(kModel, 0.0f);
  const Status finished = algo->finish(out);
  EXPECT_EQ(finished, first) << "finish: " << finished;
  for (float v : out) {
    ASSERT_EQ(v, 1.0f) << "a failed step changed the model";
  }
}

// gradcode's step refused by a daemon that is shutting down says so (and what to do), not that
// this worker fell more than gradcodeWindow rounds behind: both are FailedPrecondition rejects,
// told apart by their reason (ps::rejectReasonOf). Same setup as above; the peer also opens a
// round nobody completes, so that shutdown() stays draining (refusing every push) until its
// drain timeout, while worker 0 steps.
TEST(SyncFailureTest, GradcodeStepRefusedByADrainingDaemonSaysSo) {
  constexpr int64_t kDrainMs = 10000;  // how long the daemon drains (the step is refused meanwhile)
  GradcodeRig rig;
  SyncOptions o;
  o.timeoutMs = kWaitMs;
  Status started = startGradcode(rig, o, kDrainMs);
  ASSERT_TRUE(started.ok()) << started;
  aggregator::AggregatorServer* server = rig.server.get();
  RawWorker& peer = rig.peer;

  // Group {0,1} never pushes this key: once the daemon has opened its round, shutdown() drains
  // (refusing pushes) until kDrainMs. start()'s rounds are settled first: one of them still
  // counted as open for a moment must not pass for this round (shutdown() then found no open
  // round, stopped at once, and the step saw the connection closed instead of the refusal).
  const Deadline d = Deadline::afterMs(kWaitMs);
  while (server->metrics().openRounds.load() != 0 && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(server->metrics().openRounds.load(), 0u);
  peer.push(kCheckKey + 1, 1, 1.0f, ps::ReduceOp::kSum);
  while (server->metrics().openRounds.load() == 0 && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(server->metrics().openRounds.load(), 1u);
  std::thread stopper([&] { server->shutdown("test: draining"); });
  struct JoinOnExit {  // a failed ASSERT below must report, not std::terminate on a joinable
    std::thread& t;
    ~JoinOnExit() { t.join(); }
  } joinStopper{stopper};
  while (!server->draining() && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(server->draining());

  std::vector<float> grad(kModel, 2.0f);
  const Status st = rig.algo->step(0, grad, 0, 1);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("shutting down"), std::string::npos) << st;
  EXPECT_EQ(st.message().find("behind"), std::string::npos) << st;
}

// start() with a layout that does not cover the model fails before connecting to anything;
// finish() then (or without any start()) is FailedPrecondition for every algorithm. shadowsync
// used to abort (a read of its empty model into `out`).
TEST(SyncFailureTest, FinishAfterAFailedStartIsFailedPrecondition) {
  HashStore store;
  SyncEnv env;
  env.store = &store;
  env.client.serverAddresses = {"127.0.0.1:1"};  // never dialled
  struct Case {
    std::string algorithm;
    std::string shadowMode;
  };
  const Case cases[] = {{"sync", "average"},       {"int8", "average"},     {"onebit", "average"},
                        {"ssp", "average"},        {"easgd", "average"},    {"eawild", "average"},
                        {"shadowsync", "average"}, {"shadowsync", "easgd"}, {"gradcode", "average"},
                        {"gossip", "average"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.algorithm + " " + c.shadowMode);
    SyncOptions o;
    o.algorithm = c.algorithm;
    o.shadowMode = c.shadowMode;
    o.gradientStragglers = 0;  // gradcode with one worker: a group of one
    o.timeoutMs = kTimeoutMs;
    std::vector<float> model(3, 0.0f), out(3, 0.0f);

    auto failed = makeSyncAlgorithm(o, env);
    ASSERT_TRUE(failed.ok()) << failed.status();
    Status started = (*failed)->start(model, {2});  // covers 2 of the 3 floats
    EXPECT_EQ(started.code(), StatusCode::kInvalidArgument) << started;
    Status finished = (*failed)->finish(out);
    EXPECT_EQ(finished.code(), StatusCode::kFailedPrecondition) << finished;

    auto never = makeSyncAlgorithm(o, env);
    ASSERT_TRUE(never.ok()) << never.status();
    Status unstarted = (*never)->finish(out);
    EXPECT_EQ(unstarted.code(), StatusCode::kFailedPrecondition) << unstarted;

    // Counts whose sum wraps around to the model's size: accepted, the second tensor's view
    // began one float before the model's buffer.
    auto wrapped = makeSyncAlgorithm(o, env);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status();
    const std::vector<float> eight(8, 0.0f);
    Status overflowed = (*wrapped)->start(eight, {SIZE_MAX, 9});
    EXPECT_EQ(overflowed.code(), StatusCode::kInvalidArgument) << overflowed;
  }
}

// step() (and gradcode's needsGradient()) after a failed start() is FailedPrecondition for every
// algorithm: after a start() that failed on its layout (it used to be InvalidArgument about the
// gradient's size), and after one that set the layout up but could not connect (ssp, easgd and
// eawild used to step on their null client and crash).
TEST(SyncFailureTest, StepAfterAFailedStartIsFailedPrecondition) {
  HashStore store;
  SyncEnv env;
  env.store = &store;
  env.client.serverAddresses = {"127.0.0.1:1"};  // nobody listens: connecting fails
  env.client.connectTimeoutMs = 1000;
  struct Case {
    std::string algorithm;
    std::string shadowMode;
  };
  const Case cases[] = {{"sync", "average"},       {"int8", "average"},     {"onebit", "average"},
                        {"ssp", "average"},        {"easgd", "average"},    {"eawild", "average"},
                        {"shadowsync", "average"}, {"shadowsync", "easgd"}, {"gradcode", "average"},
                        {"gossip", "average"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.algorithm + " " + c.shadowMode);
    SyncOptions o;
    o.algorithm = c.algorithm;
    o.shadowMode = c.shadowMode;
    o.gradientStragglers = 0;  // gradcode with one worker: a group of one
    o.timeoutMs = kTimeoutMs;
    const std::vector<float> model(3, 0.0f), grad(3, 1.0f);
    const std::vector<std::vector<size_t>> layouts = {{2}, {3}};  // wrong; right (then connect)
    for (const std::vector<size_t>& layout : layouts) {
      SCOPED_TRACE("layout of " + std::to_string(layout[0]) + " floats");
      auto algo = makeSyncAlgorithm(o, env);
      ASSERT_TRUE(algo.ok()) << algo.status();
      Status started = (*algo)->start(model, layout);
      ASSERT_FALSE(started.ok());
      Status stepped = (*algo)->step(0, grad, 0, 1);
      EXPECT_EQ(stepped.code(), StatusCode::kFailedPrecondition) << stepped;
      StatusOr<bool> needs = (*algo)->needsGradient(0, 0);
      if (c.algorithm == "gradcode") {
        EXPECT_EQ(needs.status().code(), StatusCode::kFailedPrecondition) << needs.status();
      }
    }
  }
}

// A store whose first add() of a positive count to a key containing "samples" fails.
class SampleAddFailsOnce final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  StatusOr<int64_t> add(std::string_view k, int64_t x) override {
    if (!failed_ && x > 0 && k.find("samples") != std::string_view::npos) {
      failed_ = true;
      return IoError("injected: the store is unreachable");
    }
    return to_->add(k, x);
  }

 private:
  bool failed_ = false;
};

// ssp publishes the job's sample count every 8 steps, after the step's update was applied. A
// failed publish used to be returned once (the next step was OK, so a caller that retried the
// step applied it twice) and dropped the 8 steps' samples from the count for good. Now it is
// sticky like ssp's other step failures, and the samples stay to be published by finish().
TEST(SyncFailureTest, SspFailingToPublishItsSamplesIsStickyAndLosesNone) {
  auto server = makeServer(1, 0);
  ASSERT_NE(server, nullptr);
  HashStore store;
  SampleAddFailsOnce flaky(&store);
  SyncEnv env;
  env.rank = 0;
  env.worldSize = 1;
  env.store = &flaky;
  env.client.serverAddresses = {server->address()};
  SyncOptions o;
  o.algorithm = "ssp";
  o.lr = 1.0f;
  o.momentum = 0.0f;
  auto algo = makeSyncAlgorithm(o, env);
  ASSERT_TRUE(algo.ok()) << algo.status();
  ASSERT_TRUE((*algo)->start(std::vector<float>(kModel, 0.0f), kLayout).ok());
  const std::vector<float> grad(kModel, 1.0f);
  Status first;
  int failedAt = -1;
  for (int s = 0; s < 10; ++s) {
    const Status st = (*algo)->step(0, grad, uint64_t(s), 1);
    if (!st.ok() && first.ok()) {
      first = st;
      failedAt = s;
    }
    if (!first.ok()) {
      EXPECT_EQ(st, first) << "step " << s;
    }
  }
  EXPECT_EQ(failedAt, 7) << "the 8th step publishes";
  EXPECT_EQ(first.code(), StatusCode::kIoError) << first;
  EXPECT_NE(first.message().find("sync ssp"), std::string::npos) << first;
  std::vector<float> out(kModel);
  EXPECT_EQ((*algo)->finish(out), first);
  EXPECT_EQ((*algo)->globalSamples(), 8u) << "the 8 applied steps' samples, published by finish()";
  EXPECT_EQ(out[0], -8.0f) << "8 updates applied, no more";
  server->shutdown("test done");
}

// read() after a start() that set the layout up and then failed to connect aborts, as the
// header says for any read() before a successful start(): it quietly gave the initial model
// (and after a retried start() with a bad layout, the previous run's).
TEST(SyncFailureDeathTest, ReadAfterAStartThatFailedToConnectAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  HashStore store;
  SyncEnv env;
  env.store = &store;
  env.client.serverAddresses = {"127.0.0.1:1"};  // nobody listens: connecting fails
  env.client.connectTimeoutMs = 1000;
  SyncOptions o;
  o.algorithm = "sync";
  auto algo = makeSyncAlgorithm(o, env);
  ASSERT_TRUE(algo.ok()) << algo.status();
  const std::vector<float> model(3, 0.0f);
  ASSERT_FALSE((*algo)->start(model, {3}).ok());
  std::vector<float> out(3);
  EXPECT_DEATH((*algo)->read(0, out), "before start.. succeeded");
}

}  // namespace
}  // namespace cofab::sync
