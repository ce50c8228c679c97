// The key of a daemon's per-chunk state: the (key, chunk) pair itself, hashed for the map. A
// 64-bit id mixed from the pair (what the maps used before) can collide, and two chunks then
// shared one slot: pushes to the second were refused and its pulls waited on the first one's
// round. Equality on the pair keeps every chunk apart. Pure value types; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "fabric/ps/placement.h"

namespace cofab::aggregator {

struct ChunkId {
  uint64_t key = 0;
  uint32_t chunk = 0;
  friend bool operator==(const ChunkId&, const ChunkId&) = default;
};

struct ChunkIdHash {
  size_t operator()(const ChunkId& c) const {
    return static_cast<size_t>(ps::mix64(c.key) ^
                               (static_cast<uint64_t>(c.chunk) * 0x9e3779b97f4a7c15ull));
  }
};

template <typename T>
using ChunkMap = std::unordered_map<ChunkId, T, ChunkIdHash>;

}  // namespace cofab::aggregator
