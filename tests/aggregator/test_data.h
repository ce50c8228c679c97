// Deterministic test tensors and an independent serial reference for the aggregator's sums
// (written from the documented order, not from aggregator/reducer.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "fabric/ps/placement.h"

namespace cofab::testing {

// A value in [-4, 4) with a fractional part, different per (rank, key, iteration, index).
inline float testValue(int rank, uint64_t key, uint64_t iteration, size_t i) {
  const uint64_t h = ps::mix64(ps::mix64(key * 1315423911u + iteration) ^ (i * 2654435761u) ^
                               (static_cast<uint64_t>(rank) << 48));
  return static_cast<float>(static_cast<int64_t>(h % 8000) - 4000) / 1000.0f +
         static_cast<float>((h >> 20) % 1000) * 1e-7f;
}

// count elements of dtype for worker `rank`.
inline std::vector<uint8_t> makeTensor(DType dtype, size_t count, int rank, uint64_t key,
                                       uint64_t iteration) {
  std::vector<uint8_t> out(count * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float v = testValue(rank, key, iteration, i);
    switch (dtype) {
      case DType::kF32:
        std::memcpy(out.data() + 4 * i, &v, 4);
        break;
      case DType::kF64: {
        const double d = static_cast<double>(v) * 1.0000001;
        std::memcpy(out.data() + 8 * i, &d, 8);
        break;
      }
      case DType::kF16: {
        const uint16_t b = floatToHalf(v);
        std::memcpy(out.data() + 2 * i, &b, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t b = floatToBf16(v);
        std::memcpy(out.data() + 2 * i, &b, 2);
        break;
      }
      default:
        break;
    }
  }
  return out;
}

// Left fold over ranks 0..n-1 in f32 (f64 for f64), then /n for an average, then one rounding.
inline std::vector<uint8_t> referenceReduce(DType dtype, bool average,
                                            const std::vector<std::vector<uint8_t>>& inputs) {
  const size_t n = inputs.size();
  const size_t count = inputs[0].size() / dtypeSize(dtype);
  std::vector<uint8_t> out(inputs[0].size());
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::kF64) {
      double acc = 0;
      for (size_t r = 0; r < n; ++r) {
        double x;
        std::memcpy(&x, inputs[r].data() + 8 * i, 8);
        acc = r == 0 ? x : acc + x;
      }
      if (average) acc = acc / static_cast<double>(n);
      std::memcpy(out.data() + 8 * i, &acc, 8);
      continue;
    }
    float acc = 0;
    for (size_t r = 0; r < n; ++r) {
      float x = 0;
      if (dtype == DType::kF32) {
        std::memcpy(&x, inputs[r].data() + 4 * i, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, inputs[r].data() + 2 * i, 2);
        x = dtype == DType::kF16 ? halfToFloat(b) : bf16ToFloat(b);
      }
      acc = r == 0 ? x : acc + x;
    }
    if (average) acc = acc / static_cast<float>(n);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &acc, 4);
    } else {
      const uint16_t b = dtype == DType::kF16 ? floatToHalf(acc) : floatToBf16(acc);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

}  // namespace cofab::testing
