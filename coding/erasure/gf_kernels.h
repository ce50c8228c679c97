// GfKernels: the byte-crunching half of Reed-Solomon, behind one interface so that the codec
// logic (matrices, validation, caching) is shared between ISA-L and the portable reference.
//
// A kernel set is stateless and lives for the whole process (returned by pointer, never freed);
// every method is safe to call concurrently. Inputs are never written, although ISA-L's C
// signatures are not const.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace cofab::coding {

enum class RsBackend : uint8_t {
  kAuto,       // ISA-L when built in, else the reference
  kIsal,       // Intel ISA-L (Unavailable when cofab was built without it)
  kReference,  // portable table-lookup codec: the oracle in tests
};

const char* rsBackendName(RsBackend backend);

class GfKernels {
 public:
  virtual ~GfKernels() = default;
  virtual RsBackend backend() const = 0;
  // Expands a rows x srcCount coefficient matrix (row-major) into this backend's tables.
  virtual std::vector<uint8_t> prepare(std::span<const uint8_t> coeffs, int srcCount,
                                       int rows) const = 0;
  // outs[r] = sum_j coeffs[r][j] * srcs[j] over `bytes` bytes (outputs overwritten).
  virtual void encode(size_t bytes, int srcCount, int rows, const std::vector<uint8_t>& tables,
                      const uint8_t* const* srcs, uint8_t* const* outs) const = 0;
  // outs[r] ^= coeffs[r][srcIndex] * src: adds one source's share (incremental encode).
  virtual void update(size_t bytes, int srcCount, int rows, int srcIndex,
                      const std::vector<uint8_t>& tables, const uint8_t* src,
                      uint8_t* const* outs) const = 0;
};

// The kernels for `backend`; kAuto resolves to ISA-L when built in. Unavailable (with the reason)
// for kIsal in a build without ISA-L.
StatusOr<const GfKernels*> gfKernels(RsBackend backend);

// Always available.
const GfKernels& referenceGfKernels();

}  // namespace cofab::coding
