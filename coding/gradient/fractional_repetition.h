// Gradient coding with fractional repetition (Tandon et al., "Gradient coding", ICML 2017):
// n workers tolerate any s stragglers in computing the full gradient sum over n data partitions.
//
// Workers form n/(s+1) groups of s+1; every worker of group g holds the same s+1 partitions
// (g(s+1) .. g(s+1)+s) and sends the sum of their gradients. Any s stragglers leave at least one
// worker per group, so the decoder takes the first arrival of each group and adds the groups up.
// Cost: each worker computes s+1 partitions instead of 1 (storage and compute x (s+1)); the
// message size is unchanged. Requires (s+1) to divide n.
//
// The decoder adds the groups in group order in f32, whatever order they arrived in, so the
// result does not depend on which replica or arrival order won. Threads: the code is immutable;
// a GradientDecoder is used by one thread at a time and owns a copy of each group's first arrival.
#pragma once

#include <span>
#include <vector>

#include "core/status.h"

namespace cofab::coding {

struct FractionalRepetitionOptions {
  int workers = 0;     // n >= 1
  int stragglers = 0;  // s >= 0, (s + 1) divides n
};

class FractionalRepetitionCode {
 public:
  static StatusOr<FractionalRepetitionCode> create(const FractionalRepetitionOptions& options);

  int workers() const { return n_; }
  int stragglers() const { return s_; }
  int groups() const { return n_ / (s_ + 1); }
  int groupOf(int worker) const { return worker / (s_ + 1); }
  // The data partitions (of n) whose gradients worker `worker` sums.
  std::vector<int> partitionsOf(int worker) const;

  // What encode() checks: a valid worker, s+1 partition gradients, each of `elements`.
  Status checkEncode(int worker, std::span<const std::span<const float>> partitionGradients,
                     size_t elements) const;
  // Worker side: out = sum of the gradients of partitionsOf(worker), given in that order.
  Status encode(int worker, std::span<const std::span<const float>> partitionGradients,
                std::span<float> out) const;

 private:
  FractionalRepetitionCode(int n, int s) : n_(n), s_(s) {}
  int n_;
  int s_;
};

class GradientDecoder {
 public:
  GradientDecoder(const FractionalRepetitionCode& code, size_t elements);

  // Offers worker `worker`'s message. Returns whether it was used (the first of its group).
  // InvalidArgument on a bad worker index, a wrong length or the same worker twice.
  StatusOr<bool> add(int worker, std::span<const float> message);

  bool complete() const { return groupsDone_ == code_.groups(); }
  const std::vector<int>& usedWorkers() const { return used_; }

  // out = the full gradient sum. FailedPrecondition (naming the groups) while incomplete.
  Status finish(std::span<float> out) const;

 private:
  FractionalRepetitionCode code_;
  size_t elements_;
  std::vector<std::vector<float>> groupSum_;
  std::vector<bool> seenWorker_;
  std::vector<bool> groupDone_;
  std::vector<int> used_;
  int groupsDone_ = 0;
};

}  // namespace cofab::coding
