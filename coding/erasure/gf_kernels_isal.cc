// Compiled only when COFAB_HAVE_ISAL (see coding/CMakeLists.txt).
#include <isa-l/erasure_code.h>

#include "coding/erasure/gf_kernels.h"

namespace cofab::coding {
namespace {

// ISA-L's signatures take non-const pointers; it only reads its sources and tables.
unsigned char** mutableRows(const uint8_t* const* p) {
  return const_cast<unsigned char**>(reinterpret_cast<const unsigned char* const*>(p));
}

class IsalGfKernels final : public GfKernels {
 public:
  RsBackend backend() const override { return RsBackend::kIsal; }
  std::vector<uint8_t> prepare(std::span<const uint8_t> coeffs, int srcCount,
                               int rows) const override {
    // ec_init_tables expands each coefficient into a 32-byte multiplication table.
    std::vector<uint8_t> tables(static_cast<size_t>(32) * srcCount * rows);
    ec_init_tables(srcCount, rows, const_cast<unsigned char*>(coeffs.data()), tables.data());
    return tables;
  }
  void encode(size_t bytes, int srcCount, int rows, const std::vector<uint8_t>& tables,
              const uint8_t* const* srcs, uint8_t* const* outs) const override {
    ec_encode_data(static_cast<int>(bytes), srcCount, rows,
                   const_cast<unsigned char*>(tables.data()), mutableRows(srcs),
                   const_cast<unsigned char**>(outs));
  }
  void update(size_t bytes, int srcCount, int rows, int srcIndex,
              const std::vector<uint8_t>& tables, const uint8_t* src,
              uint8_t* const* outs) const override {
    ec_encode_data_update(static_cast<int>(bytes), srcCount, rows, srcIndex,
                          const_cast<unsigned char*>(tables.data()),
                          const_cast<unsigned char*>(src), const_cast<unsigned char**>(outs));
  }
};

}  // namespace

const GfKernels& isalGfKernels() {
  static const IsalGfKernels kernels;
  return kernels;
}

}  // namespace cofab::coding
