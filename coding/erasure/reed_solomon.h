// ReedSolomon: a systematic (k data + m parity) erasure code over GF(2^8) for byte buffers
// (checkpoints, payloads, shuffle messages). Any k of the k+m shards rebuild the rest.
//
// The generator is ISA-L's Cauchy matrix (gf_gen_cauchy1_matrix), MDS for k + m <= 256, so
// shards are interchangeable with raw ISA-L calls. The bytes are crunched by ISA-L when built in,
// else by the portable reference (RsBackend); both give identical bytes.
//
// Ownership: the caller owns every shard buffer; calls read and write them only for their
// duration. Threads: a ReedSolomon is immutable after create() except for its decode-table
// cache, which is locked; encode/decode may run concurrently from any threads. Pointers need no
// alignment and lengths need not be multiples of anything.
//
// Errors: bad k/m, sizes, counts, null pointers, duplicate or out-of-range erasure indices are
// InvalidArgument; more erasures than m is DataLoss (the data is gone, not the call wrong).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "coding/erasure/gf_kernels.h"
#include "core/status.h"

namespace cofab::coding {

struct ReedSolomonOptions {
  int dataShards = 0;    // k >= 1
  int parityShards = 0;  // m >= 1, k + m <= 256
  RsBackend backend = RsBackend::kAuto;
  // Erasure patterns whose decode tables are kept (a pattern costs one GF matrix inversion and
  // 32*k*erasures bytes). When full the cache is cleared: patterns repeat in bursts.
  size_t decodeCacheEntries = 64;
};

class ReedSolomon {
 public:
  static StatusOr<ReedSolomon> create(const ReedSolomonOptions& options);

  ReedSolomon(ReedSolomon&&) noexcept;
  ReedSolomon& operator=(ReedSolomon&&) noexcept;
  ~ReedSolomon();

  int dataShards() const { return k_; }
  int parityShards() const { return m_; }
  int totalShards() const { return k_ + m_; }
  RsBackend backend() const { return kernels_->backend(); }
  // The (k+m) x k generator, row-major: identity, then the Cauchy parity rows.
  const std::vector<uint8_t>& generator() const { return generator_; }

  // Computes the m parity shards from the k data shards, each `shardBytes` long.
  Status encode(std::span<const uint8_t* const> data, std::span<uint8_t* const> parity,
                size_t shardBytes) const;

  // `shards` holds all k+m shard pointers in index order (data first). The shards named in
  // `erasures` (any order) are rebuilt in place from the others; the others are only read.
  Status decode(std::span<uint8_t* const> shards, std::span<const int> erasures,
                size_t shardBytes) const;

  // Number of erasure patterns whose decode tables are cached now (for tests and stats).
  size_t cachedDecodePatterns() const;

 private:
  friend class RsIncrementalEncoder;
  struct DecodePlan;
  class DecodeCache;

  ReedSolomon(int k, int m, const GfKernels* kernels, size_t cacheEntries);
  Status checkShardBytes(size_t shardBytes) const;
  StatusOr<std::shared_ptr<const DecodePlan>> planFor(const std::vector<int>& sortedErasures) const;

  int k_ = 0;
  int m_ = 0;
  const GfKernels* kernels_ = nullptr;
  std::vector<uint8_t> generator_;
  std::vector<uint8_t> encodeTables_;  // kernels_->prepare() of the m parity rows
  std::unique_ptr<DecodeCache> cache_;
};

// Builds parity while data shards arrive one at a time, in any order (ec_encode_data_update):
// the parity is complete, and equal to ReedSolomon::encode's, once all k have been added.
// The codec and the parity buffers must outlive the encoder. One thread at a time.
class RsIncrementalEncoder {
 public:
  // Zeroes the m parity buffers and starts accumulating into them.
  static StatusOr<RsIncrementalEncoder> begin(const ReedSolomon& codec,
                                              std::span<uint8_t* const> parity, size_t shardBytes);

  // Adds data shard `dataIndex` (each index once; InvalidArgument on a repeat or out of range).
  Status add(int dataIndex, const uint8_t* data);

  bool complete() const { return added_ == codec_->dataShards(); }
  int added() const { return added_; }

 private:
  RsIncrementalEncoder(const ReedSolomon* codec, std::vector<uint8_t*> parity, size_t bytes);

  const ReedSolomon* codec_;
  std::vector<uint8_t*> parity_;
  size_t bytes_;
  std::vector<bool> seen_;
  int added_ = 0;
};

}  // namespace cofab::coding
