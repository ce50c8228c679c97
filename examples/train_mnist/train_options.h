// train_mnist's command line (examples/train_mnist/train_mnist.cc), in the library so that
// tests/examples can check it. Every option takes a value; integers go through core/param.h's
// parseIntIn and numbers through a strict parser, each with a range, so "" / "12x" / "-1" /
// 4294967424 are InvalidArgument naming the option (strtol / strtoull read them as 0, 12, a
// wrapped 2^64-1 and a truncated 128).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "examples/train_mnist/fashion_mnist.h"
#include "examples/train_mnist/sync_training.h"

namespace cofab::examples {

struct TrainOptions {
  int epochs = 5;
  int batch = 128;  // global
  int hidden = 256;
  float lr = 0.05f;
  float momentum = 0.9f;
  uint64_t seed = 1;
  std::string dataDir = kDefaultDataDir;
  std::string sync = "local";
  size_t limit = 0;      // use only the first N training samples (0: all)
  SyncTrainConfig algo;  // --sync <algorithm> options
};

// argv[1..] as a list: "--name value" pairs. InvalidArgument naming the option for an unknown
// option, a missing or empty value, a malformed or out-of-range number, and a --limit below
// --batch (an epoch of no step).
StatusOr<TrainOptions> parseTrainOptions(const std::vector<std::string>& args);

// At least one step per epoch: `samples` (the training samples in use) >= the global batch.
// With fewer, the loop runs no step (loss 0/0 = NaN, no training) yet reports an accuracy.
Status requireOneStepPerEpoch(size_t samples, int batch);

}  // namespace cofab::examples
