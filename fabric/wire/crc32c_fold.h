// CRC32C by carry-less multiplication (VPCLMULQDQ on AVX-512): internal to fabric/wire, used by
// crc32c.cc for buffers of kFoldMinBytes and more when the CPU has the instructions.
//
// Why: the crc32 instruction is one 8-byte step per cycle at best (three streams to hide its
// latency), ~95 ns for a 1472-byte dpdk frame on the dev VM, and the dpdk receiver checks one
// such CRC per frame on its polling core. Folding 256 bytes per step with 512-bit carry-less
// multiplies does the same in a fraction of that (docs/DPDK.md, "Frame checksums").
#pragma once

#include <cstddef>
#include <cstdint>

namespace cofab::wire::detail {

// Below this the folding set-up and final reduction cost more than the three-stream crc32 path.
inline constexpr size_t kFoldMinBytes = 256;

// Whether the CPU (and OS) can run crc32cFold: AVX-512F, VPCLMULQDQ, PCLMUL and SSE4.2.
bool crc32cFoldSupported();

// crc32c(crc, src, size) as crc32c.h defines it, for size >= kFoldMinBytes; when dst is not
// null the bytes are also copied to dst (not overlapping) from the same loads. Only call when
// crc32cFoldSupported().
uint32_t crc32cFold(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t size);

}  // namespace cofab::wire::detail
