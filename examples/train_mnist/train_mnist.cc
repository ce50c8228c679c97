// train_mnist: data-parallel SGD on Fashion-MNIST with a two-layer perceptron.
//
// Every step draws a global batch from a permutation all ranks share (seeded by epoch); rank r
// computes the gradient of its slice, normalised by the global batch size, the ranks' gradients
// are summed (--sync), and every rank applies the same update. The summed gradient equals the
// single-process gradient of the global batch, so 1 rank and N ranks train the same model up to
// float summation order.
//
//   ./train_mnist --epochs 5                                   one process
//   cofab-run -n 4 --role 'aggd:1:cofab-aggd' -- ./train_mnist --sync aggregator
//   cofab-run -n 4 --role 'aggd:2:cofab-aggd' -- ./train_mnist --sync easgd --elastic-alpha 0.2
//
// --sync with a training-sync algorithm (docs/SYNC.md) runs examples/train_mnist/sync_training.cc
// instead of the loop below.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/heap.h"
#include "core/param.h"
#include "examples/train_mnist/fashion_mnist.h"
#include "examples/train_mnist/gradient_sync.h"
#include "examples/train_mnist/mlp.h"
#include "examples/train_mnist/sync_training.h"
#include "examples/train_mnist/train_options.h"
#include "fabric/sync/sync_algorithm.h"

namespace ex = cofab::examples;

namespace {

void usage() {
  std::fprintf(
      stderr,
      "usage: train_mnist [--epochs N] [--batch GLOBAL] [--hidden H] [--lr LR]\n"
      "                   [--momentum M] [--seed S] [--data-dir DIR] [--limit N]\n"
      "                   [--sync %s]\n"
      "  algorithm options: [--threads T (eawild)] [--sync-every K] [--elastic-alpha A]\n"
      "                   [--gossip-peers ring|random] [--shadow-mode average|easgd]\n"
      "                   [--shadow-interval-ms MS] [--compression-block N]\n"
      "                   [--reply-feedback on|off (onebit; default off)]\n"
      "                   [--nesterov on|off (onebit; default on)]\n"
      "                   [--slow-rank R --slow-factor F] [--device-ms D]\n"
      "                   [--staleness-unit versions|clocks]\n"
      "                   [--gradient-stragglers S (gradcode; cofab-aggd needs the same)]\n"
      "                   [--gradcode-window W (rounds a worker may lag, default 128)]\n"
      "  (ssp's bounds are the daemons' --version-staleness and --staleness)\n"
      "  --limit (or the training set) must hold at least --batch samples\n",
      ex::syncModes().c_str());
}

// A command-line error: the reason and the usage, exit 2.
int badUsage(const cofab::Status& s) {
  std::fprintf(stderr, "train_mnist: %s\n", s.message().c_str());
  usage();
  return 2;
}

int fail(const cofab::Status& s) {
  std::fprintf(stderr, "train_mnist: %s\n", s.toString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = ex::parseTrainOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) return badUsage(parsed.status());
  const ex::TrainOptions& o = *parsed;
  // Model-sized buffers every step: keep them in the heap (core/heap.h).
  if (auto heap = cofab::keepLargeBlocksInHeap(); !heap.ok()) return fail(heap.status());
  if (cofab::sync::isSyncAlgorithm(o.sync)) {
    auto train = ex::loadFashionMnist(o.dataDir, "train");
    if (!train.ok()) return fail(train.status());
    auto test = ex::loadFashionMnist(o.dataDir, "t10k");
    if (!test.ok()) return fail(test.status());
    const size_t n = o.limit ? std::min(o.limit, train->count()) : train->count();
    if (auto st = ex::requireOneStepPerEpoch(n, o.batch); !st.ok()) return badUsage(st);
    ex::SyncTrainConfig c = o.algo;
    c.algorithm = o.sync;
    c.epochs = o.epochs;
    c.batch = o.batch;
    c.hidden = o.hidden;
    c.lr = o.lr;
    c.momentum = o.momentum;
    c.seed = o.seed;
    c.limit = o.limit;
    return ex::runSyncTraining(c, *train, *test);
  }
  auto sync = ex::makeGradientSync(o.sync);
  if (!sync.ok()) return fail(sync.status());
  ex::GradientSync& gs = **sync;
  const int rank = gs.rank(), world = gs.worldSize();
  if (o.batch % world != 0) {
    return fail(cofab::InvalidArgument("--batch " + std::to_string(o.batch) +
                                       " must be divisible by the " + std::to_string(world) +
                                       " ranks"));
  }

  // Ranks share the cores: one BLAS thread each unless the user says otherwise.
  if (world > 1 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);

  auto train = ex::loadFashionMnist(o.dataDir, "train");
  if (!train.ok()) return fail(train.status());
  auto test = ex::loadFashionMnist(o.dataDir, "t10k");
  if (!test.ok()) return fail(test.status());
  const size_t n = o.limit ? std::min(o.limit, train->count()) : train->count();
  // steps = n / batch below: with none, the loop would train nothing and still report.
  if (auto st = ex::requireOneStepPerEpoch(n, o.batch); !st.ok()) return badUsage(st);

  ex::Mlp model(ex::kImagePixels, o.hidden, ex::kClasses, o.seed);
  std::vector<float>& params = model.params();
  std::vector<float> grads(params.size()), velocity(params.size(), 0.0f);
  const int local = o.batch / world;
  std::vector<float> x(size_t(local) * ex::kImagePixels);
  std::vector<uint8_t> y(static_cast<size_t>(local));
  std::vector<uint32_t> perm(n);
  if (rank == 0) {
    std::printf(
        "train_mnist: %zu samples, %d rank(s), global batch %d, hidden %d, lr %g, "
        "momentum %g, sync %s\n",
        n, world, o.batch, o.hidden, double(o.lr), double(o.momentum), gs.describe().c_str());
  }

  double trainSecs = 0;
  size_t samples = 0;
  double acc = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(o.seed * 1000003u + uint64_t(epoch)));
    auto start = std::chrono::steady_clock::now();
    double loss = 0;
    const size_t steps = n / size_t(o.batch);
    for (size_t s = 0; s < steps; ++s) {
      const uint32_t* idx = perm.data() + s * size_t(o.batch) + size_t(rank) * size_t(local);
      for (int i = 0; i < local; ++i) {
        std::copy_n(train->images.data() + size_t(idx[i]) * ex::kImagePixels, ex::kImagePixels,
                    x.data() + size_t(i) * ex::kImagePixels);
        y[size_t(i)] = train->labels[idx[i]];
      }
      loss += model.gradient(x.data(), y.data(), local, float(o.batch), grads.data());
      if (auto st = gs.sumGradients(model.tensors(), grads, epoch * steps + s); !st.ok()) {
        return fail(
            st.withContext("epoch " + std::to_string(epoch) + " step " + std::to_string(s)));
      }
      for (size_t i = 0; i < params.size(); ++i) {
        velocity[i] = o.momentum * velocity[i] + grads[i];
      }
      model.step(velocity.data(), o.lr);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    trainSecs += secs;
    samples += steps * size_t(o.batch);
    acc = model.accuracy(test->images.data(), test->labels.data(), test->count());
    if (rank == 0) {
      std::printf("epoch %d: loss %.4f (rank 0's share) test accuracy %.4f, %.0f samples/s\n",
                  epoch + 1, loss / double(steps * size_t(local)), acc,
                  double(steps * size_t(o.batch)) / secs);
      std::fflush(stdout);
    }
  }
  if (auto st = gs.finish(); !st.ok()) return fail(st);
  if (rank == 0) {
    std::printf(
        "train_mnist: final test accuracy %.4f after %d epochs, %.0f samples/s, "
        "%.1f s training\n",
        acc, o.epochs, double(samples) / trainSecs, trainSecs);
    std::printf("RESULT train_run sync=%s workers=%d epochs=%d test_acc=%.4f samples_per_s=%.0f\n",
                o.sync.c_str(), world, o.epochs, acc, double(samples) / trainSecs);
  }
  return 0;
}
