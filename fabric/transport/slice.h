// Slices: the scatter/gather pieces a message payload is sent from and received into.
//
// A slice names caller-owned memory; the caller lends it to one operation until that operation's
// completion callback has run (DESIGN.md §3). The slice descriptors themselves are copied by the
// call that takes them, so a temporary array of slices is fine. `region` is for transports that
// need registered memory (RDMA, DPDK): null means "not registered", which tcp and loopback accept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cofab::transport {

class MemoryRegion;

struct ConstSlice {
  const void* data = nullptr;
  size_t size = 0;
  const MemoryRegion* region = nullptr;
};

struct MutableSlice {
  void* data = nullptr;
  size_t size = 0;
  const MemoryRegion* region = nullptr;
};

using ConstSlices = std::span<const ConstSlice>;
using MutableSlices = std::span<const MutableSlice>;

inline size_t totalSize(ConstSlices slices) {
  size_t n = 0;
  for (const auto& s : slices) n += s.size;
  return n;
}
inline size_t totalSize(MutableSlices slices) {
  size_t n = 0;
  for (const auto& s : slices) n += s.size;
  return n;
}

}  // namespace cofab::transport
