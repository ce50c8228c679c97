// Row-major matrix views for coded matmul: non-owning, the caller keeps the memory alive for
// the duration of the call that borrows the view. Rows are contiguous, `ld` elements apart
// (ld >= cols; 0 means ld = cols).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace cofab::coding {

template <typename T>
struct BasicMatrixView {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;

  int64_t stride() const { return ld == 0 ? cols : ld; }
  T* row(int64_t r) const { return data + r * stride(); }

  Status validate(const char* what) const {
    if (rows < 0 || cols < 0 || (ld != 0 && ld < cols)) {
      return InvalidArgument(std::string(what) + ": bad shape " + std::to_string(rows) + "x" +
                             std::to_string(cols) + " ld=" + std::to_string(ld));
    }
    if (data == nullptr && rows > 0 && cols > 0) {  // rows * cols could overflow
      return InvalidArgument(std::string(what) + ": data is null");
    }
    // No memory holds more elements than this. The factor of 64 (the most blocks a code has,
    // RealMdsCode's n <= 64) leaves room for the sizes callers derive from a valid view, such as
    // (rows + k - 1) / k or the bytes of n blocks of that many rows, so they need no overflow
    // checks of their own.
    constexpr int64_t kHeadroom = 64;
    int64_t elems = 0;
    if (__builtin_mul_overflow(rows, stride(), &elems) ||
        elems > INT64_MAX / static_cast<int64_t>(sizeof(T)) / kHeadroom) {
      return InvalidArgument(std::string(what) + ": " + std::to_string(rows) + "x" +
                             std::to_string(cols) + " ld=" + std::to_string(ld) +
                             " is larger than any memory");
    }
    return OkStatus();
  }
};

using MatrixView = BasicMatrixView<float>;
using ConstMatrixView = BasicMatrixView<const float>;

inline ConstMatrixView asConst(const MatrixView& m) { return {m.data, m.rows, m.cols, m.ld}; }

}  // namespace cofab::coding
