#include "coding/shuffle/coded_shuffle.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <numeric>
#include <random>
#include <string>

#include "coding/shuffle/xor_bytes.h"

namespace cofab::coding {
namespace {

constexpr int kMaxWorkers = 24;
constexpr int64_t kMaxGroups = int64_t{1} << 20;
// The placement keeps 12 bytes a row (more than any memory long before this), and splits rows
// over groups with i * rows / groups, which must not overflow: kMaxRows * kMaxGroups <= 2^62.
constexpr int64_t kMaxRows = int64_t{1} << 40;

double binomial(int n, int k) {
  double c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c;
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// rowBytes > 0 with rows x rowBytes within int64: every byte count and buffer size of the data set
// (and of any plan, whose messages and needed rows are at most `rows`) is then exact; unchecked,
// the size checks below compared against a wrapped product and passed for empty buffers.
Status checkRowBytes(const char* what, int64_t rows, size_t rowBytes) {
  if (rowBytes == 0) return InvalidArgument(std::string(what) + ": rowBytes must be > 0");
  if (rowBytes > static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(rows)) {
    return InvalidArgument(std::string(what) + ": " + std::to_string(rows) + " rows of " +
                           std::to_string(rowBytes) + " bytes exceed 2^63 - 1 bytes");
  }
  return OkStatus();
}

}  // namespace

const uint8_t* WorkerCache::row(int64_t r) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), r);
  if (it == index_.end() || *it != r) return nullptr;
  return bytes_.data() + static_cast<size_t>(it - index_.begin()) * rowBytes_;
}

StatusOr<CodedShuffle> CodedShuffle::create(const CodedShuffleOptions& o) {
  if (o.workers < 1 || o.workers > kMaxWorkers) {
    return InvalidArgument("coded shuffle: workers must be in [1, " + std::to_string(kMaxWorkers) +
                           "], got " + std::to_string(o.workers));
  }
  const double tReal = o.cacheFraction * o.workers;
  const int t = static_cast<int>(std::lround(tReal));
  if (!(o.cacheFraction >= 0 && o.cacheFraction <= 1) || std::fabs(tReal - t) > 1e-9) {
    return InvalidArgument(
        "coded shuffle: cacheFraction * workers must be an integer in [0, "
        "workers] (each row cached by that many workers); got " +
        std::to_string(o.cacheFraction) + " * " + std::to_string(o.workers));
  }
  if (o.rows < 1 || o.rows > kMaxRows) {
    return InvalidArgument("coded shuffle: rows must be in [1, 2^40], got " +
                           std::to_string(o.rows));
  }
  const double groups = binomial(o.workers, t);
  if (groups > static_cast<double>(kMaxGroups)) {
    return InvalidArgument("coded shuffle: C(" + std::to_string(o.workers) + ", " +
                           std::to_string(t) + ") cache groups is more than " +
                           std::to_string(kMaxGroups) + "; use fewer workers");
  }
  CodedShuffle s;
  s.n_ = o.workers;
  s.t_ = t;
  s.rows_ = o.rows;
  s.seed_ = o.seed;
  s.assignment_ = o.assignment;
  for (uint64_t mask = 0; mask < (uint64_t{1} << o.workers); ++mask) {
    if (std::popcount(mask) == t) s.groupMask_.push_back(mask);
  }
  const int64_t g = static_cast<int64_t>(s.groupMask_.size());
  try {
    s.groupRows_.resize(o.rows);
    s.groupOfRow_.resize(o.rows);
  } catch (const std::bad_alloc&) {  // library code returns errors, it does not throw them
    return ResourceExhausted("coded shuffle: no memory for the placement of " +
                             std::to_string(o.rows) + " rows (12 bytes a row)");
  }
  std::iota(s.groupRows_.begin(), s.groupRows_.end(), 0);
  std::mt19937_64 rng(mix(o.seed));
  std::shuffle(s.groupRows_.begin(), s.groupRows_.end(), rng);
  s.groupStart_.resize(g + 1);
  for (int64_t i = 0; i <= g; ++i) s.groupStart_[i] = i * o.rows / g;
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t p = s.groupStart_[i]; p < s.groupStart_[i + 1]; ++p) {
      s.groupOfRow_[s.groupRows_[p]] = static_cast<uint32_t>(i);
    }
  }
  return s;
}

StatusOr<ShufflePlan> CodedShuffle::planEpoch(int64_t epoch, size_t rowBytes) const {
  COFAB_RETURN_IF_ERROR(checkRowBytes("coded shuffle", rows_, rowBytes));
  std::mt19937_64 rng(mix(seed_ ^ mix(static_cast<uint64_t>(epoch) + 1)));
  std::vector<int> label(n_);
  std::iota(label.begin(), label.end(), 0);
  std::shuffle(label.begin(), label.end(), rng);

  // The dealing order: row sequence[i] goes to worker label[i mod n].
  std::vector<int64_t> sequence;
  sequence.reserve(rows_);
  if (assignment_ == ShuffleAssignment::kStratified) {
    std::vector<int64_t> order(groupMask_.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t gi : order) {
      const size_t first = sequence.size();
      sequence.insert(sequence.end(), groupRows_.begin() + groupStart_[gi],
                      groupRows_.begin() + groupStart_[gi + 1]);
      std::shuffle(sequence.begin() + first, sequence.end(), rng);
    }
  } else {
    sequence.resize(rows_);
    std::iota(sequence.begin(), sequence.end(), 0);
    std::shuffle(sequence.begin(), sequence.end(), rng);
  }

  ShufflePlan plan;
  plan.epoch = epoch;
  plan.batch.assign(n_, {});
  plan.source.assign(n_, {});
  struct Need {
    uint64_t group;  // U = T(row) + the receiving worker
    int worker;
    int64_t index;  // position in the worker's batch
    int64_t row;
  };
  std::vector<Need> needs;
  for (size_t i = 0; i < sequence.size(); ++i) {
    const int w = label[i % n_];
    const int64_t row = sequence[i];
    plan.batch[w].push_back(row);
    plan.source[w].push_back(-1);
    if (caches(w, row)) {
      ++plan.accounting.localRows;
    } else {
      needs.push_back({groupMask_[groupOfRow_[row]] | (uint64_t{1} << w), w,
                       static_cast<int64_t>(plan.batch[w].size() - 1), row});
    }
  }
  plan.accounting.neededRows = static_cast<int64_t>(needs.size());
  std::stable_sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) {
    return a.group != b.group ? a.group < b.group : a.worker < b.worker;
  });

  // Per U: the lists L(U, w) are consecutive runs; message j takes the j-th entry of each.
  for (size_t begin = 0; begin < needs.size();) {
    size_t end = begin;
    while (end < needs.size() && needs[end].group == needs[begin].group) ++end;
    std::vector<std::pair<size_t, size_t>> lists;  // [from, to) per worker
    size_t longest = 0;
    for (size_t p = begin; p < end;) {
      size_t q = p;
      while (q < end && needs[q].worker == needs[p].worker) ++q;
      lists.push_back({p, q});
      longest = std::max(longest, q - p);
      p = q;
    }
    for (size_t j = 0; j < longest; ++j) {
      ShuffleMessage m;
      const int64_t id = static_cast<int64_t>(plan.messages.size());
      for (auto [from, to] : lists) {
        if (from + j >= to) continue;
        const Need& need = needs[from + j];
        m.workers.push_back(need.worker);
        m.rows.push_back(need.row);
        plan.source[need.worker][need.index] = id;
      }
      plan.accounting.headerBytes += 8 * static_cast<int64_t>(m.rows.size());
      plan.messages.push_back(std::move(m));
    }
    begin = end;
  }
  ShuffleAccounting& a = plan.accounting;
  a.messages = static_cast<int64_t>(plan.messages.size());
  a.codedBytes = a.messages * static_cast<int64_t>(rowBytes);
  a.uncodedBytes = a.neededRows * static_cast<int64_t>(rowBytes);
  const double alpha = static_cast<double>(t_) / n_;
  a.theoryBytes = static_cast<double>(rows_) * (1 - alpha) / (1 + t_) * rowBytes;
  return plan;
}

StatusOr<WorkerCache> CodedShuffle::buildCache(int worker, std::span<const uint8_t> data,
                                               size_t rowBytes) const {
  if (worker < 0 || worker >= n_) {
    return InvalidArgument("coded shuffle: worker " + std::to_string(worker) + " outside [0, " +
                           std::to_string(n_) + ")");
  }
  COFAB_RETURN_IF_ERROR(checkRowBytes("coded shuffle", rows_, rowBytes));
  if (data.size() != static_cast<size_t>(rows_) * rowBytes) {
    return InvalidArgument("coded shuffle: data must be rows x rowBytes = " +
                           std::to_string(rows_) + " x " + std::to_string(rowBytes) + " bytes");
  }
  WorkerCache c;
  c.worker_ = worker;
  c.rowBytes_ = rowBytes;
  for (size_t g = 0; g < groupMask_.size(); ++g) {
    if (!((groupMask_[g] >> worker) & 1u)) continue;
    c.index_.insert(c.index_.end(), groupRows_.begin() + groupStart_[g],
                    groupRows_.begin() + groupStart_[g + 1]);
  }
  std::sort(c.index_.begin(), c.index_.end());
  c.bytes_.resize(c.index_.size() * rowBytes);
  for (size_t i = 0; i < c.index_.size(); ++i) {
    std::memcpy(c.bytes_.data() + i * rowBytes, data.data() + c.index_[i] * rowBytes, rowBytes);
  }
  return c;
}

Status CodedShuffle::encode(const ShufflePlan& plan, std::span<const uint8_t> data, size_t rowBytes,
                            std::span<uint8_t> out) const {
  COFAB_RETURN_IF_ERROR(checkRowBytes("coded shuffle encode", rows_, rowBytes));
  if (data.size() != static_cast<size_t>(rows_) * rowBytes) {
    return InvalidArgument("coded shuffle encode: data must be rows x rowBytes = " +
                           std::to_string(rows_) + " x " + std::to_string(rowBytes) + " bytes");
  }
  if (out.size() != plan.messages.size() * rowBytes) {
    return InvalidArgument("coded shuffle encode: out must hold " +
                           std::to_string(plan.messages.size()) + " messages of " +
                           std::to_string(rowBytes) + " bytes");
  }
  std::vector<const uint8_t*> srcs;
  for (size_t m = 0; m < plan.messages.size(); ++m) {
    srcs.clear();
    for (int64_t r : plan.messages[m].rows) {
      if (r < 0 || r >= rows_)
        return InvalidArgument("coded shuffle encode: plan names row " + std::to_string(r) +
                               " out of range");
      srcs.push_back(data.data() + r * rowBytes);
    }
    xorOf(out.data() + m * rowBytes, srcs, rowBytes);
  }
  return OkStatus();
}

Status CodedShuffle::decode(const ShufflePlan& plan, const WorkerCache& cache,
                            std::span<const uint8_t> messages, std::span<uint8_t> batchOut) const {
  const int w = cache.worker();
  const size_t rb = cache.rowBytes();
  if (w < 0 || w >= static_cast<int>(plan.batch.size())) {
    return InvalidArgument("coded shuffle decode: the plan has no worker " + std::to_string(w));
  }
  const auto& batch = plan.batch[w];
  // The plan is a plain struct a caller may have built or changed: its parts must agree before
  // they index one another.
  if (plan.source.size() != plan.batch.size() || plan.source[w].size() != batch.size()) {
    return InvalidArgument("coded shuffle decode: the plan's sources do not match its batches");
  }
  if (messages.size() != plan.messages.size() * rb || batchOut.size() != batch.size() * rb) {
    return InvalidArgument("coded shuffle decode: expected " +
                           std::to_string(plan.messages.size()) + " messages and a batch of " +
                           std::to_string(batch.size()) + " rows of " + std::to_string(rb) +
                           " bytes");
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    uint8_t* dst = batchOut.data() + i * rb;
    const int64_t m = plan.source[w][i];
    if (m < 0) {
      const uint8_t* own = cache.row(batch[i]);
      if (own == nullptr) {
        return FailedPrecondition("coded shuffle decode: worker " + std::to_string(w) +
                                  " should cache row " + std::to_string(batch[i]) +
                                  " but does not (cache built from another placement?)");
      }
      std::memcpy(dst, own, rb);
      continue;
    }
    if (static_cast<uint64_t>(m) >= plan.messages.size()) {
      return InvalidArgument("coded shuffle decode: the plan sends row " +
                             std::to_string(batch[i]) + " in message " + std::to_string(m) +
                             ", past its " + std::to_string(plan.messages.size()) + " messages");
    }
    const ShuffleMessage& msg = plan.messages[m];
    if (msg.workers.size() != msg.rows.size()) {
      return InvalidArgument("coded shuffle decode: message " + std::to_string(m) +
                             " of the plan names " + std::to_string(msg.rows.size()) +
                             " rows for " + std::to_string(msg.workers.size()) + " workers");
    }
    std::memcpy(dst, messages.data() + m * rb, rb);
    for (size_t j = 0; j < msg.rows.size(); ++j) {
      if (msg.workers[j] == w) continue;
      const uint8_t* other = cache.row(msg.rows[j]);
      if (other == nullptr) {
        return FailedPrecondition("coded shuffle decode: worker " + std::to_string(w) +
                                  " cannot cancel row " + std::to_string(msg.rows[j]) +
                                  " of message " + std::to_string(m) + ": not in its cache");
      }
      xorInto(dst, other, rb);
    }
  }
  return OkStatus();
}

}  // namespace cofab::coding
