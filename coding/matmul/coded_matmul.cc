#include "coding/matmul/coded_matmul.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/clock.h"
#include "gpu/linear_combine.h"
#include "gpu/stream.h"

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
  // The CPU twin of the GPU path (gpu/linear_combine.h): OpenBLAS here, cuBLAS there.
  return gpu::gemmF32({.a = a.data,
                       .b = b.data,
                       .c = c.data,
                       .m = a.rows,
                       .n = b.cols,
                       .k = a.cols,
                       .lda = a.stride(),
                       .ldb = b.stride(),
                       .ldc = c.stride()});
}

uint64_t CodedMatmul::fingerprintOf(const RealMdsCode& code) {
  // FNV-1a over (n, k) and the generator's coefficients, bit for bit.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(static_cast<uint64_t>(code.n()));
  mix(static_cast<uint64_t>(code.k()));
  for (int i = 0; i < code.n(); ++i) {
    for (int j = 0; j < code.k(); ++j) mix(std::bit_cast<uint64_t>(code.at(i, j)));
  }
  return h;
}

Status CodedMatmul::checkEncoded(const EncodedMatrix& a, const char* what) const {
  if (a.n() != n() || a.k() != k()) {
    return InvalidArgument(std::string(what) + ": matrix encoded for a (" + std::to_string(a.n()) +
                           ", " + std::to_string(a.k()) + ") code, this one is (" +
                           std::to_string(n()) + ", " + std::to_string(k()) + ")");
  }
  if (a.code_ != fingerprint_) {
    return InvalidArgument(std::string(what) +
                           ": matrix encoded by another code of the same (n, k) (another seed or "
                           "family): its parity blocks would decode into a wrong product");
  }
  return OkStatus();
}

StatusOr<CodedMatmul> CodedMatmul::create(const RealMdsOptions& options) {
  COFAB_ASSIGN_OR_RETURN(RealMdsCode code, RealMdsCode::create(options));
  return CodedMatmul(std::move(code));
}

StatusOr<EncodedMatrix> CodedMatmul::encode(ConstMatrixView a, Device device, void* stream) const {
  COFAB_RETURN_IF_ERROR(a.validate("CodedMatmul::encode A"));
  if (a.rows == 0 || a.cols == 0) {
    return InvalidArgument("CodedMatmul::encode: A is empty (" + std::to_string(a.rows) + "x" +
                           std::to_string(a.cols) + ")");
  }
  const int n = code_.n(), k = code_.k();
  EncodedMatrix e;
  e.n_ = n;
  e.k_ = k;
  e.code_ = fingerprint_;
  e.rows_ = a.rows;
  e.cols_ = a.cols;
  e.blockRows_ = (a.rows + k - 1) / k;
  const size_t blockElems = static_cast<size_t>(e.blockRows_) * a.cols;
  e.storage_.assign(blockElems * n, 0.0f);  // zero padding rows stay zero
  for (int64_t r = 0; r < a.rows; ++r) {
    std::memcpy(e.storage_.data() + r * a.cols, a.row(r), sizeof(float) * a.cols);
  }
  if (device.isCpu()) {
    COFAB_RETURN_IF_ERROR(encodeParity(e.storage_.data(), blockElems));
    return e;
  }
  // The k systematic blocks in, the n-k parity blocks back, all on one stream, then one wait.
  const size_t bytes = blockElems * sizeof(float);
  gpu::Stream s = gpu::Stream::borrow(stream, device.index);
  COFAB_ASSIGN_OR_RETURN(gpu::DeviceBuffer d, gpu::DeviceBuffer::allocateOn(bytes * n, s));
  COFAB_RETURN_IF_ERROR(d.copyFromHost(e.storage_.data(), bytes * k, s));
  auto* blocks = static_cast<float*>(d.data());
  COFAB_RETURN_IF_ERROR(encodeParity(blocks, blockElems, device, stream));
  gpu::DeviceBuffer parity =
      gpu::DeviceBuffer::borrow(blocks + blockElems * k, bytes * (n - k), device.index);
  COFAB_RETURN_IF_ERROR(parity.copyToHost(e.storage_.data() + blockElems * k, bytes * (n - k), s));
  COFAB_RETURN_IF_ERROR(s.synchronize());
  return e;
}

Status CodedMatmul::encodeParity(float* blocks, size_t blockElems, Device device,
                                 void* stream) const {
  if (blocks == nullptr || blockElems == 0) {
    return InvalidArgument("encodeParity: blocks must be non-null and blockElems > 0");
  }
  const int n = code_.n(), k = code_.k();
  // Parity blocks = P (n-k x k) x [systematic blocks as k rows of blockElems]: one sgemm.
  std::vector<float> p(static_cast<size_t>(n - k) * k);
  for (int i = k; i < n; ++i) {
    for (int j = 0; j < k; ++j) p[(i - k) * k + j] = static_cast<float>(code_.at(i, j));
  }
  if (device.isCpu()) {
    return gpu::gemmF32({.a = p.data(),
                         .b = blocks,
                         .c = blocks + blockElems * k,
                         .m = n - k,
                         .n = static_cast<int64_t>(blockElems),
                         .k = k});
  }
  // cuBLAS reads P from device memory: a small staging buffer.
  gpu::Stream s = gpu::Stream::borrow(stream, device.index);
  COFAB_ASSIGN_OR_RETURN(gpu::DeviceBuffer dp,
                         gpu::DeviceBuffer::allocateOn(p.size() * sizeof(float), s));
  COFAB_RETURN_IF_ERROR(dp.copyFromHost(p.data(), p.size() * sizeof(float), s));
  COFAB_RETURN_IF_ERROR(gpu::gemmF32({.a = static_cast<float*>(dp.data()),
                                      .b = blocks,
                                      .c = blocks + blockElems * k,
                                      .m = n - k,
                                      .n = static_cast<int64_t>(blockElems),
                                      .k = k,
                                      .device = device,
                                      .stream = stream}));
  // dp goes back to the pool in stream order, after the GEMM that reads it; p was staged by
  // the pageable copy before it returned. So nothing here waits: asynchronous, as documented.
  return OkStatus();
}

Status CodedMatmul::decodeBlocks(std::span<const TaskResult> results, std::span<const int> missing,
                                 std::span<float* const> outputs, size_t blockElems, Device device,
                                 void* stream, double* condition) const {
  if (outputs.size() != missing.size()) {
    return InvalidArgument("decodeBlocks: " + std::to_string(missing.size()) +
                           " missing blocks but " + std::to_string(outputs.size()) + " outputs");
  }
  std::vector<int> used;
  std::vector<const float*> inputs;
  for (const TaskResult& r : results) {
    if (r.data == nullptr) return InvalidArgument("decodeBlocks: null result");
    used.push_back(r.task);
    inputs.push_back(r.data);
  }
  // Validates the task indices (k distinct, in range), the wanted blocks and the conditioning.
  COFAB_ASSIGN_OR_RETURN(std::vector<double> d, code_.decodeCoefficients(used, missing, condition));
  if (missing.empty()) return OkStatus();
  return gpu::linearCombine({.coeffs = d,
                             .inputs = inputs,
                             .outputs = outputs,
                             .elements = blockElems,
                             .device = device,
                             .stream = stream});
}

Status CodedMatmul::decodeOnDevice(std::span<const TaskResult> results,
                                   std::span<const int> missing, size_t blockElems, Device device,
                                   void* stream, float* rebuilt, double* condition) const {
  // The k host results in, the missing blocks back (contiguous, in `missing` order).
  const size_t bytes = blockElems * sizeof(float);
  const size_t k = results.size(), e = missing.size();
  gpu::Stream s = gpu::Stream::borrow(stream, device.index);
  COFAB_ASSIGN_OR_RETURN(gpu::DeviceBuffer in, gpu::DeviceBuffer::allocateOn(bytes * k, s));
  COFAB_ASSIGN_OR_RETURN(gpu::DeviceBuffer out, gpu::DeviceBuffer::allocateOn(bytes * e, s));
  auto* inBase = static_cast<float*>(in.data());
  auto* outBase = static_cast<float*>(out.data());
  std::vector<TaskResult> onDevice;
  for (size_t i = 0; i < k; ++i) {
    gpu::DeviceBuffer slot =
        gpu::DeviceBuffer::borrow(inBase + blockElems * i, bytes, device.index);
    COFAB_RETURN_IF_ERROR(slot.copyFromHost(results[i].data, bytes, s));
    onDevice.push_back({results[i].task, inBase + blockElems * i});
  }
  std::vector<float*> outputs;
  for (size_t i = 0; i < e; ++i) outputs.push_back(outBase + blockElems * i);
  COFAB_RETURN_IF_ERROR(
      decodeBlocks(onDevice, missing, outputs, blockElems, device, stream, condition));
  COFAB_RETURN_IF_ERROR(out.copyToHost(rebuilt, bytes * e, s));
  // in and out are freed on return: wait for the work that uses them.
  return s.synchronize();
}

Status CodedMatmul::multiplyTask(const EncodedMatrix& a, int task, ConstMatrixView b,
                                 MatrixView out) const {
  COFAB_RETURN_IF_ERROR(checkEncoded(a, "multiplyTask"));
  if (task < 0 || task >= n()) {
    return InvalidArgument("multiplyTask: task " + std::to_string(task) + " is outside [0, " +
                           std::to_string(n()) + ")");
  }
  return gemmF32(a.block(task), b, out);
}

StatusOr<DecodeReport> CodedMatmul::decode(const EncodedMatrix& a,
                                           std::span<const TaskResult> results, int64_t outCols,
                                           MatrixView c, Device device, void* stream) const {
  const int n = code_.n(), k = code_.k();
  COFAB_RETURN_IF_ERROR(c.validate("CodedMatmul::decode C"));
  COFAB_RETURN_IF_ERROR(checkEncoded(a, "decode"));
  if (outCols <= 0) {
    return InvalidArgument("decode: outCols must be positive, got " + std::to_string(outCols));
  }
  if (c.rows != a.rows() || c.cols != outCols) {
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
  // FP64: the k results widened, one dgemm with the coefficients, rounded to fp32 once.
  const int e = static_cast<int>(missing.size());
  std::vector<TaskResult> inputs;
  for (int t : report.used) inputs.push_back({t, byTask[t]});
  std::vector<float> rebuilt(blockElems * e);
  if (device.isCpu()) {
    std::vector<float*> outputs;
    for (int w = 0; w < e; ++w) outputs.push_back(rebuilt.data() + blockElems * w);
    COFAB_RETURN_IF_ERROR(decodeBlocks(inputs, missing, outputs, blockElems, Device::cpu(), nullptr,
                                       &report.condition));
  } else {
    COFAB_RETURN_IF_ERROR(decodeOnDevice(inputs, missing, blockElems, device, stream,
                                         rebuilt.data(), &report.condition));
  }
  for (int w = 0; w < e; ++w) placeBlock(missing[w], rebuilt.data() + blockElems * w);
  report.decodeMs = (nowNs() - t0) / 1e6;
  return report;
}

}  // namespace cofab::coding
