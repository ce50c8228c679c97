// Placement: which aggregator daemon owns which chunk of which tensor. Every worker and daemon
// computes it independently from (key, chunk index, number of daemons), so it needs no
// coordination and survives restarts.
//
// A tensor of `bytes` is cut into ceil(bytes / chunkBytes) chunks (the last one shorter; chunk
// boundaries fall on element boundaries). Chunk c of key k lives on daemon
//   primary(k, c) = (mix64(k) + c) mod M
// i.e. consecutive chunks of one tensor go round-robin over all daemons (a big tensor spreads
// evenly: loads differ by at most one chunk) and the starting daemon is a hash of the key (many
// small tensors spread evenly in expectation). With replication its backup is (primary + 1) mod M.
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cofab::ps {

// SplitMix64's finaliser: a fixed, portable 64-bit mix (part of the placement contract).
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline int primaryServer(uint64_t key, uint32_t chunk, int numServers) {
  return static_cast<int>((mix64(key) + chunk) % static_cast<uint64_t>(numServers));
}
inline int backupServer(int primary, int numServers) { return (primary + 1) % numServers; }

struct ChunkLayout {
  size_t elementsPerChunk = 0;
  uint32_t chunkCount = 0;
};
// Elements per chunk rounded down to whole elements (at least one); a zero-element tensor has
// zero chunks.
inline ChunkLayout chunkLayout(size_t count, size_t elementSize, size_t chunkBytes) {
  ChunkLayout l;
  l.elementsPerChunk = chunkBytes / elementSize;
  if (l.elementsPerChunk == 0) l.elementsPerChunk = 1;
  l.chunkCount = static_cast<uint32_t>((count + l.elementsPerChunk - 1) / l.elementsPerChunk);
  return l;
}

}  // namespace cofab::ps
