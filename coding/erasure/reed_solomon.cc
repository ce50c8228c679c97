#include "coding/erasure/reed_solomon.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coding/erasure/gf256.h"
#include "core/tensor.h"

namespace cofab::coding {

// Everything needed to rebuild one erasure pattern: which k shards are read, and the tables
// mapping them to the erased shards (sorted by index).
struct ReedSolomon::DecodePlan {
  std::vector<int> survivors;  // k shard indices that are read
  std::vector<int> erasures;   // sorted
  std::vector<uint8_t> tables;
};

class ReedSolomon::DecodeCache {
 public:
  explicit DecodeCache(size_t capacity) : capacity_(capacity) {}
  using Key = std::array<uint64_t, 4>;  // bit i set = shard i erased (k + m <= 256)

  std::shared_ptr<const DecodePlan> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    return it == plans_.end() ? nullptr : it->second;
  }
  void insert(const Key& key, std::shared_ptr<const DecodePlan> plan) {
    if (capacity_ == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (plans_.size() >= capacity_) plans_.clear();
    plans_.emplace(key, std::move(plan));
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.size();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::map<Key, std::shared_ptr<const DecodePlan>> plans_;
};

ReedSolomon::ReedSolomon(int k, int m, const GfKernels* kernels, size_t cacheEntries)
    : k_(k),
      m_(m),
      kernels_(kernels),
      generator_(gf256::cauchyGenerator(k, m)),
      cache_(std::make_unique<DecodeCache>(cacheEntries)) {
  encodeTables_ = kernels_->prepare(
      std::span<const uint8_t>(generator_).subspan(static_cast<size_t>(k) * k), k, m);
}

ReedSolomon::ReedSolomon(ReedSolomon&&) noexcept = default;
ReedSolomon& ReedSolomon::operator=(ReedSolomon&&) noexcept = default;
ReedSolomon::~ReedSolomon() = default;

StatusOr<ReedSolomon> ReedSolomon::create(const ReedSolomonOptions& options) {
  const int k = options.dataShards;
  const int m = options.parityShards;
  if (k < 1 || m < 1 || k > 256 || m > 256 - k) {  // k + m could overflow
    return InvalidArgument(
        "ReedSolomon needs dataShards >= 1, parityShards >= 1 and "
        "dataShards + parityShards <= 256 (GF(2^8) Cauchy code); got k=" +
        std::to_string(k) + " m=" + std::to_string(m));
  }
  COFAB_ASSIGN_OR_RETURN(const GfKernels* kernels, gfKernels(options.backend));
  return ReedSolomon(k, m, kernels, options.decodeCacheEntries);
}

Status ReedSolomon::checkShardBytes(size_t shardBytes) const {
  if (shardBytes == 0 || shardBytes > static_cast<size_t>(INT_MAX)) {
    return InvalidArgument("shardBytes must be in [1, " + std::to_string(INT_MAX) + "], got " +
                           std::to_string(shardBytes));
  }
  return OkStatus();
}

namespace {

template <typename P>
Status checkPointers(std::span<P* const> ptrs, size_t expected, const char* what) {
  if (ptrs.size() != expected) {
    return InvalidArgument(std::string(what) + ": expected " + std::to_string(expected) +
                           " shard pointers, got " + std::to_string(ptrs.size()));
  }
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (ptrs[i] == nullptr) {
      return InvalidArgument(std::string(what) + ": shard " + std::to_string(i) + " is null");
    }
  }
  return OkStatus();
}

// A shard the call writes must share no byte with any other shard it reads or writes: the
// kernels write rows while still reading sources (a parity placed over a data shard came back
// as parity, two rebuilt shards in one buffer as the later one) and said OK. Sources may share
// memory among themselves. Shards are numbered as the code numbers them (data 0..k-1, parity
// k..k+m-1). All ranges have one length, so after sorting by address a written range that
// overlaps anything overlaps a neighbour: O(n log n) for up to 256 shards.
Status checkWrittenShardsApart(std::span<const uint8_t* const> read, std::span<const int> readIds,
                               std::span<uint8_t* const> written, std::span<const int> writtenIds,
                               size_t shardBytes, const char* what) {
  struct Range {
    uintptr_t begin;
    int id;
    bool written;
  };
  std::vector<Range> ranges;
  ranges.reserve(read.size() + written.size());
  for (size_t i = 0; i < read.size(); ++i) {
    ranges.push_back({reinterpret_cast<uintptr_t>(read[i]), readIds[i], false});
  }
  for (size_t i = 0; i < written.size(); ++i) {
    ranges.push_back({reinterpret_cast<uintptr_t>(written[i]), writtenIds[i], true});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    if ((a.written || b.written) &&
        bytesOverlap(reinterpret_cast<const void*>(a.begin), shardBytes,
                     reinterpret_cast<const void*>(b.begin), shardBytes)) {
      return InvalidArgument(std::string(what) + ": shards " +
                             std::to_string(std::min(a.id, b.id)) + " and " +
                             std::to_string(std::max(a.id, b.id)) +
                             " share memory; a shard written here needs a buffer of its own");
    }
  }
  return OkStatus();
}

std::vector<int> iota(int first, size_t count) {
  std::vector<int> ids(count);
  for (size_t i = 0; i < count; ++i) ids[i] = first + static_cast<int>(i);
  return ids;
}

}  // namespace

Status ReedSolomon::encode(std::span<const uint8_t* const> data, std::span<uint8_t* const> parity,
                           size_t shardBytes) const {
  COFAB_RETURN_IF_ERROR(checkShardBytes(shardBytes));
  COFAB_RETURN_IF_ERROR(checkPointers(data, k_, "ReedSolomon::encode data"));
  COFAB_RETURN_IF_ERROR(checkPointers(parity, m_, "ReedSolomon::encode parity"));
  COFAB_RETURN_IF_ERROR(checkWrittenShardsApart(data, iota(0, data.size()), parity,
                                                iota(k_, parity.size()), shardBytes,
                                                "ReedSolomon::encode"));
  kernels_->encode(shardBytes, k_, m_, encodeTables_, data.data(), parity.data());
  return OkStatus();
}

StatusOr<std::shared_ptr<const ReedSolomon::DecodePlan>> ReedSolomon::planFor(
    const std::vector<int>& sortedErasures) const {
  DecodeCache::Key key{};
  for (int e : sortedErasures) key[e / 64] |= uint64_t{1} << (e % 64);
  if (auto cached = cache_->find(key)) return cached;

  auto plan = std::make_shared<DecodePlan>();
  plan->erasures = sortedErasures;
  // Read the first k shards that survive: data shards first keeps the inverse cheap to apply
  // when only parity was lost.
  std::vector<bool> erased(k_ + m_, false);
  for (int e : sortedErasures) erased[e] = true;
  for (int i = 0; i < k_ + m_ && static_cast<int>(plan->survivors.size()) < k_; ++i) {
    if (!erased[i]) plan->survivors.push_back(i);
  }
  COFAB_CHECK(static_cast<int>(plan->survivors.size()) == k_);

  const size_t kk = static_cast<size_t>(k_) * k_;
  std::vector<uint8_t> sub(kk), inverse(kk);
  for (int r = 0; r < k_; ++r) {
    std::memcpy(&sub[static_cast<size_t>(r) * k_],
                &generator_[static_cast<size_t>(plan->survivors[r]) * k_], k_);
  }
  if (!gf256::invertMatrix(sub, inverse, k_)) {
    // Cannot happen for a Cauchy generator with k + m <= 256: a broken invariant.
    return Internal("Reed-Solomon decode matrix is singular for this erasure pattern");
  }
  // Row for erased shard e: data shard -> row e of the inverse; parity shard -> its generator
  // row times the inverse (expresses the parity in terms of the survivors).
  const int rows = static_cast<int>(sortedErasures.size());
  std::vector<uint8_t> decode(static_cast<size_t>(rows) * k_, 0);
  for (int r = 0; r < rows; ++r) {
    const int e = sortedErasures[r];
    uint8_t* out = &decode[static_cast<size_t>(r) * k_];
    if (e < k_) {
      std::memcpy(out, &inverse[static_cast<size_t>(e) * k_], k_);
    } else {
      const uint8_t* g = &generator_[static_cast<size_t>(e) * k_];
      for (int c = 0; c < k_; ++c) {
        uint8_t s = 0;
        for (int j = 0; j < k_; ++j)
          s ^= gf256::mul(g[j], inverse[static_cast<size_t>(j) * k_ + c]);
        out[c] = s;
      }
    }
  }
  plan->tables = kernels_->prepare(decode, k_, rows);
  std::shared_ptr<const DecodePlan> done = std::move(plan);
  cache_->insert(key, done);
  return done;
}

Status ReedSolomon::decode(std::span<uint8_t* const> shards, std::span<const int> erasures,
                           size_t shardBytes) const {
  COFAB_RETURN_IF_ERROR(checkShardBytes(shardBytes));
  COFAB_RETURN_IF_ERROR(checkPointers(shards, k_ + m_, "ReedSolomon::decode shards"));
  std::vector<int> sorted(erasures.begin(), erasures.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= k_ + m_) {
      return InvalidArgument("ReedSolomon::decode: erasure index " + std::to_string(sorted[i]) +
                             " is outside [0, " + std::to_string(k_ + m_) + ")");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return InvalidArgument("ReedSolomon::decode: erasure index " + std::to_string(sorted[i]) +
                             " is listed twice");
    }
  }
  if (static_cast<int>(sorted.size()) > m_) {
    return DataLoss("ReedSolomon::decode: " + std::to_string(sorted.size()) +
                    " shards erased but a (" + std::to_string(k_) + "+" + std::to_string(m_) +
                    ") code rebuilds at most " + std::to_string(m_));
  }
  if (sorted.empty()) return OkStatus();

  COFAB_ASSIGN_OR_RETURN(std::shared_ptr<const DecodePlan> plan, planFor(sorted));
  std::vector<const uint8_t*> srcs(k_);
  for (int i = 0; i < k_; ++i) srcs[i] = shards[plan->survivors[i]];
  std::vector<uint8_t*> outs(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) outs[i] = shards[sorted[i]];
  COFAB_RETURN_IF_ERROR(checkWrittenShardsApart(srcs, plan->survivors, outs, sorted, shardBytes,
                                                "ReedSolomon::decode"));
  kernels_->encode(shardBytes, k_, static_cast<int>(outs.size()), plan->tables, srcs.data(),
                   outs.data());
  return OkStatus();
}

size_t ReedSolomon::cachedDecodePatterns() const { return cache_->size(); }

RsIncrementalEncoder::RsIncrementalEncoder(const ReedSolomon* codec, std::vector<uint8_t*> parity,
                                           size_t bytes)
    : codec_(codec), parity_(std::move(parity)), bytes_(bytes), seen_(codec->dataShards()) {}

StatusOr<RsIncrementalEncoder> RsIncrementalEncoder::begin(const ReedSolomon& codec,
                                                           std::span<uint8_t* const> parity,
                                                           size_t shardBytes) {
  COFAB_RETURN_IF_ERROR(codec.checkShardBytes(shardBytes));
  COFAB_RETURN_IF_ERROR(
      checkPointers(parity, codec.parityShards(), "RsIncrementalEncoder::begin parity"));
  COFAB_RETURN_IF_ERROR(checkWrittenShardsApart({}, {}, parity,
                                                iota(codec.dataShards(), parity.size()), shardBytes,
                                                "RsIncrementalEncoder::begin"));
  for (uint8_t* p : parity) std::memset(p, 0, shardBytes);
  return RsIncrementalEncoder(&codec, std::vector<uint8_t*>(parity.begin(), parity.end()),
                              shardBytes);
}

Status RsIncrementalEncoder::add(int dataIndex, const uint8_t* data) {
  const int k = codec_->dataShards();
  if (dataIndex < 0 || dataIndex >= k) {
    return InvalidArgument("RsIncrementalEncoder::add: data index " + std::to_string(dataIndex) +
                           " is outside [0, " + std::to_string(k) + ")");
  }
  if (data == nullptr) return InvalidArgument("RsIncrementalEncoder::add: data is null");
  const uint8_t* const source[] = {data};
  const int sourceId[] = {dataIndex};
  COFAB_RETURN_IF_ERROR(checkWrittenShardsApart(source, sourceId, parity_, iota(k, parity_.size()),
                                                bytes_, "RsIncrementalEncoder::add"));
  if (seen_[dataIndex]) {
    return InvalidArgument("RsIncrementalEncoder::add: data shard " + std::to_string(dataIndex) +
                           " was already added");
  }
  seen_[dataIndex] = true;
  ++added_;
  codec_->kernels_->update(bytes_, k, codec_->parityShards(), dataIndex, codec_->encodeTables_,
                           data, parity_.data());
  return OkStatus();
}

}  // namespace cofab::coding
