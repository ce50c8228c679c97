#include "coding/matmul/coded_matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "core/clock.h"

namespace cofab::coding {

Status gemmF32(ConstMatrixView a, ConstMatrixView b, MatrixView c) {
  COFAB_RETURN_IF_ERROR(a.validate("gemm A"));
  COFAB_RETURN_IF_ERROR(b.validate("gemm B"));
  COFAB_RETURN_IF_ERROR(c.validate("gemm C"));
  if (a.cols != b.rows || c.rows != a.rows || c.cols != b.cols) {
    return InvalidArgument("gemm: shapes do not match: A " + std::to_string(a.rows) + "x" +
                           std::to_string(a.cols) + ", B " + std::to_string(b.rows) + "x" +
                           std::to_string(b.cols) + ", C " + std::to_string(c.rows) + "x" +
                           std::to_string(c.cols));
  }
  if (c.rows == 0 || c.cols == 0) return OkStatus();
  if (a.cols == 0) {
    for (int64_t r = 0; r < c.rows; ++r) std::fill_n(c.row(r), c.cols, 0.0f);
    return OkStatus();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(a.rows),
              static_cast<blasint>(b.cols), static_cast<blasint>(a.cols), 1.0f, a.data,
              static_cast<blasint>(a.stride()), b.data, static_cast<blasint>(b.stride()), 0.0f,
              c.data, static_cast<blasint>(c.stride()));
  return OkStatus();
}

StatusOr<CodedMatmul> CodedMatmul::create(const RealMdsOptions& options) {
  COFAB_ASSIGN_OR_RETURN(RealMdsCode code, RealMdsCode::create(options));
  return CodedMatmul(std::move(code));
}

StatusOr<EncodedMatrix> CodedMatmul::encode(ConstMatrixView a) const {
  COFAB_RETURN_IF_ERROR(a.validate("CodedMatmul::encode A"));
  if (a.rows == 0 || a.cols == 0) {
    return InvalidArgument("CodedMatmul::encode: A is empty (" + std::to_string(a.rows) + "x" +
                           std::to_string(a.cols) + ")");
  }
  const int n = code_.n(), k = code_.k();
  EncodedMatrix e;
  e.n_ = n;
  e.k_ = k;
  e.rows_ = a.rows;
  e.cols_ = a.cols;
  e.blockRows_ = (a.rows + k - 1) / k;
  const size_t blockElems = static_cast<size_t>(e.blockRows_) * a.cols;
  e.storage_.assign(blockElems * n, 0.0f);  // zero padding rows stay zero
  for (int64_t r = 0; r < a.rows; ++r) {
    std::memcpy(e.storage_.data() + r * a.cols, a.row(r), sizeof(float) * a.cols);
  }
  // Parity blocks = P (n-k x k) x [systematic blocks as k rows of blockElems]: one sgemm.
  std::vector<float> p(static_cast<size_t>(n - k) * k);
  for (int i = k; i < n; ++i) {
    for (int j = 0; j < k; ++j) p[(i - k) * k + j] = static_cast<float>(code_.at(i, j));
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n - k, static_cast<blasint>(blockElems),
              k, 1.0f, p.data(), k, e.storage_.data(), static_cast<blasint>(blockElems), 0.0f,
              e.storage_.data() + blockElems * k, static_cast<blasint>(blockElems));
  return e;
}

Status CodedMatmul::multiplyTask(const EncodedMatrix& a, int task, ConstMatrixView b,
                                 MatrixView out) const {
  if (a.n() != n() || a.k() != k()) {
    return InvalidArgument("multiplyTask: matrix encoded for a different (n, k)");
  }
  if (task < 0 || task >= n()) {
    return InvalidArgument("multiplyTask: task " + std::to_string(task) + " is outside [0, " +
                           std::to_string(n()) + ")");
  }
  return gemmF32(a.block(task), b, out);
}

StatusOr<DecodeReport> CodedMatmul::decode(const EncodedMatrix& a,
                                           std::span<const TaskResult> results, int64_t outCols,
                                           MatrixView c) const {
  const int n = code_.n(), k = code_.k();
  COFAB_RETURN_IF_ERROR(c.validate("CodedMatmul::decode C"));
  if (a.n() != n || a.k() != k) return InvalidArgument("decode: matrix encoded for another (n, k)");
  if (c.rows != a.rows() || c.cols != outCols || outCols <= 0) {
    return InvalidArgument("decode: C must be " + std::to_string(a.rows()) + "x" +
                           std::to_string(outCols) + ", got " + std::to_string(c.rows) + "x" +
                           std::to_string(c.cols));
  }
  std::vector<const float*> byTask(n, nullptr);
  for (const TaskResult& r : results) {
    if (r.task < 0 || r.task >= n) {
      return InvalidArgument("decode: result for task " + std::to_string(r.task) +
                             " is outside [0, " + std::to_string(n) + ")");
    }
    if (r.data == nullptr) {
      return InvalidArgument("decode: result for task " + std::to_string(r.task) + " is null");
    }
    if (byTask[r.task] != nullptr) {
      return InvalidArgument("decode: two results for task " + std::to_string(r.task));
    }
    byTask[r.task] = r.data;
  }
  if (static_cast<int>(results.size()) < k) {
    return DataLoss("decode: " + std::to_string(results.size()) + " task results, the (" +
                    std::to_string(n) + ", " + std::to_string(k) + ") code needs " +
                    std::to_string(k));
  }

  const int64_t blockRows = a.blockRows();
  const size_t blockElems = static_cast<size_t>(blockRows) * outCols;
  DecodeReport report;
  std::vector<int> missing;
  for (int j = 0; j < k; ++j) {
    if (byTask[j] != nullptr) {
      report.used.push_back(j);
    } else {
      missing.push_back(j);
    }
  }
  for (const TaskResult& r : results) {
    if (static_cast<int>(report.used.size()) == k) break;
    if (r.task >= k) report.used.push_back(r.task);
  }
  // Writes block j's rows (block-local layout, contiguous) into C, skipping the padding rows.
  auto placeBlock = [&](int j, const float* src) {
    const int64_t first = static_cast<int64_t>(j) * blockRows;
    const int64_t rows = std::min<int64_t>(blockRows, a.rows() - first);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(c.row(first + r), src + r * outCols, sizeof(float) * outCols);
    }
  };
  for (int j = 0; j < k; ++j) {
    if (byTask[j] != nullptr) placeBlock(j, byTask[j]);
  }
  if (missing.empty()) return report;

  const int64_t t0 = nowNs();
  report.decoded = true;
  COFAB_ASSIGN_OR_RETURN(std::vector<double> d, code_.decodeCoefficients(report.used, missing));
  // FP64: Y (k x blockElems) from the fp32 results, X_missing = D x Y, one rounding at the end.
  std::vector<double> y(static_cast<size_t>(k) * blockElems);
  for (int c2 = 0; c2 < k; ++c2) {
    const float* src = byTask[report.used[c2]];
    double* dst = y.data() + c2 * blockElems;
    for (size_t e = 0; e < blockElems; ++e) dst[e] = src[e];
  }
  const int e = static_cast<int>(missing.size());
  std::vector<double> x(static_cast<size_t>(e) * blockElems);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, e, static_cast<blasint>(blockElems), k,
              1.0, d.data(), k, y.data(), static_cast<blasint>(blockElems), 0.0, x.data(),
              static_cast<blasint>(blockElems));
  std::vector<float> xf(blockElems);
  for (int w = 0; w < e; ++w) {
    const double* src = x.data() + w * blockElems;
    for (size_t i = 0; i < blockElems; ++i) xf[i] = static_cast<float>(src[i]);
    placeBlock(missing[w], xf.data());
  }
  report.decodeMs = (nowNs() - t0) / 1e6;
  return report;
}

}  // namespace cofab::coding
