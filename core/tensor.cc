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

bool overlaps(const TensorView& a, const TensorView& b) {
  const auto* aBegin = static_cast<const uint8_t*>(a.data);
  const auto* bBegin = static_cast<const uint8_t*>(b.data);
  return aBegin < bBegin + b.bytes() && bBegin < aBegin + a.bytes();
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
