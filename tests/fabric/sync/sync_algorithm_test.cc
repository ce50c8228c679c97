// Every training-sync algorithm, 4 workers as threads, on least squares: y = X w + noise, each
// worker owning a quarter of the rows (gradcode: computing its group's two quarters, s = 1). The
// serial optimum w* (normal equations, in double) is the reference; each algorithm's final model
// (finish()) must be within kTolerance of it, relative to |w*|. Aggregators are in-process
// AggregatorServers; gossip runs on a communicator.
#include "fabric/sync/sync_algorithm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "aggregator/aggregator_server.h"
#include "fabric/comm/communicator.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/hash_store.h"
#include "fabric/sync/algorithm_base.h"
#include "tests/support/thread_ranks.h"

namespace cofab::sync {
namespace {

constexpr int kWorkers = 4;
constexpr int kFeatures = 8;
constexpr int kDim = kFeatures + 1;  // weights + bias
constexpr int kRowsPerWorker = 256;
constexpr int kBatch = 16;
constexpr int kSteps = 400;

// An in-process daemon for `workers` workers on loopback tcp, and worker `rank`'s environment
// pointing at it (with `store` for the algorithms that keep counters and barriers there).
StatusOr<std::unique_ptr<aggregator::AggregatorServer>> localDaemon(int workers) {
  aggregator::ServerOptions so;
  so.numWorkers = workers;
  so.listenAddress = "127.0.0.1:0";
  return aggregator::AggregatorServer::create(so);
}
SyncEnv envFor(int rank, int world, const aggregator::AggregatorServer& daemon,
               Store* store = nullptr) {
  SyncEnv env;
  env.rank = rank;
  env.worldSize = world;
  env.store = store;
  env.client.serverAddresses = {daemon.address()};
  return env;
}
// SGD with a constant step size stops at a noise floor; with noise 0.01 it is far below this.
constexpr double kTolerance = 0.02;

struct Problem {
  std::vector<double> x;  // rows * kFeatures
  std::vector<double> y;
  std::vector<double> optimum;  // kDim
};

Problem makeProblem() {
  Problem p;
  const int rows = kWorkers * kRowsPerWorker;
  std::mt19937_64 rng(42);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> truth(kDim);
  for (double& w : truth) w = n(rng);
  for (int r = 0; r < rows; ++r) {
    double y = truth[kFeatures];
    for (int f = 0; f < kFeatures; ++f) {
      p.x.push_back(n(rng));
      y += truth[size_t(f)] * p.x.back();
    }
    p.y.push_back(y + 0.01 * n(rng));
  }
  // Normal equations A w = b with A = [X 1]^T [X 1], solved by Gaussian elimination.
  std::vector<double> a(kDim * kDim, 0.0), b(kDim, 0.0);
  for (int r = 0; r < rows; ++r) {
    double row[kDim];
    for (int f = 0; f < kFeatures; ++f) row[f] = p.x[size_t(r) * kFeatures + size_t(f)];
    row[kFeatures] = 1.0;
    for (int i = 0; i < kDim; ++i) {
      b[size_t(i)] += row[i] * p.y[size_t(r)];
      for (int j = 0; j < kDim; ++j) a[size_t(i) * kDim + size_t(j)] += row[i] * row[j];
    }
  }
  for (int c = 0; c < kDim; ++c) {
    for (int r = c + 1; r < kDim; ++r) {
      double f = a[size_t(r) * kDim + size_t(c)] / a[size_t(c) * kDim + size_t(c)];
      for (int k = c; k < kDim; ++k)
        a[size_t(r) * kDim + size_t(k)] -= f * a[size_t(c) * kDim + size_t(k)];
      b[size_t(r)] -= f * b[size_t(c)];
    }
  }
  p.optimum.assign(kDim, 0.0);
  for (int r = kDim - 1; r >= 0; --r) {
    double s = b[size_t(r)];
    for (int k = r + 1; k < kDim; ++k) s -= a[size_t(r) * kDim + size_t(k)] * p.optimum[size_t(k)];
    p.optimum[size_t(r)] = s / a[size_t(r) * kDim + size_t(r)];
  }
  return p;
}

// Mean squared-error gradient of `w` over `n` rows starting at `row`.
void gradient(const Problem& p, const std::vector<float>& w, size_t row, int n,
              std::vector<float>& g) {
  std::fill(g.begin(), g.end(), 0.0f);
  for (int i = 0; i < n; ++i) {
    const double* x = p.x.data() + (row + size_t(i)) * kFeatures;
    double pred = w[kFeatures];
    for (int f = 0; f < kFeatures; ++f) pred += w[size_t(f)] * x[f];
    double err = (pred - p.y[row + size_t(i)]) / n;
    for (int f = 0; f < kFeatures; ++f) g[size_t(f)] += float(2 * err * x[f]);
    g[kFeatures] += float(2 * err);
  }
}

double relativeError(const Problem& p, const std::vector<float>& w) {
  double d = 0, norm = 0;
  for (int i = 0; i < kDim; ++i) {
    d += (w[size_t(i)] - p.optimum[size_t(i)]) * (w[size_t(i)] - p.optimum[size_t(i)]);
    norm += p.optimum[size_t(i)] * p.optimum[size_t(i)];
  }
  return std::sqrt(d / norm);
}

// One worker's training loop: `threads()` threads, each stepping through the rows of the
// worker's partitions() (its own shard: the rank's quarter).
Status trainWorker(SyncAlgorithm& algo, const Problem& p, std::vector<float>* final,
                   SyncStats* stats) {
  std::vector<float> init(kDim, 0.0f);
  // Two tensors (weights split unevenly) so per-tensor keys are exercised.
  COFAB_RETURN_IF_ERROR(algo.start(init, {6, 3}));
  const int threads = algo.threads();
  std::vector<Status> results(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<float> w(kDim), g(kDim);
      const int steps = kSteps / threads;
      std::vector<float> partial(kDim);
      for (int s = 0; s < steps; ++s) {
        StatusOr<bool> need = algo.needsGradient(t, uint64_t(s));
        if (!need.ok()) {
          results[size_t(t)] = need.status();
          return;
        }
        Status st;
        if (!*need) {
          st = algo.step(t, {}, uint64_t(s), kBatch);  // done without us (gradcode)
        } else {
          // The worker's partitions (its own rank's rows; gradcode: its group's), summed.
          size_t batchIndex = size_t(s * threads + t) % (kRowsPerWorker / kBatch);
          algo.read(t, w);
          std::fill(g.begin(), g.end(), 0.0f);
          for (int part : algo.partitions()) {
            gradient(p, w, size_t(part) * kRowsPerWorker + batchIndex * kBatch, kBatch, partial);
            for (int i = 0; i < kDim; ++i) g[size_t(i)] += partial[size_t(i)];
          }
          st = algo.step(t, g, uint64_t(s), kBatch);
        }
        if (!st.ok()) {
          results[size_t(t)] = st;
          return;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& st : results) COFAB_RETURN_IF_ERROR(st);
  final->assign(kDim, 0.0f);
  COFAB_RETURN_IF_ERROR(algo.finish(*final));
  *stats = algo.stats();
  return OkStatus();
}

struct Case {
  std::string algorithm;
  std::string variant;  // for the test name
  SyncOptions options;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.algorithm << c.variant; }

class SyncConvergenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(SyncConvergenceTest, ConvergesToSerialOptimum) {
  const Case& c = GetParam();
  Problem p = makeProblem();
  HashStore store;
  std::vector<std::unique_ptr<aggregator::AggregatorServer>> servers;
  std::vector<std::string> addresses;
  if (needsAggregators(c.algorithm)) {
    for (int i = 0; i < 2; ++i) {
      aggregator::ServerOptions so;
      so.id = i;
      so.numServers = 2;
      so.numWorkers = kWorkers;
      so.listenAddress = "127.0.0.1:0";
      if (c.algorithm == "gradcode") so.engine.gradientStragglers = c.options.gradientStragglers;
      auto server = aggregator::AggregatorServer::create(so);
      ASSERT_TRUE(server.ok()) << server.status();
      addresses.push_back((*server)->address());
      servers.push_back(std::move(*server));
    }
  }
  std::vector<std::vector<float>> finals(kWorkers);
  std::vector<SyncStats> stats(kWorkers);
  auto results = testing::runThreadRanks(kWorkers, [&](int rank) -> Status {
    SyncEnv env;
    env.rank = rank;
    env.worldSize = kWorkers;
    env.store = &store;
    env.client.serverAddresses = addresses;
    env.client.chunkBytes = 16;  // 4 floats: tensors span chunks on both daemons
    std::unique_ptr<comm::Communicator> comm;
    if (!needsAggregators(c.algorithm)) {
      comm::CommOptions co;
      co.name = "gossip-test";
      COFAB_ASSIGN_OR_RETURN(comm, comm::Communicator::create(rank, kWorkers, &store, co));
      env.comm = comm.get();
    }
    SyncOptions options = c.options;
    options.algorithm = c.algorithm;
    options.timeoutMs = 20000;
    COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(options, env));
    return trainWorker(*algo, p, &finals[size_t(rank)], &stats[size_t(rank)]);
  });
  Status all = testing::allOk(results);
  ASSERT_TRUE(all.ok()) << all;
  for (int r = 0; r < kWorkers; ++r) {
    double err = relativeError(p, finals[size_t(r)]);
    EXPECT_LT(err, kTolerance) << c.algorithm << " rank " << r;
    EXPECT_GT(stats[size_t(r)].syncs, 0u) << "rank " << r << " never synchronized";
    EXPECT_GT(stats[size_t(r)].bytesSent, 0u);
  }
  // The job ends with one model: every worker's final model is the same.
  for (int r = 1; r < kWorkers; ++r) EXPECT_EQ(finals[0], finals[size_t(r)]) << "rank " << r;
}

SyncOptions opts(float lr, int syncEvery = 1, int threads = 1, std::string gossipPeers = "ring",
                 std::string shadowMode = "average") {
  SyncOptions o;
  o.gossipPeers = gossipPeers;
  o.shadowMode = shadowMode;
  o.lr = lr;
  o.momentum = 0.9f;
  o.syncEvery = syncEvery;
  o.threads = threads;
  return o;
}

// shadowsync's rounds during training happen at the shadow thread's pace, i.e. timing; here the
// whole training takes milliseconds, so a round that lands just before a worker's last steps
// could leave it anywhere. The test pins the rounds to the start and the end (an interval far
// longer than the training): local SGD on each shard, then the final average of every worker's
// model through the done-flag protocol, which is deterministic. (bench_sync.sh exercises the
// rounds during training.)
SyncOptions shadowOnlyAtTheEnds() {
  SyncOptions o = opts(0.02f);
  o.shadowIntervalMs = 3600 * 1000;
  return o;
}

// onebit with the daemons' error feedback on the replies as well (SyncOptions::replyFeedback).
SyncOptions withReplyFeedback() {
  SyncOptions o = opts(0.02f);
  o.replyFeedback = true;
  return o;
}

// onebit quantizing the velocity itself instead of the Nesterov look-ahead step (the default).
SyncOptions onebitVelocity() {
  SyncOptions o = opts(0.02f);
  o.onebitNesterov = false;
  return o;
}

// ssp with the clock-based bound (SSP, the fast worker waits) instead of versions (dropped).
SyncOptions sspByClocks() {
  SyncOptions o = opts(0.02f);
  o.stalenessUnit = "clocks";
  return o;
}

// shadowMode "easgd" is left out: how close it ends depends on how many elastic rounds the shadow
// thread fits into the training, which is timing (here training takes milliseconds).
INSTANTIATE_TEST_SUITE_P(
    Algorithms, SyncConvergenceTest,
    ::testing::Values(
        Case{"sync", "", opts(0.02f)}, Case{"int8", "", opts(0.02f)},
        Case{"onebit", "", opts(0.02f)}, Case{"onebit", "_reply_feedback", withReplyFeedback()},
        Case{"onebit", "_velocity", onebitVelocity()},
        Case{"shadowsync", "", shadowOnlyAtTheEnds()}, Case{"gossip", "ring", opts(0.02f)},
        Case{"gossip", "random", opts(0.02f, 2, 1, "random")}, Case{"ssp", "", opts(0.02f)},
        Case{"ssp", "clocks", sspByClocks()}, Case{"easgd", "", opts(0.02f, 4)},
        Case{"eawild", "", opts(0.02f, 4, 4)}, Case{"gradcode", "", opts(0.02f)}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.algorithm + info.param.variant;
    });

// Bytes this worker put on the wire for `steps` steps of a 64K-float model under `algorithm`.
uint64_t bytesFor(const std::string& algorithm, int steps) {
  constexpr size_t kModel = 1 << 16;
  constexpr int kRanks = 2;
  aggregator::ServerOptions so;
  so.numWorkers = kRanks;
  so.listenAddress = "127.0.0.1:0";
  auto server = aggregator::AggregatorServer::create(so);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return 0;
  std::vector<uint64_t> bytes(kRanks, 0);
  auto results = testing::runThreadRanks(kRanks, [&](int rank) -> Status {
    SyncEnv env;
    env.rank = rank;
    env.worldSize = kRanks;
    env.client.serverAddresses = {(*server)->address()};
    SyncOptions o;
    o.algorithm = algorithm;
    o.timeoutMs = 20000;
    COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(o, env));
    std::vector<float> model(kModel, 0.0f), grad(kModel);
    COFAB_RETURN_IF_ERROR(algo->start(model, {kModel}));
    // Bytes of the start (an exact f32 average) are not the algorithm's: count from here.
    uint64_t before = algo->stats().bytesSent;
    std::mt19937 rng(static_cast<uint32_t>(rank));
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int s = 0; s < steps; ++s) {
      for (float& g : grad) g = n(rng);
      COFAB_RETURN_IF_ERROR(algo->step(0, grad, uint64_t(s), 1));
    }
    COFAB_RETURN_IF_ERROR(algo->finish(model));
    bytes[size_t(rank)] = algo->stats().bytesSent - before;
    return OkStatus();
  });
  EXPECT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
  return bytes[0];
}

// The compressed algorithms put (nearly) 4x / 32x fewer bytes on the wire than f32 sync.
TEST(SyncAlgorithmTest, CompressionCutsBytesOnTheWire) {
  uint64_t f32 = bytesFor("sync", 4), int8 = bytesFor("int8", 4), onebit = bytesFor("onebit", 4);
  ASSERT_GT(f32, 4u * 4 * (1 << 16) - 1);  // at least the payload
  EXPECT_LT(int8 * 3, f32) << "int8 " << int8 << " f32 " << f32;
  EXPECT_LT(onebit * 20, f32) << "onebit " << onebit << " f32 " << f32;
}

// One step of every push-pull algorithm with gradients 1 (rank 0) and 3 (rank 1), lr 1, no
// momentum: the model moves by the average, -2, exactly (constant blocks compress exactly).
// One worker of `o.algorithm` with what it needs (an in-process aggregator, or a communicator
// for gossip), kept alive together.
struct SoloWorker {
  HashStore store;
  std::unique_ptr<aggregator::AggregatorServer> server;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<SyncAlgorithm> algo;

  Status make(SyncOptions o) {
    SyncEnv env;
    env.rank = 0;
    env.worldSize = 1;
    env.store = &store;
    if (needsAggregators(o.algorithm)) {
      aggregator::ServerOptions so;
      so.numWorkers = 1;
      so.listenAddress = "127.0.0.1:0";
      COFAB_ASSIGN_OR_RETURN(server, aggregator::AggregatorServer::create(so));
      env.client.serverAddresses = {server->address()};
    } else {
      comm::CommOptions co;
      co.name = "solo";
      COFAB_ASSIGN_OR_RETURN(comm, comm::Communicator::create(0, 1, &store, co));
      env.comm = comm.get();
    }
    o.timeoutMs = 20000;
    COFAB_ASSIGN_OR_RETURN(algo, makeSyncAlgorithm(o, env));
    return OkStatus();
  }
};

// A failed elastic move is sticky (docs/SYNC.md §3): the center may have moved by its request
// while the worker did not, so the steps after it (eawild: every thread's), and finish(), return
// that failure. They returned OK, and finish() the failure of its own last pull.
TEST(SyncAlgorithmTest, AFailedElasticMoveIsSticky) {
  for (const char* algorithm : {"easgd", "eawild"}) {
    SCOPED_TRACE(algorithm);
    SyncOptions o;
    o.algorithm = algorithm;
    o.syncEvery = 2;
    o.threads = std::string(algorithm) == "eawild" ? 2 : 1;
    SoloWorker w;
    ASSERT_TRUE(w.make(o).ok());
    const std::vector<float> model(8, 1.0f);
    const std::vector<float> grad(8, 0.5f);
    ASSERT_TRUE(w.algo->start(model, {8}).ok());
    ASSERT_TRUE(w.algo->step(0, grad, 0, 1).ok());
    w.server.reset();                                  // the daemon holding the center is gone
    const Status moved = w.algo->step(0, grad, 1, 1);  // thread 0's sync step
    ASSERT_FALSE(moved.ok());
    const Status next = w.algo->step(o.threads - 1, grad, 2, 1);  // no sync of its own
    EXPECT_FALSE(next.ok()) << "a step after the failed elastic move returned OK";
    std::vector<float> out(8);
    const Status finished = w.algo->finish(out);
    EXPECT_NE(finished.message().find("elastic move of tensor"), std::string::npos) << finished;
  }
}

// finish() into a buffer of another size than the model: InvalidArgument naming both sizes
// (a smaller one was filled with a truncated model and OK, a larger one aborted the process).
TEST(SyncAlgorithmTest, FinishIntoAWrongSizedBufferIsRefused) {
  struct Case {
    std::string algorithm, shadowMode;
  };
  const Case cases[] = {{"sync", "average"},       {"int8", "average"},     {"onebit", "average"},
                        {"ssp", "average"},        {"easgd", "average"},    {"eawild", "average"},
                        {"shadowsync", "average"}, {"shadowsync", "easgd"}, {"gradcode", "average"},
                        {"gossip", "average"}};
  for (const Case& c : cases) {
    for (const size_t size : {size_t{7}, size_t{9}}) {
      SCOPED_TRACE(c.algorithm + " " + c.shadowMode + " into " + std::to_string(size));
      SyncOptions o;
      o.algorithm = c.algorithm;
      o.shadowMode = c.shadowMode;
      o.gradientStragglers = 0;
      SoloWorker w;
      ASSERT_TRUE(w.make(o).ok());
      const std::vector<float> model(8, 1.0f);
      ASSERT_TRUE(w.algo->start(model, {5, 3}).ok());
      std::vector<float> out(size, -7.0f);
      const Status s = w.algo->finish(out);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("8"), std::string::npos) << s;
      EXPECT_EQ(out, std::vector<float>(size, -7.0f)) << "the buffer was written";
    }
  }
}

// start() on a running shadowsync: its background thread is still using the model, which a
// second set-up would reallocate under it (and replacing the joinable thread terminated).
TEST(ShadowSyncTest, ASecondStartWhileRunningIsRefused) {
  SyncOptions o;
  o.algorithm = "shadowsync";
  SoloWorker w;
  ASSERT_TRUE(w.make(o).ok());
  const std::vector<float> model(8, 1.0f);
  ASSERT_TRUE(w.algo->start(model, {8}).ok());
  const Status again = w.algo->start(model, {8});
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again;
  std::vector<float> out(8);
  EXPECT_TRUE(w.algo->finish(out).ok());
  EXPECT_EQ(out, model);
}

// Registers `daemon` as the job's only aggregator in `store` (what cofab-aggd does), so that
// clients find it by discovery and a restarted daemon replaces it.
void registerDaemon(Store& store, const aggregator::AggregatorServer& daemon) {
  const std::string a = daemon.address();
  ASSERT_TRUE(store.set(ps::serverAddressKey("cofab/agg", 0), Bytes(a.begin(), a.end())).ok());
  ASSERT_TRUE(store.set(ps::serverCountKey("cofab/agg"), Bytes{'1'}).ok());
}

// start() again after finish() (allowed once the background thread is joined), easgd mode:
//  - against the daemons of the first run it is refused at start() (a new client's round 0 is a
//    finished round there), as in average mode. It was accepted, trained a whole run with the
//    first run's center in place of the new initial model, and failed only in finish();
//  - against restarted daemons it begins a clean run: globalSamples() from 0 (it went on from
//    the first run's count), a thread that keeps synchronizing (finish() had left its "done"
//    flag set, and the new thread ran one final round and stopped), and a finish() that works.
TEST(ShadowSyncTest, ARestartIsRefusedOnTheOldDaemonsAndBeginsACleanRunOnNewOnes) {
  HashStore store;
  auto daemon = localDaemon(1);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  registerDaemon(store, **daemon);
  SyncEnv env;
  env.rank = 0;
  env.worldSize = 1;
  env.store = &store;
  SyncOptions o;
  o.algorithm = "shadowsync";
  o.shadowMode = "easgd";
  o.timeoutMs = 20000;
  auto algo = makeSyncAlgorithm(o, env);
  ASSERT_TRUE(algo.ok()) << algo.status();
  SyncAlgorithm& w = **algo;
  const std::vector<float> model(8, 1.0f);
  const std::vector<float> grad(8, 0.0f);
  std::vector<float> out(8);
  ASSERT_TRUE(w.start(model, {8}).ok());
  for (uint64_t s = 0; s < 10; ++s) ASSERT_TRUE(w.step(0, grad, s, 10).ok());
  ASSERT_TRUE(w.finish(out).ok());

  const Status same = w.start(model, {8});
  EXPECT_FALSE(same.ok()) << "a restart against the first run's daemons was accepted";
  EXPECT_NE(same.message().find("finished_iteration"), std::string::npos) << same;

  auto restarted = localDaemon(1);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  registerDaemon(store, **restarted);
  const Status fresh = w.start(model, {8});
  ASSERT_TRUE(fresh.ok()) << fresh;
  EXPECT_EQ(w.globalSamples(), 0u);
  const uint64_t before = w.stats().syncs;
  // A condition with a bound: rounds run back to back (no interval), so this is quick unless
  // the thread has stopped.
  const Deadline bound = Deadline::afterMs(20000);
  for (uint64_t s = 0; w.stats().syncs < before + 3 && !bound.expired(); ++s) {
    ASSERT_TRUE(w.step(0, grad, s, 1).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(w.stats().syncs, before + 3) << "the restarted background thread stopped";
  // Published by the elastic rounds into the store's counter, which still holds the first run's
  // 100: this run's 1 a step only.
  EXPECT_LE(w.globalSamples(), w.stats().steps);
  const Status finished = w.finish(out);
  EXPECT_TRUE(finished.ok()) << finished;
  EXPECT_EQ(w.globalSamples(), w.stats().steps);
}

// shadowsync easgd: finish()'s final average used to store its client's byte counts over the
// elastic rounds' sums, so the stats (and train_mnist's RESULT line) showed one round's bytes.
TEST(ShadowSyncTest, EasgdBytesAfterFinishIncludeTheElasticRounds) {
  SyncOptions o;
  o.algorithm = "shadowsync";
  o.shadowMode = "easgd";
  SoloWorker w;
  ASSERT_TRUE(w.make(o).ok());
  const std::vector<float> model(1024, 1.0f);
  const std::vector<float> grad(1024, 0.0f);
  ASSERT_TRUE(w.algo->start(model, {1024}).ok());
  const Deadline bound = Deadline::afterMs(20000);
  for (uint64_t s = 0; w.algo->stats().syncs < 10 && !bound.expired(); ++s) {
    ASSERT_TRUE(w.algo->step(0, grad, s, 1).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(w.algo->stats().syncs, 10u);
  const uint64_t sent = w.algo->stats().bytesSent;
  const uint64_t received = w.algo->stats().bytesReceived;
  ASSERT_GE(sent, 10u * 1024 * sizeof(float));
  std::vector<float> out(1024);
  ASSERT_TRUE(w.algo->finish(out).ok());
  EXPECT_GT(w.algo->stats().bytesSent, sent);
  EXPECT_GT(w.algo->stats().bytesReceived, received);
}

// A worker that finishes while another still trains runs its rounds back to back, and each
// waits for the other worker, which starts its next round only after its interval: with an
// interval longer than the operation timeout, the early worker's round timed out and the job
// failed. A round now waits for one interval more.
TEST(ShadowSyncTest, AWorkerFinishingLongBeforeAnotherStillFinishes) {
  auto server = localDaemon(2);
  ASSERT_TRUE(server.ok()) << server.status();
  HashStore store;
  std::vector<std::vector<float>> finals(2, std::vector<float>(8));
  auto results = testing::runThreadRanks(2, [&](int rank) -> Status {
    const SyncEnv env = envFor(rank, 2, **server, &store);
    SyncOptions o;
    o.algorithm = "shadowsync";
    o.shadowIntervalMs = 5000;
    o.timeoutMs = 500;
    COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(o, env));
    const std::vector<float> model(8, 0.0f), grad(8, 1.0f);
    COFAB_RETURN_IF_ERROR(algo->start(model, {8}));
    if (rank == 1) {  // trains on for a second, well past rank 0's finish and the timeout
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      for (uint64_t s = 0; std::chrono::steady_clock::now() < until; ++s) {
        COFAB_RETURN_IF_ERROR(algo->step(0, grad, s, 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return algo->finish(finals[size_t(rank)]);
  });
  ASSERT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
  EXPECT_EQ(finals[0], finals[1]);
}

// ssp by clocks: worker 0 runs ahead of worker 1 (which has not stepped) past the staleness
// bound (3), so its apply waits and times out. Part of an update may have been applied by then
// (tensor by tensor, or by the daemon after the wait gave up): a retried step, once worker 1 has
// caught up, must return the first failure instead of applying it again. It used to succeed.
TEST(SyncAlgorithmTest, AFailedSspStepIsSticky) {
  auto server = localDaemon(2);
  ASSERT_TRUE(server.ok()) << server.status();
  HashStore store;
  Status first, retried, finished;
  std::mutex mu;
  std::condition_variable cv;
  bool zeroFailed = false, oneCaughtUp = false;
  // Both flags are set on every way out of a rank, so that a failure of one rank (its start(),
  // say) fails the test instead of leaving the other waiting.
  auto bothDone = [&] {
    std::lock_guard<std::mutex> lock(mu);
    zeroFailed = oneCaughtUp = true;
    cv.notify_all();
  };
  auto results = testing::runThreadRanks(2, [&](int rank) -> Status {
    struct Release {
      std::function<void()> fn;
      ~Release() { fn(); }
    } release{bothDone};
    SyncOptions o;
    o.algorithm = "ssp";
    o.stalenessUnit = "clocks";
    o.timeoutMs = rank == 0 ? 500 : 20000;
    COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(o, envFor(rank, 2, **server, &store)));
    const std::vector<float> grad(8, 1.0f);
    COFAB_RETURN_IF_ERROR(algo->start(std::vector<float>(8, 0.0f), {4, 4}));
    std::vector<float> out(8);
    if (rank == 0) {
      uint64_t s = 0;
      for (; s < 20 && first.ok(); ++s) first = algo->step(0, grad, s, 1);
      {
        std::unique_lock<std::mutex> lock(mu);
        zeroFailed = true;
        cv.notify_all();
        cv.wait(lock, [&] { return oneCaughtUp; });
      }
      retried = algo->step(0, grad, s - 1, 1);
      finished = algo->finish(out);
      return OkStatus();
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return zeroFailed; });
    }
    for (uint64_t s = 0; s < 6; ++s) COFAB_RETURN_IF_ERROR(algo->step(0, grad, s, 1));
    {
      std::lock_guard<std::mutex> lock(mu);
      oneCaughtUp = true;
      cv.notify_all();
    }
    return algo->finish(out);
  });
  ASSERT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
  ASSERT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;
  EXPECT_EQ(retried, first);
  EXPECT_EQ(finished, first);
}

TEST(SyncAlgorithmTest, StepAppliesTheAverageGradient) {
  for (std::string algorithm : {"sync", "int8", "onebit"}) {
    auto server = localDaemon(2);
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<std::vector<float>> finals(2);
    auto results = testing::runThreadRanks(2, [&](int rank) -> Status {
      const SyncEnv env = envFor(rank, 2, **server);
      SyncOptions o;
      o.algorithm = algorithm;
      o.lr = 1.0f;
      o.momentum = 0.0f;
      o.timeoutMs = 20000;
      COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(o, env));
      std::vector<float> model(512, 0.0f), grad(512, rank == 0 ? 1.0f : 3.0f);
      COFAB_RETURN_IF_ERROR(algo->start(model, {512}));
      COFAB_RETURN_IF_ERROR(algo->step(0, grad, 0, 1));
      finals[size_t(rank)].resize(512);
      return algo->finish(finals[size_t(rank)]);
    });
    ASSERT_TRUE(testing::allOk(results).ok()) << algorithm << ": " << testing::allOk(results);
    for (float v : finals[0]) ASSERT_NEAR(v, -2.0f, 0.02f) << algorithm;
  }
}

TEST(SyncAlgorithmTest, RejectsUnknownAlgorithmAndBadOptions) {
  SyncEnv env;
  HashStore store;
  env.store = &store;
  SyncOptions o;
  o.algorithm = "bogus";
  auto a = makeSyncAlgorithm(o, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("easgd"), std::string::npos) << a.status();
  o.algorithm = "easgd";
  o.elasticAlpha = 1.5f;
  EXPECT_EQ(makeSyncAlgorithm(o, env).status().code(), StatusCode::kInvalidArgument);
  o = SyncOptions{};
  o.algorithm = "int8";
  o.replyFeedback = true;  // onebit only
  EXPECT_EQ(makeSyncAlgorithm(o, env).status().code(), StatusCode::kInvalidArgument);
  o.replyFeedback = false;
  // A compression block the codec refuses: it used to fail step 0 on every worker, for good,
  // after start() had succeeded. And one given where nothing is compressed was ignored.
  o.compressionBlock = (size_t{1} << 20) + 1;
  auto block = makeSyncAlgorithm(o, env);
  EXPECT_EQ(block.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(block.status().message().find("compressionBlock"), std::string::npos) << block.status();
  o.compressionBlock = 64;
  EXPECT_TRUE(makeSyncAlgorithm(o, env).ok());
  o.algorithm = "sync";
  EXPECT_EQ(makeSyncAlgorithm(o, env).status().code(), StatusCode::kInvalidArgument);
  o.compressionBlock = 0;
  o.algorithm = "ssp";
  o.stalenessUnit = "seconds";
  auto u = makeSyncAlgorithm(o, env);
  EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(u.status().message().find("clocks"), std::string::npos) << u.status();
  o = SyncOptions{};
  o.algorithm = "gossip";
  auto g = makeSyncAlgorithm(o, env);
  ASSERT_TRUE(g.ok());
  std::vector<float> init(3, 0.0f);
  EXPECT_EQ((*g)->start(init, {3}).code(), StatusCode::kInvalidArgument);  // no communicator
  // A communicator whose rank or size is not env's: gossip's pairs come from env and its
  // messages go over the communicator, so they would not agree (start() used to succeed and the
  // first exchange waited for its timeout, naming a rank that had arrived).
  HashStore commStore;
  auto comm = comm::Communicator::create(0, 1, &commStore, comm::CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status();
  SyncEnv two;
  two.rank = 1;
  two.worldSize = 2;
  two.comm = comm->get();
  auto mismatched = makeSyncAlgorithm(o, two);
  ASSERT_TRUE(mismatched.ok()) << mismatched.status();
  const Status st = (*mismatched)->start(init, {3});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("rank 0 of 1"), std::string::npos) << st;
}

// Numeric options that are NaN or infinite (or negative where that means nothing) are refused
// with InvalidArgument naming the option: a NaN momentum or elastic alpha used to pass the
// range checks (every comparison with NaN is false) and silently turn the model into NaNs.
// Also threads other than 1 for an algorithm that trains with one (all but eawild): easgd with
// 4 threads used to train with 1 and say nothing.
TEST(SyncAlgorithmTest, RejectsNonFiniteAndNegativeNumericOptions) {
  SyncEnv env;
  HashStore store;
  env.store = &store;
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string option;
    std::function<void(SyncOptions&)> set;
  };
  const Case cases[] = {
      {"lr", [&](SyncOptions& o) { o.lr = kNaN; }},
      {"lr", [&](SyncOptions& o) { o.lr = kInf; }},
      {"momentum", [&](SyncOptions& o) { o.momentum = kNaN; }},
      {"momentum", [&](SyncOptions& o) { o.momentum = -kInf; }},
      {"elasticAlpha", [&](SyncOptions& o) { o.elasticAlpha = kNaN; }},
      {"elasticAlpha", [&](SyncOptions& o) { o.elasticAlpha = -0.5f; }},
      {"shadowIntervalMs", [&](SyncOptions& o) { o.shadowIntervalMs = -1; }},
      {"timeoutMs", [&](SyncOptions& o) { o.timeoutMs = -1; }},
      {"syncEvery", [&](SyncOptions& o) { o.syncEvery = 0; }},
      {"threads", [&](SyncOptions& o) { o.threads = 0; }},
      {"threads", [&](SyncOptions& o) { o.threads = 4; }},
  };
  for (const Case& c : cases) {
    SyncOptions o;
    o.algorithm = "easgd";
    c.set(o);
    SCOPED_TRACE(c.option + " lr=" + std::to_string(o.lr) + " momentum=" +
                 std::to_string(o.momentum) + " elasticAlpha=" + std::to_string(o.elasticAlpha));
    auto a = makeSyncAlgorithm(o, env);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument) << a.status();
    EXPECT_NE(a.status().message().find(c.option), std::string::npos) << a.status();
  }
}

// Atomics only where threads share the model: eawild with several Hogwild threads, shadowsync
// (its background thread). Every other algorithm's model is owned by its training thread, and
// TSan would not notice a wrong choice unless a test happened to run that algorithm under it.
TEST(SyncAlgorithmTest, OnlyAlgorithmsWithSeveralThreadsOnTheModelUseAtomics) {
  SyncEnv env;
  HashStore store;
  env.store = &store;
  struct Case {
    std::string algorithm;
    int threads;
    SharedModel::Access expected;
  };
  const Case cases[] = {{"sync", 1, SharedModel::Access::kSingleThread},
                        {"onebit", 1, SharedModel::Access::kSingleThread},
                        {"ssp", 1, SharedModel::Access::kSingleThread},
                        {"easgd", 1, SharedModel::Access::kSingleThread},
                        {"gossip", 1, SharedModel::Access::kSingleThread},
                        {"eawild", 1, SharedModel::Access::kSingleThread},
                        {"eawild", 2, SharedModel::Access::kConcurrent},
                        {"shadowsync", 1, SharedModel::Access::kConcurrent}};
  for (const Case& c : cases) {
    SyncOptions o;
    o.algorithm = c.algorithm;
    o.threads = c.threads;
    auto algo = makeSyncAlgorithm(o, env);
    ASSERT_TRUE(algo.ok()) << c.algorithm << ": " << algo.status();
    auto* base = dynamic_cast<detail::AlgorithmBase*>(algo->get());
    ASSERT_NE(base, nullptr) << c.algorithm;
    EXPECT_EQ(base->modelAccess(), c.expected) << c.algorithm << " threads " << c.threads;
  }
}

// Two groups of one job on one store, each with daemons of its own (its own storePrefix), do not
// share the store's sample counter or finish barrier. The keys ignored the prefix, so the second
// group's globalSamples() started at the first's total.
TEST(SyncAlgorithmTest, GroupsWithTheirOwnStorePrefixCountTheirOwnSamples) {
  HashStore store;
  for (int run = 0; run < 2; ++run) {
    auto server = localDaemon(1);
    ASSERT_TRUE(server.ok()) << server.status();
    SyncEnv env = envFor(0, 1, **server, &store);
    env.client.storePrefix = "group" + std::to_string(run);
    SyncOptions o;
    o.algorithm = "easgd";
    o.timeoutMs = 20000;
    auto algo = makeSyncAlgorithm(o, env);
    ASSERT_TRUE(algo.ok()) << algo.status();
    const std::vector<float> model(8, 0.0f), grad(8, 1.0f);
    ASSERT_TRUE((*algo)->start(model, {8}).ok());
    ASSERT_TRUE((*algo)->step(0, grad, 0, 10).ok());
    std::vector<float> out(8);
    ASSERT_TRUE((*algo)->finish(out).ok());
    EXPECT_EQ((*algo)->globalSamples(), 10u) << "run " << run;
  }
}

// After finish(), globalSamples() counts every worker's samples, also those a later worker
// published after this one had: it is read again past the finish barrier. A worker that
// finished first used to miss the others' last (unpublished) steps.
TEST(SyncAlgorithmTest, GlobalSamplesAfterFinishAreTheJobsTotal) {
  auto server = localDaemon(2);
  ASSERT_TRUE(server.ok()) << server.status();
  HashStore store;
  std::vector<uint64_t> totals(2);
  auto results = testing::runThreadRanks(2, [&](int rank) -> Status {
    const SyncEnv env = envFor(rank, 2, **server, &store);
    SyncOptions o;
    o.algorithm = "easgd";
    o.syncEvery = 100;  // no elastic move (and no publish) during the 5 steps
    o.timeoutMs = 20000;
    COFAB_ASSIGN_OR_RETURN(auto algo, makeSyncAlgorithm(o, env));
    const std::vector<float> model(8, 0.0f), grad(8, 1.0f);
    COFAB_RETURN_IF_ERROR(algo->start(model, {8}));
    for (uint64_t s = 0; s < 5; ++s) COFAB_RETURN_IF_ERROR(algo->step(0, grad, s, 10));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<float> out(8);
    COFAB_RETURN_IF_ERROR(algo->finish(out));
    totals[size_t(rank)] = algo->globalSamples();
    return OkStatus();
  });
  ASSERT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
  EXPECT_EQ(totals[0], 100u);
  EXPECT_EQ(totals[1], 100u);
}

// Rank `rank` of a two-worker gossip job on `store` (communicator `name`, an exchange every
// step), started on a 4-float model: the communicator outlives the algorithm.
struct GossipRank {
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<SyncAlgorithm> algo;
};
StatusOr<GossipRank> startGossipRank(int rank, HashStore& store, const std::string& name,
                                     int64_t timeoutMs) {
  GossipRank g;
  comm::CommOptions co;
  co.name = name;
  COFAB_ASSIGN_OR_RETURN(g.comm, comm::Communicator::create(rank, 2, &store, co));
  SyncEnv env;
  env.rank = rank;
  env.worldSize = 2;
  env.store = &store;
  env.comm = g.comm.get();
  SyncOptions o;
  o.algorithm = "gossip";
  o.syncEvery = 1;
  o.timeoutMs = timeoutMs;
  COFAB_ASSIGN_OR_RETURN(g.algo, makeSyncAlgorithm(o, env));
  COFAB_RETURN_IF_ERROR(g.algo->start(std::vector<float>(4, float(rank)), {4}));
  return g;
}

// Rank 0's first step, handed to rank 1, which comes to the exchange only after it (or after
// its own bound).
class Rank0Step {
 public:
  void set(const Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = st;
      returned_ = true;
    }
    cv_.notify_all();
  }
  void waitAtMost(std::chrono::seconds bound) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, bound, [&] { return returned_; });
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool returned_ = false;
  Status status_;
};

// timeoutMs is a count of milliseconds up to INT64_MAX (core/clock.h: saturating). gossip turned
// it into a Duration in nanoseconds, which overflowed for the largest values to a negative
// timeout, read as "use COFAB_COLLECTIVE_TIMEOUT_MS" (here 1 ms): start() and every exchange
// failed early. Rank 1 comes to the exchange only once rank 0's step returned (or after 2 s).
TEST(SyncAlgorithmTest, GossipWithTheLargestTimeoutWaitsForItsPeer) {
  const char* before = std::getenv("COFAB_COLLECTIVE_TIMEOUT_MS");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("COFAB_COLLECTIVE_TIMEOUT_MS", "1", 1);
  HashStore store;
  Rank0Step rank0;
  auto results = testing::runThreadRanks(2, [&](int rank) -> Status {
    COFAB_ASSIGN_OR_RETURN(GossipRank g, startGossipRank(rank, store, "gossip-timeout",
                                                         std::numeric_limits<int64_t>::max()));
    const std::vector<float> grad(4, 0.0f);
    if (rank == 0) {
      const Status st = g.algo->step(0, grad, 0, 1);
      rank0.set(st);
      COFAB_RETURN_IF_ERROR(st);
    } else {
      rank0.waitAtMost(std::chrono::seconds(2));
      COFAB_RETURN_IF_ERROR(g.algo->step(0, grad, 0, 1));
    }
    std::vector<float> out(4);
    return g.algo->finish(out);
  });
  if (before != nullptr) {
    ::setenv("COFAB_COLLECTIVE_TIMEOUT_MS", saved.c_str(), 1);
  } else {
    ::unsetenv("COFAB_COLLECTIVE_TIMEOUT_MS");
  }
  EXPECT_TRUE(rank0.status().ok()) << rank0.status();
  EXPECT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
}

// A gossip exchange whose peer does not come fails at timeoutMs saying it is gossip's exchange,
// which round and which peer (the communicator's error alone named an anonymous send/recv).
TEST(SyncAlgorithmTest, AGossipExchangeThatTimesOutNamesItsRoundAndPeer) {
  HashStore store;
  Rank0Step rank0;
  auto results = testing::runThreadRanks(2, [&](int rank) -> Status {
    // start()'s averaging has both ranks at once; the step has one.
    COFAB_ASSIGN_OR_RETURN(GossipRank g, startGossipRank(rank, store, "gossip-late-peer", 1000));
    if (rank == 0) {
      rank0.set(g.algo->step(0, std::vector<float>(4, 0.0f), 0, 1));
    } else {  // never steps: waits until rank 0 gave up on it
      rank0.waitAtMost(std::chrono::seconds(20));
    }
    return OkStatus();
  });
  ASSERT_TRUE(testing::allOk(results).ok()) << testing::allOk(results);
  const Status st = rank0.status();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("sync gossip: step 0, round 0"), std::string::npos) << st;
  EXPECT_NE(st.message().find("with rank 1"), std::string::npos) << st;
}

}  // namespace
}  // namespace cofab::sync
