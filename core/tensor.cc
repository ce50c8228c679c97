#include "core/tensor.h"

namespace cofab {

std::string Device::toString() const {
  return type == DeviceType::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Status TensorView::validate(const char* what) const {
  if (count > 0 && data == nullptr) {
    return InvalidArgument(std::string(what) + ": null data pointer with count " +
                           std::to_string(count));
  }
  if (count > (SIZE_MAX / 8)) {
    return InvalidArgument(std::string(what) + ": absurd element count " + std::to_string(count));
  }
  return OkStatus();
}

std::string TensorView::toString() const {
  return std::string(dtypeName(dtype)) + "[" + std::to_string(count) + "]@" + device.toString();
}

Status checkSameShape(const TensorView& a, const TensorView& b, const char* what) {
  if (a.count != b.count || a.dtype != b.dtype) {
    return InvalidArgument(std::string(what) + ": shape mismatch " + a.toString() + " vs " +
                           b.toString());
  }
  return OkStatus();
}

bool bytesOverlap(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  // Compared as integers: the ranges may belong to different allocations. An empty range
  // shares no byte, even one that lies inside the other.
  // A length past the address space (a saturated size) ends at its top.
  if (aBytes == 0 || bBytes == 0) return false;
  const auto aBegin = reinterpret_cast<uintptr_t>(a);
  const auto bBegin = reinterpret_cast<uintptr_t>(b);
  const uintptr_t aEnd = aBytes > UINTPTR_MAX - aBegin ? UINTPTR_MAX : aBegin + aBytes;
  const uintptr_t bEnd = bBytes > UINTPTR_MAX - bBegin ? UINTPTR_MAX : bBegin + bBytes;
  return aBegin < bEnd && bBegin < aEnd;
}

bool overlaps(const TensorView& a, const TensorView& b) {
  return bytesOverlap(a.data, a.bytes(), b.data, b.bytes());
}

Status checkInPlaceOrDisjoint(const TensorView& in, const TensorView& out, const char* what) {
  if (in.data != out.data && overlaps(in, out)) {
    return InvalidArgument(std::string(what) +
                           ": in and out partially overlap; pass the same buffer for an in-place "
                           "operation, or disjoint ones");
  }
  return OkStatus();
}

}  // namespace cofab
