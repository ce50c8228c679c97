#include "coding/erasure/gf256.h"
#include "coding/erasure/gf_kernels.h"

namespace cofab::coding {
namespace {

// The reference keeps the coefficient matrix itself as its "tables".
class ReferenceGfKernels final : public GfKernels {
 public:
  RsBackend backend() const override { return RsBackend::kReference; }
  std::vector<uint8_t> prepare(std::span<const uint8_t> coeffs, int srcCount,
                               int rows) const override {
    return std::vector<uint8_t>(coeffs.begin(),
                                coeffs.begin() + static_cast<size_t>(srcCount) * rows);
  }
  void encode(size_t bytes, int srcCount, int rows, const std::vector<uint8_t>& tables,
              const uint8_t* const* srcs, uint8_t* const* outs) const override {
    gf256::mulAdd(tables, srcCount, rows, srcs, outs, bytes);
  }
  void update(size_t bytes, int srcCount, int rows, int srcIndex,
              const std::vector<uint8_t>& tables, const uint8_t* src,
              uint8_t* const* outs) const override {
    gf256::mulAddOne(tables, srcCount, rows, srcIndex, src, outs, bytes);
  }
};

}  // namespace

const GfKernels& referenceGfKernels() {
  static const ReferenceGfKernels kernels;
  return kernels;
}

const char* rsBackendName(RsBackend backend) {
  switch (backend) {
    case RsBackend::kAuto:
      return "auto";
    case RsBackend::kIsal:
      return "isal";
    case RsBackend::kReference:
      return "reference";
  }
  return "?";
}

}  // namespace cofab::coding
