// PayloadPool: recycled receive buffers for pushed chunks, so the daemon's steady state costs no
// allocation, zero-fill or page faults per chunk.
//
// A round holds one buffer per contribution; the first becomes the result and lives until its
// sends complete; then they are dropped. Without a pool each of those is a fresh multi-MiB
// std::vector (value-initialised: a memset of the whole chunk, and on a fresh mapping a page
// fault per 4 KiB) before the kernel copies the payload in. With the pool, a buffer whose last
// reference goes returns here and the next chunk of the same size takes it as it is: the
// transport receives straight into it (Connection::recvRouted).
//
// Thread-safe (one mutex, held only to push or pop a buffer). Buffers keep the pool alive only
// weakly: a buffer outliving the pool is simply freed. At most `maxBytes` are kept idle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace cofab::aggregator {

class PayloadPool : public std::enable_shared_from_this<PayloadPool> {
 public:
  static std::shared_ptr<PayloadPool> create(size_t maxBytes);

  // A buffer of exactly `bytes` bytes (contents unspecified) that returns here when released.
  std::shared_ptr<std::vector<uint8_t>> take(size_t bytes);

  size_t idleBytes() const;

 private:
  explicit PayloadPool(size_t maxBytes) : maxBytes_(maxBytes) {}
  void give(std::vector<uint8_t>* buffer);

  const size_t maxBytes_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<std::unique_ptr<std::vector<uint8_t>>>> idle_;
  size_t idleBytes_ = 0;
};

}  // namespace cofab::aggregator
