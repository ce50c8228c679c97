// CodedMatmul: C = A x B computed as n tasks of which any k suffice (Lee et al., "Speeding up
// distributed machine learning using codes"). A is split by rows into k blocks (zero-padded to a
// multiple of k), encoded with a systematic RealMdsCode into n blocks; task i computes
// coded_block_i x B; decode rebuilds C from any k task results.
//
// When the k systematic tasks are among the results nothing is decoded: C is exactly what the
// uncoded block products give, bit for bit. Otherwise the missing blocks are solved in FP64
// (coefficients from RealMdsCode, combination through BLAS dgemm) and rounded to fp32 once.
// Accuracy: error relative to C's largest entries ~ worstCondition x fp32 rounding of the tasks.
// Not per block: parity results are rounded at the scale of the largest blocks they combine, so
// a decoded block whose rows are orders of magnitude smaller than the others' can be wrong
// relative to its own size (block norms 1e7 apart: ~100%) while the condition number looks fine.
//
// GEMMs go through gpu/linear_combine.h, whose CPU twin is OpenBLAS and whose CUDA path is cuBLAS
// with TF32 off (tests/gpu checks both agree). Ownership: EncodedMatrix owns its blocks; every view
// is borrowed for the call. Threads: CodedMatmul is immutable; multiplyTask for different tasks may
// run concurrently (the straggler executor does that).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "coding/matmul/matrix_view.h"
#include "coding/matmul/real_mds_code.h"
#include "core/status.h"
#include "core/tensor.h"

namespace cofab::coding {

// A encoded into n blocks of blockRows x cols each (contiguous, block i at i*blockRows*cols).
class EncodedMatrix {
 public:
  int n() const { return n_; }
  int k() const { return k_; }
  int64_t rows() const { return rows_; }  // rows of the original A
  int64_t blockRows() const { return blockRows_; }
  int64_t cols() const { return cols_; }
  ConstMatrixView block(int i) const {
    return {storage_.data() + static_cast<size_t>(i) * blockRows_ * cols_, blockRows_, cols_, 0};
  }

 private:
  friend class CodedMatmul;
  int n_ = 0, k_ = 0;
  uint64_t code_ = 0;  // the encoding code's generator fingerprint (CodedMatmul::checkEncoded)
  int64_t rows_ = 0, blockRows_ = 0, cols_ = 0;
  std::vector<float> storage_;
};

// One task's result: blockRows x outCols, contiguous, owned by the caller.
struct TaskResult {
  int task = -1;
  const float* data = nullptr;
};

struct DecodeReport {
  bool decoded = false;   // false: the k systematic results were used as they are
  std::vector<int> used;  // the k task results that C was built from
  double decodeMs = 0;    // coefficient solve + FP64 combination
  // When decoded: the 1-norm condition number of the k x k system solved (relative error of the
  // rebuilt blocks ~ condition x fp32 rounding of the tasks); 0 when nothing was decoded.
  double condition = 0;
};

class CodedMatmul {
 public:
  static StatusOr<CodedMatmul> create(const RealMdsOptions& options);
  explicit CodedMatmul(RealMdsCode code)
      : code_(std::move(code)), fingerprint_(fingerprintOf(code_)) {}

  const RealMdsCode& code() const { return code_; }
  int n() const { return code_.n(); }
  int k() const { return code_.k(); }

  // Splits `a` into k row blocks and computes the n coded blocks (parity through sgemm). With a
  // CUDA `device` the parity GEMM runs there (the systematic blocks copied in, the parity copied
  // back, on `stream`, synchronized before returning); the blocks live on the host either way.
  StatusOr<EncodedMatrix> encode(ConstMatrixView a, Device device = Device::cpu(),
                                 void* stream = nullptr) const;

  // InvalidArgument unless `a` was encoded by this code: same (n, k) and the same generator (two
  // codes of one (n, k) with other seeds or families would decode each other's parity into a
  // wrong C without a word). `what` names the caller.
  Status checkEncoded(const EncodedMatrix& a, const char* what) const;

  // out (blockRows x b.cols) = coded block `task` x b.
  Status multiplyTask(const EncodedMatrix& a, int task, ConstMatrixView b, MatrixView out) const;

  // Builds c (a.rows() x outCols) from the results, which must name at least k distinct tasks;
  // systematic results are preferred, then parity results in the order given. Fewer than k
  // results is DataLoss; so is a choice of k results whose system is conditioned worse than the
  // code's maxCondition (RealMdsCode::decodeCoefficients; possible only when create() sampled
  // the erasure patterns), in which case c may hold the systematic blocks but nothing decoded.
  // With a CUDA `device` the FP64 combination runs there (the k results copied in, the rebuilt
  // blocks copied back, as encode does); results and c stay host memory.
  StatusOr<DecodeReport> decode(const EncodedMatrix& a, std::span<const TaskResult> results,
                                int64_t outCols, MatrixView c, Device device = Device::cpu(),
                                void* stream = nullptr) const;

  // The same two steps on raw blocks that may live on a GPU (`device`; CUDA calls are
  // asynchronous on `stream`), for callers that keep blocks on the device:
  //   encodeParity: blocks holds n contiguous blocks of blockElems floats; the k systematic
  //                 ones are read, the n-k parity ones written (cuBLAS / OpenBLAS sgemm).
  //   decodeBlocks: data blocks `missing` (written to `outputs`, same order) from exactly k task
  //                 results (distinct tasks), FP64 coefficients solved on the host. Fewer than
  //                 k results or a system worse than maxCondition is DataLoss, more than k is
  //                 InvalidArgument (decodeCoefficients); `condition`, when not null, receives
  //                 the system's 1-norm condition number.
  Status encodeParity(float* blocks, size_t blockElems, Device device = Device::cpu(),
                      void* stream = nullptr) const;
  Status decodeBlocks(std::span<const TaskResult> results, std::span<const int> missing,
                      std::span<float* const> outputs, size_t blockElems,
                      Device device = Device::cpu(), void* stream = nullptr,
                      double* condition = nullptr) const;

 private:
  // decode's combination on a CUDA device: host results in, the `missing` blocks to `rebuilt`
  // (host, contiguous).
  Status decodeOnDevice(std::span<const TaskResult> results, std::span<const int> missing,
                        size_t blockElems, Device device, void* stream, float* rebuilt,
                        double* condition) const;

  static uint64_t fingerprintOf(const RealMdsCode& code);

  RealMdsCode code_;
  uint64_t fingerprint_;
};

// Plain C = A x B through sgemm (the uncoded reference and the bench's baseline).
Status gemmF32(ConstMatrixView a, ConstMatrixView b, MatrixView c);

}  // namespace cofab::coding
