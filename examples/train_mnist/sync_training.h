// train_mnist's loop for the training-sync algorithms (fabric/sync, docs/SYNC.md): --sync
// sync|ssp|shadowsync|easgd|eawild|gossip|int8|onebit|gradcode. (--sync local and --sync aggregator
// keep their own loop in train_mnist.cc.)
//
// Every worker streams its own shuffled order of the training set; an epoch ends when the job
// (all workers together, as SyncAlgorithm::globalSamples() knows it) has processed as many
// samples as the training set holds, so with asynchronous algorithms fast workers do more of
// the work. Rank 0 evaluates its model on the test set at each epoch end (counted in the wall
// time it prints: the others keep training meanwhile under the asynchronous algorithms) and the
// final model after SyncAlgorithm::finish().
#pragma once

#include <cstdint>
#include <string>

#include "examples/train_mnist/fashion_mnist.h"

namespace cofab::examples {

struct SyncTrainConfig {
  std::string algorithm;
  int epochs = 5;
  int batch = 128;  // global: each worker's steps use batch / workers samples
  int hidden = 256;
  float lr = 0.05f;
  float momentum = 0.9f;
  uint64_t seed = 1;
  size_t limit = 0;
  int threads = 1;         // eawild
  int syncEvery = 0;       // 0: the algorithm's default (easgd/eawild 4, else 1)
  float elasticAlpha = 0;  // 0: 0.9 / workers
  std::string gossipPeers = "ring";
  std::string shadowMode = "average";
  std::string stalenessUnit = "versions";  // ssp: versions | clocks
  int64_t shadowIntervalMs = 0;
  size_t compressionBlock = 0;  // int8/onebit, 0: the codec's default
  int gradientStragglers = 1;   // gradcode: s (the daemons need --gradient-stragglers s)
  // gradcode: rounds a worker may fall behind (rank 0's test-set evaluation at each epoch end
  // lets the others run ~50-100 rounds ahead); the daemons keep that many rounds' results.
  int gradcodeWindow = 128;
  bool onebitNesterov = true;  // onebit: quantize the Nesterov look-ahead step
  bool replyFeedback = false;  // onebit: the daemons' error feedback on the replies
  int slowRank = -1;           // this rank sleeps (slowFactor - 1) x its compute time every step
  double slowFactor = 1.0;
  int deviceMs = 0;  // every rank also sleeps this long per step (simulated accelerator time)
};

// Runs the whole job on this worker (bootstraps from the launcher's environment); the exit code.
int runSyncTraining(const SyncTrainConfig& config, const Dataset& train, const Dataset& test);

}  // namespace cofab::examples
