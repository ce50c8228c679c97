// TensorView: a non-owning view of `count` elements of `dtype` at `data` on `device`.
//
// The caller owns the memory and keeps it alive until every operation that borrowed the view
// has completed (DESIGN.md §3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace cofab {

enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceType::kCuda, i}; }
  bool isCpu() const { return type == DeviceType::kCpu; }
  std::string toString() const;
  friend bool operator==(const Device&, const Device&) = default;
};

struct TensorView {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  Device device;

  TensorView() = default;
  TensorView(void* d, size_t n, DType t, Device dev = Device::cpu())
      : data(d), count(n), dtype(t), device(dev) {}

  template <typename T>
  static TensorView of(T* d, size_t n, DType t, Device dev = Device::cpu()) {
    return TensorView(static_cast<void*>(d), n, t, dev);
  }

  size_t bytes() const { return count * dtypeSize(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // A sub-view of `n` elements starting at element `offset` (checked by the caller).
  TensorView slice(size_t offset, size_t n) const {
    return TensorView(static_cast<uint8_t*>(data) + offset * dtypeSize(dtype), n, dtype, device);
  }

  // InvalidArgument if data is null while count > 0 ("what" names the argument).
  Status validate(const char* what) const;
  std::string toString() const;
};

// InvalidArgument unless `a` and `b` have the same count and dtype.
Status checkSameShape(const TensorView& a, const TensorView& b, const char* what);

// Whether `a` and `b` share at least one byte (empty views share none).
bool overlaps(const TensorView& a, const TensorView& b);
// The same for raw byte ranges [a, a + aBytes) and [b, b + bBytes).
bool bytesOverlap(const void* a, size_t aBytes, const void* b, size_t bBytes);

// InvalidArgument when `in` and `out` share some bytes without being the same buffer: an
// operation that works chunk by chunk, in place or between disjoint buffers, would write one
// chunk's result over another chunk's input before reading it. "what" names the operation.
Status checkInPlaceOrDisjoint(const TensorView& in, const TensorView& out, const char* what);

}  // namespace cofab
