// In-process replica of `train_mnist --sync onebit` (docs/COMPRESSION.md "Reply feedback"):
// the same MLP, data order, chunking, worker codec with per-key error feedback and the daemon's
// own reduction (aggregator::compressedReduce), without processes or sockets, so that variants
// of the error feedback can be compared in minutes on one core:
//   --reply-feedback 0|1   the daemon keeps a residual per (key, chunk) for its replies
//   --worker-feedback 0|1  the workers keep their residual (default 1)
//   --mode onebit|f32      f32: uncompressed sync, the reference (momentum after the average)
//   --nesterov 0|1         the workers quantize grad + momentum * v instead of v (train_mnist's
//                          onebit default since --nesterov on; this tool's default stays 0)
//   --decay-epochs K       the last K epochs run at lr / 10 (both modes)
//   --lr L --momentum M --block B --epochs E --limit N --seed S
// Not a registered benchmark (minutes of training); run it by hand. Prints one line per epoch
// and ends with RESULT onebit_sim ... test_acc=...
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "aggregator/compressed_reduce.h"
#include "examples/train_mnist/fashion_mnist.h"
#include "examples/train_mnist/mlp.h"
#include "fabric/compress/codec.h"
#include "fabric/ps/placement.h"

namespace {

using cofab::compress::Compression;
using namespace cofab::examples;

struct Config {
  std::string mode = "onebit";
  bool replyFeedback = false, workerFeedback = true, nesterov = false;
  int decayEpochs = 0;  // the last decayEpochs epochs run at lr / 10 (both modes)
  float lr = 0.02f, momentum = 0.9f;
  size_t block = cofab::compress::kDefaultBlock;
  int epochs = 8, workers = 4, batch = 128, hidden = 256;
  size_t limit = 0;
  uint64_t seed = 1;
  size_t chunkBytes = 64 << 10;  // as train_mnist
};

bool parse(int argc, char** argv, Config* c) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode" && (v == "onebit" || v == "f32"))
      c->mode = v;
    else if (k == "--reply-feedback")
      c->replyFeedback = v == "1";
    else if (k == "--worker-feedback")
      c->workerFeedback = v == "1";
    else if (k == "--nesterov")
      c->nesterov = v == "1";
    else if (k == "--decay-epochs")
      c->decayEpochs = std::stoi(v);
    else if (k == "--lr")
      c->lr = std::stof(v);
    else if (k == "--momentum")
      c->momentum = std::stof(v);
    else if (k == "--block")
      c->block = std::stoul(v);
    else if (k == "--epochs")
      c->epochs = std::stoi(v);
    else if (k == "--limit")
      c->limit = std::stoul(v);
    else if (k == "--seed")
      c->seed = std::stoull(v);
    else
      return false;
  }
  return (argc % 2) == 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (!parse(argc, argv, &c)) {
    std::fprintf(stderr,
                 "usage: onebit_feedback_sim [--mode onebit|f32] [--reply-feedback 0|1] "
                 "[--worker-feedback 0|1] [--lr L] [--momentum M] [--block B] "
                 "[--epochs E] [--limit N] [--seed S]\n");
    return 2;
  }
  auto train = loadFashionMnist(kDefaultDataDir, "train");
  auto test = loadFashionMnist(kDefaultDataDir, "t10k");
  if (!train.ok() || !test.ok()) {
    std::fprintf(stderr, "onebit_feedback_sim: %s\n",
                 (train.ok() ? test.status() : train.status()).toString().c_str());
    return 1;
  }
  const size_t n = c.limit ? std::min(c.limit, train->count()) : train->count();
  const bool onebit = c.mode == "onebit";
  Mlp model(kImagePixels, c.hidden, kClasses, c.seed);
  std::vector<Mlp> local;
  for (int r = 0; r < c.workers; ++r) local.emplace_back(kImagePixels, c.hidden, kClasses, c.seed);
  const size_t total = model.params().size();
  const auto& tensors = model.tensors();
  const int perWorker = c.batch / c.workers;
  // Per worker: gradient, velocity, residual; the sample stream as train_mnist's SampleStream.
  std::vector<std::vector<float>> grad(c.workers, std::vector<float>(total)),
      velocity(c.workers, std::vector<float>(total, 0.0f)),
      residual(c.workers, std::vector<float>(total, 0.0f));
  std::vector<std::mt19937_64> rng;
  std::vector<std::vector<uint32_t>> perm(c.workers, std::vector<uint32_t>(n));
  std::vector<size_t> at(c.workers, n);
  for (int r = 0; r < c.workers; ++r) rng.emplace_back(c.seed * 1000003u + uint64_t(r));
  std::vector<float> replyResidual(total, 0.0f), update(total), syncVelocity(total, 0.0f);
  std::vector<float> x(size_t(perWorker) * kImagePixels);
  std::vector<uint8_t> y(perWorker);
  double residualNorm = 0, updateNorm = 0;
  double acc = 0;
  uint64_t samples = 0;
  std::vector<float> send(total);
  for (int epoch = 0; epoch < c.epochs; ++epoch) {
    const float lr = epoch >= c.epochs - c.decayEpochs ? c.lr / 10 : c.lr;
    while (samples < uint64_t(epoch + 1) * n) {
      std::vector<std::vector<std::shared_ptr<std::vector<uint8_t>>>> sent(c.workers);
      std::fill(update.begin(), update.end(), 0.0f);
      for (int r = 0; r < c.workers; ++r) {
        for (int i = 0; i < perWorker; ++i) {
          if (at[r] == n) {
            std::iota(perm[r].begin(), perm[r].end(), 0u);
            std::shuffle(perm[r].begin(), perm[r].end(), rng[r]);
            at[r] = 0;
          }
          const uint32_t idx = perm[r][at[r]++];
          std::copy_n(train->images.data() + size_t(idx) * kImagePixels, kImagePixels,
                      x.data() + size_t(i) * kImagePixels);
          y[i] = train->labels[idx];
        }
        local[r].params() = model.params();
        local[r].gradient(x.data(), y.data(), perWorker, float(perWorker), grad[r].data());
        if (!onebit) {
          for (size_t j = 0; j < total; ++j) update[j] += grad[r][j];
          continue;
        }
        for (size_t j = 0; j < total; ++j)
          velocity[r][j] = c.momentum * velocity[r][j] + grad[r][j];
        const float* out = velocity[r].data();
        if (c.nesterov) {
          for (size_t j = 0; j < total; ++j) send[j] = grad[r][j] + c.momentum * velocity[r][j];
          out = send.data();
        }
        // Per tensor, per chunk: what PushPullClient sends.
        for (const auto& t : tensors) {
          const auto layout = cofab::ps::chunkLayout(t.count, sizeof(float), c.chunkBytes);
          for (uint32_t k = 0; k < layout.chunkCount; ++k) {
            const size_t first = t.offset + size_t(k) * layout.elementsPerChunk;
            const size_t m = std::min(layout.elementsPerChunk, t.offset + t.count - first);
            auto enc = std::make_shared<std::vector<uint8_t>>(
                cofab::compress::compressedBytes(Compression::kOneBit, m, c.block));
            cofab::compress::compress(Compression::kOneBit, out + first, m, c.block,
                                      c.workerFeedback ? residual[r].data() + first : nullptr,
                                      enc->data());
            sent[r].push_back(std::move(enc));
          }
        }
      }
      if (onebit) {
        // The daemon's reduction per chunk, chunk by chunk in the same order as sent.
        size_t chunk = 0;
        for (const auto& t : tensors) {
          const auto layout = cofab::ps::chunkLayout(t.count, sizeof(float), c.chunkBytes);
          for (uint32_t k = 0; k < layout.chunkCount; ++k, ++chunk) {
            const size_t first = t.offset + size_t(k) * layout.elementsPerChunk;
            const size_t m = std::min(layout.elementsPerChunk, t.offset + t.count - first);
            std::vector<std::shared_ptr<std::vector<uint8_t>>> in;
            for (int r = 0; r < c.workers; ++r) in.push_back(sent[r][chunk]);
            auto reply = cofab::aggregator::compressedReduce(
                Compression::kOneBit, /*average=*/true, in, m, c.block,
                c.replyFeedback ? replyResidual.data() + first : nullptr);
            if (!cofab::compress::decompress(Compression::kOneBit, reply->data(), reply->size(), m,
                                             update.data() + first)
                     .ok()) {
              std::fprintf(stderr, "onebit_feedback_sim: bad reply\n");
              return 1;
            }
          }
        }
        model.step(update.data(), lr);
      } else {
        for (size_t j = 0; j < total; ++j) {
          syncVelocity[j] = c.momentum * syncVelocity[j] + update[j] / float(c.workers);
        }
        model.step(syncVelocity.data(), lr);
      }
      samples += uint64_t(c.batch);
    }
    acc = model.accuracy(test->images.data(), test->labels.data(), test->count());
    // The model with every update still held back in a residual applied ("flushed"): how much
    // of the gap is error feedback's delay rather than lost information.
    Mlp& flushed = local[0];
    flushed.params() = model.params();
    std::vector<float> pending(replyResidual);
    for (int r = 0; r < c.workers; ++r) {
      for (size_t j = 0; j < total; ++j) pending[j] += residual[r][j] / float(c.workers);
    }
    flushed.step(pending.data(), c.lr);
    const double flushedAcc =
        onebit ? flushed.accuracy(test->images.data(), test->labels.data(), test->count()) : acc;
    residualNorm = 0;
    updateNorm = 0;
    for (size_t j = 0; j < total; ++j) {
      residualNorm += double(replyResidual[j]) * replyResidual[j];
      updateNorm += double(update[j]) * update[j];
    }
    std::printf(
        "epoch %d: test accuracy %.4f (residuals flushed: %.4f), |reply residual| / |reply| %.2f\n",
        epoch + 1, acc, flushedAcc, std::sqrt(residualNorm / std::max(updateNorm, 1e-30)));
    std::fflush(stdout);
  }
  std::printf(
      "RESULT onebit_sim mode=%s reply_feedback=%d worker_feedback=%d lr=%g block=%zu seed=%llu "
      "epochs=%d nesterov=%d decay_epochs=%d test_acc=%.4f\n",
      c.mode.c_str(), int(c.replyFeedback), int(c.workerFeedback), double(c.lr), c.block,
      static_cast<unsigned long long>(c.seed), c.epochs, int(c.nesterov), c.decayEpochs, acc);
  return 0;
}
