#include "examples/train_mnist/sync_training.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "examples/train_mnist/mlp.h"
#include "fabric/comm/communicator.h"
#include "fabric/rendezvous/bootstrap.h"
#include "fabric/sync/sync_algorithm.h"

namespace cofab::examples {
namespace {

using Clock = std::chrono::steady_clock;

int fail(const Status& s) {
  std::fprintf(stderr, "train_mnist: %s\n", s.toString().c_str());
  return 1;
}

// One training thread's stream of samples: its own permutation of the training set, reshuffled
// at every pass.
class SampleStream {
 public:
  SampleStream(size_t n, uint64_t seed) : perm_(n), rng_(seed) { reshuffle(); }
  uint32_t next() {
    if (at_ == perm_.size()) reshuffle();
    return perm_[at_++];
  }

 private:
  void reshuffle() {
    std::iota(perm_.begin(), perm_.end(), 0u);
    std::shuffle(perm_.begin(), perm_.end(), rng_);
    at_ = 0;
  }
  std::vector<uint32_t> perm_;
  std::mt19937_64 rng_;
  size_t at_ = 0;
};

}  // namespace

int runSyncTraining(const SyncTrainConfig& c, const Dataset& train, const Dataset& test) {
  auto boot = bootstrapFromEnv(Deadline::afterMs(120000));
  if (!boot.ok()) return fail(boot.status());
  const int rank = boot->info.rank, world = boot->info.worldSize;
  if (c.batch % world != 0) {
    return fail(InvalidArgument("--batch " + std::to_string(c.batch) +
                                " must be divisible by the " + std::to_string(world) + " ranks"));
  }
  if (world > 1 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);

  sync::SyncOptions so;
  so.algorithm = c.algorithm;
  so.lr = c.lr;
  so.momentum = c.momentum;
  so.threads = c.threads;
  so.syncEvery =
      c.syncEvery > 0 ? c.syncEvery : (c.algorithm == "easgd" || c.algorithm == "eawild" ? 4 : 1);
  so.elasticAlpha = c.elasticAlpha;
  so.gossipPeers = c.gossipPeers;
  so.shadowMode = c.shadowMode;
  so.shadowIntervalMs = c.shadowIntervalMs;
  so.stalenessUnit = c.stalenessUnit;
  so.seed = c.seed;
  so.compressionBlock = c.compressionBlock;
  so.gradientStragglers = c.gradientStragglers;
  so.gradcodeWindow = c.gradcodeWindow;
  so.replyFeedback = c.replyFeedback;
  so.onebitNesterov = c.onebitNesterov;
  sync::SyncEnv env;
  env.rank = rank;
  env.worldSize = world;
  env.store = boot->store.get();
  // The model is ~0.8 MB: 64 KiB chunks spread the big layer over every daemon (as --sync
  // aggregator does).
  env.client.chunkBytes = 64 << 10;
  std::unique_ptr<comm::Communicator> comm;
  if (!sync::needsAggregators(c.algorithm)) {
    comm::CommOptions co;
    co.name = "train-mnist-gossip";
    auto made = comm::Communicator::create(rank, world, boot->store.get(), co);
    if (!made.ok()) return fail(made.status());
    comm = std::move(*made);
    env.comm = comm.get();
  }
  auto made = sync::makeSyncAlgorithm(so, env);
  if (!made.ok()) return fail(made.status());
  sync::SyncAlgorithm& algo = **made;

  const size_t n = c.limit ? std::min(c.limit, train.count()) : train.count();
  Mlp init(kImagePixels, c.hidden, kClasses, c.seed);
  std::vector<size_t> counts;
  for (const TensorSlot& t : init.tensors()) counts.push_back(t.count);
  if (auto st = algo.start(init.params(), counts); !st.ok()) return fail(st);
  const int threads = algo.threads();
  const int local = c.batch / world;
  const int perThread = std::max(1, local / threads);
  if (rank == 0) {
    std::printf(
        "train_mnist: %zu samples, %d rank(s), global batch %d (%d per thread, %d "
        "thread(s) per rank), hidden %d, lr %g, momentum %g, sync %s%s\n",
        n, world, c.batch, perThread, threads, c.hidden, double(c.lr), double(c.momentum),
        c.algorithm.c_str(),
        c.slowRank >= 0 ? (", rank " + std::to_string(c.slowRank) + " slowed " +
                           std::to_string(c.slowFactor) + "x")
                              .c_str()
                        : "");
    std::fflush(stdout);
  }

  struct Worker {
    std::unique_ptr<Mlp> model;
    std::vector<float> grads, partGrads, x;
    std::vector<uint8_t> y;
    // One stream per data partition this worker computes (algo.partitions(): its own rank, or
    // gradcode's s+1 partitions), seeded by the partition, so replicas draw the same samples.
    std::vector<std::unique_ptr<SampleStream>> streams;
    uint64_t step = 0;
  };
  const std::vector<int> parts = algo.partitions();
  std::vector<Worker> workers(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    Worker& w = workers[size_t(t)];
    w.model = std::make_unique<Mlp>(kImagePixels, c.hidden, kClasses, c.seed);
    w.grads.resize(w.model->params().size());
    w.partGrads.resize(w.model->params().size());
    w.x.resize(size_t(perThread) * kImagePixels);
    w.y.resize(size_t(perThread));
    for (int p : parts) {
      w.streams.push_back(
          std::make_unique<SampleStream>(n, c.seed * 1000003u + uint64_t(p * threads + t)));
    }
  }
  std::mutex errMu;
  Status firstError;
  std::atomic<bool> failed{false};  // stops the other threads of this worker
  auto trainUntil = [&](int t, uint64_t target) {
    Worker& w = workers[size_t(t)];
    while (algo.globalSamples() < target && !failed.load()) {
      auto t0 = Clock::now();
      StatusOr<bool> need = algo.needsGradient(t, w.step);
      Status st = need.status();
      if (need.ok() && !*need) {
        // The round completed without this worker (gradcode straggler): skip its samples.
        for (auto& stream : w.streams) {
          for (int i = 0; i < perThread; ++i) stream->next();
        }
        st = algo.step(t, {}, w.step++, uint64_t(perThread));
      } else if (need.ok()) {
        algo.read(t, w.model->params());
        for (size_t p = 0; p < w.streams.size(); ++p) {
          for (int i = 0; i < perThread; ++i) {
            uint32_t idx = w.streams[p]->next();
            std::copy_n(train.images.data() + size_t(idx) * kImagePixels, kImagePixels,
                        w.x.data() + size_t(i) * kImagePixels);
            w.y[size_t(i)] = train.labels[idx];
          }
          // The sum of the partitions' mean gradients (one partition: just its mean).
          float* out = p == 0 ? w.grads.data() : w.partGrads.data();
          w.model->gradient(w.x.data(), w.y.data(), perThread, float(perThread), out);
          if (p > 0) {
            for (size_t i = 0; i < w.grads.size(); ++i) w.grads[i] += w.partGrads[i];
          }
        }
        // Simulated accelerator time: a step that waits without occupying a CPU core, so a
        // small host can show who waits for whom (on 2 cores the CPU math alone is contended).
        if (c.deviceMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(c.deviceMs));
        if (rank == c.slowRank && c.slowFactor > 1.0) {
          std::this_thread::sleep_for((Clock::now() - t0) * (c.slowFactor - 1.0));
        }
        st = algo.step(t, w.grads, w.step++, uint64_t(perThread));
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(errMu);
        if (firstError.ok()) firstError = st;
        failed = true;
        return;
      }
    }
  };

  Mlp eval(kImagePixels, c.hidden, kClasses, c.seed);
  // Wall time since training started, rank 0's evaluations included: under the asynchronous
  // algorithms the other workers keep training while rank 0 evaluates, so excluding them would
  // credit those algorithms with free time.
  const auto trainStart = Clock::now();
  double wall = 0;
  double acc = 0;
  for (int epoch = 0; epoch < c.epochs; ++epoch) {
    const uint64_t target = uint64_t(epoch + 1) * n;
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(trainUntil, t, target);
    trainUntil(0, target);
    for (auto& th : pool) th.join();
    if (!firstError.ok()) {
      return fail(firstError.withContext("rank " + std::to_string(rank) + " epoch " +
                                         std::to_string(epoch)));
    }
    wall = std::chrono::duration<double>(Clock::now() - trainStart).count();
    if (rank == 0) {
      algo.read(0, eval.params());
      acc = eval.accuracy(test.images.data(), test.labels.data(), test.count());
      sync::SyncStats s = algo.stats();
      std::printf(
          "epoch %d: test accuracy %.4f wall %.2f s, %.0f samples/s (job), syncs %llu, "
          "%.1f syncs/s\n",
          epoch + 1, acc, wall, double(algo.globalSamples()) / wall,
          static_cast<unsigned long long>(s.syncs), s.syncsPerSecond);
      std::fflush(stdout);
    }
  }
  std::vector<float> final(init.params().size());
  if (auto st = algo.finish(final); !st.ok()) return fail(st.withContext("finish"));
  // After finish(): every worker's samples are published (the asynchronous algorithms publish
  // every few steps during training).
  const uint64_t globalSamples = algo.globalSamples();
  sync::SyncStats s = algo.stats();
  std::printf(
      "RESULT sync_worker algo=%s rank=%d steps=%llu syncs=%llu bytes_sent=%llu "
      "bytes_received=%llu max_staleness=%llu mean_staleness=%.2f dropped=%llu "
      "dropped_samples=%llu syncs_per_s=%.1f steps_per_sync=%.2f skipped=%llu\n",
      c.algorithm.c_str(), rank, static_cast<unsigned long long>(s.steps),
      static_cast<unsigned long long>(s.syncs), static_cast<unsigned long long>(s.bytesSent),
      static_cast<unsigned long long>(s.bytesReceived),
      static_cast<unsigned long long>(s.maxStaleness), s.meanStaleness,
      static_cast<unsigned long long>(s.dropped), static_cast<unsigned long long>(s.droppedSamples),
      s.syncsPerSecond, s.stepsPerSync, static_cast<unsigned long long>(s.skipped));
  if (rank == 0) {
    eval.params() = final;
    acc = eval.accuracy(test.images.data(), test.labels.data(), test.count());
    std::printf(
        "train_mnist: final test accuracy %.4f after %d epochs, %.0f samples/s, %.1f s "
        "training\n",
        acc, c.epochs, double(globalSamples) / wall, wall);
    std::printf("RESULT train_run sync=%s workers=%d epochs=%d test_acc=%.4f samples_per_s=%.0f\n",
                c.algorithm.c_str(), world, c.epochs, acc, double(globalSamples) / wall);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace cofab::examples
