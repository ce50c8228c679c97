// MemoryRegion: caller-owned memory registered with a transport for zero-copy I/O.
//
// RAII: registration lasts as long as the object; the caller owns both the object and the memory
// it covers, and must keep the memory alive (and not destroy the region) while any operation
// that uses it is pending. On tcp and loopback registration is a no-op that only records the
// range; RDMA pins and registers it with the NIC, DPDK maps it for the PMD. Created by
// Context::registerMemory() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cofab::transport {

class MemoryRegion {
 public:
  MemoryRegion(void* data, size_t size) : data_(data), size_(size) {}
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // Whether [p, p + n) lies inside this region.
  bool contains(const void* p, size_t n) const {
    const auto b = reinterpret_cast<uintptr_t>(data_);
    const auto x = reinterpret_cast<uintptr_t>(p);
    return x >= b && n <= size_ && x - b <= size_ - n;
  }

 private:
  void* data_;
  size_t size_;
};

}  // namespace cofab::transport
