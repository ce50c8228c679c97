// Coded data shuffling (Lee et al., "Speeding up distributed machine learning using codes",
// with the cache placement and delivery of Maddah-Ali and Niesen).
//
// A master holds `rows` data rows; each of n workers caches a fraction alpha = t/n of them. The
// placement is fixed: rows are split at random into C(n, t) equal groups, one per t-subset T of
// workers, and a group is cached by exactly the workers in T. Every epoch a new random assignment
// gives each worker a batch of rows/n rows. A worker needs the rows of its batch it does not
// cache; for every (t+1)-subset U of workers and every w in U, let L(U, w) be the rows w needs
// that are cached by exactly U \ {w}. The master multicasts, for each U, XORs of one row from
// each non-empty L(U, w); worker w cancels the other rows (it caches all of them) and keeps its
// own. One multicast serves t+1 workers, so the master sends about
//     rows (1 - alpha) / (1 + n alpha)  rows        (theory)
// against rows (1 - alpha) for uncoded unicast: a reduction of 1 + n alpha.
//
// Assignment kStratified deals every group's rows evenly over the workers (random order, random
// worker labels each epoch), so every list L(U, w) has the same length to within one row and
// the coded count meets the theory up to rounding; kUniform assigns rows uniformly at random and
// shows the cost of unequal lists (padding).
//
// Ownership: plans are values; encode/decode read caller-owned rows and write caller-owned
// buffers. Threads: a CodedShuffle is immutable after create(); planEpoch/encode/decode may run
// concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace cofab::coding {

enum class ShuffleAssignment : uint8_t { kStratified, kUniform };

struct CodedShuffleOptions {
  int workers = 0;           // n, 1..24
  double cacheFraction = 0;  // alpha; alpha * n must be an integer t in [0, n]
  int64_t rows = 0;          // data rows, 1 to 2^40 (the placement keeps 12 bytes a row)
  uint64_t seed = 1;         // placement and assignments
  ShuffleAssignment assignment = ShuffleAssignment::kStratified;
};

// One multicast: the XOR of `rows[i]`, each wanted by `workers[i]`.
struct ShuffleMessage {
  std::vector<int> workers;
  std::vector<int64_t> rows;
};

// What the master sends in one epoch. Payload bytes only; headerBytes estimates the row ids a
// message must carry (8 bytes per row id), reported apart.
struct ShuffleAccounting {
  int64_t neededRows = 0;    // batch rows not in the receiving worker's cache
  int64_t localRows = 0;     // batch rows already cached (nothing sent)
  int64_t messages = 0;      // multicasts sent, each counted once
  int64_t codedBytes = 0;    // messages * rowBytes
  int64_t uncodedBytes = 0;  // neededRows * rowBytes: every needed row unicast
  double theoryBytes = 0;    // rows (1 - alpha) / (1 + t) * rowBytes
  int64_t headerBytes = 0;
  double reduction() const { return codedBytes > 0 ? double(uncodedBytes) / codedBytes : 0; }
};

struct ShufflePlan {
  int64_t epoch = 0;
  std::vector<std::vector<int64_t>> batch;  // per worker: its rows this epoch
  // Per worker, parallel to batch: the message carrying that row, or -1 when it is cached.
  std::vector<std::vector<int64_t>> source;
  std::vector<ShuffleMessage> messages;
  ShuffleAccounting accounting;
};

// A worker's cache: the rows it stores, copied out of the data set (owns its bytes).
class WorkerCache {
 public:
  int worker() const { return worker_; }
  size_t rowBytes() const { return rowBytes_; }
  // Null when the row is not cached here.
  const uint8_t* row(int64_t r) const;
  size_t rowCount() const { return index_.size(); }

 private:
  friend class CodedShuffle;
  int worker_ = 0;
  size_t rowBytes_ = 0;
  std::vector<int64_t> index_;  // row id -> slot, sorted by row id
  std::vector<int64_t> slots_;
  std::vector<uint8_t> bytes_;
};

class CodedShuffle {
 public:
  static StatusOr<CodedShuffle> create(const CodedShuffleOptions& options);

  int workers() const { return n_; }
  int cachedBy() const { return t_; }  // t: workers caching each row
  int64_t rows() const { return rows_; }
  bool caches(int worker, int64_t row) const {
    return (groupMask_[groupOfRow_[row]] >> worker) & 1u;
  }

  // The assignment and multicast plan for `epoch` (deterministic in seed and epoch); rowBytes
  // only scales the accounting.
  StatusOr<ShufflePlan> planEpoch(int64_t epoch, size_t rowBytes) const;

  // Builds worker `worker`'s cache from the data set (rows x rowBytes, contiguous).
  StatusOr<WorkerCache> buildCache(int worker, std::span<const uint8_t> data,
                                   size_t rowBytes) const;

  // Master side: out (messages x rowBytes) = the XORs of the plan.
  Status encode(const ShufflePlan& plan, std::span<const uint8_t> data, size_t rowBytes,
                std::span<uint8_t> out) const;

  // Worker side: fills batchOut (batch size x rowBytes, in plan.batch[worker] order) from its
  // cache and the messages. FailedPrecondition if the cache lacks a row the plan relies on.
  Status decode(const ShufflePlan& plan, const WorkerCache& cache,
                std::span<const uint8_t> messages, std::span<uint8_t> batchOut) const;

 private:
  CodedShuffle() = default;

  int n_ = 0;
  int t_ = 0;
  int64_t rows_ = 0;
  uint64_t seed_ = 0;
  ShuffleAssignment assignment_ = ShuffleAssignment::kStratified;
  std::vector<uint64_t> groupMask_;  // per group: the t workers caching it
  std::vector<int64_t> groupStart_;  // groupRows_ offsets, size groups + 1
  std::vector<int64_t> groupRows_;   // rows ordered by group
  std::vector<uint32_t> groupOfRow_;
};

}  // namespace cofab::coding
