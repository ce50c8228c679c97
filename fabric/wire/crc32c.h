// CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected 0x82F63B78).
//
// Used for the wire header checksum and the optional payload checksum (fabric/wire/header.h).
// Three implementations, chosen once at first use, give identical results: for 256 bytes and
// more, carry-less-multiply folding when the CPU has AVX-512 with VPCLMULQDQ (crc32c_fold.h);
// otherwise the SSE4.2 crc32 instruction when it has that; a table-driven portable version
// else. Pure functions, callable from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cofab::wire {

// Extends `crc` (the value returned for the bytes so far; 0 to start) over `size` bytes at
// `data`. crc32c(crc32c(0, a), b) == crc32c over a followed by b.
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

// Copies `size` bytes from `src` to `dst` (not overlapping) and returns crc32c(crc, src, size),
// in one pass over the bytes: the CRC's loads feed the stores, so the copy costs next to nothing
// on top of the CRC (the dpdk sender fills each frame this way instead of memcpy then CRC).
uint32_t crc32cCopy(uint32_t crc, void* dst, const void* src, size_t size);

// crc32c(crcA, B) for bytes B of length `sizeB` whose own checksum crc32c(0, B) is `crcB`,
// without reading B: checksums of adjacent pieces are joined (CRC is linear: appending B
// advances the register over sizeB zero bytes, then adds B's own CRC). Lets a receiver that
// has checksummed a frame's payload for the frame CRC reuse it for a message checksum that
// covers the same bytes. Costs four table lookups; the 4 KiB table for a size is built on a
// thread's first use of it (~50 us) and each thread keeps the last few sizes, so it is meant
// for a few fixed sizes (a full frame's payload), not for arbitrary ones.
uint32_t crc32cCombine(uint32_t crcA, uint32_t crcB, size_t sizeB);

// crc32c(0, b, 32) for the 32 bytes b whose little-endian 64-bit words are w0..w3, computed from
// registers: a dpdk frame header is checksummed without being stored first. (Reading back, in
// 8-byte loads, bytes just written by stores of another size or offset defeats the CPU's store
// forwarding: it cost crc32c() ~5-10 ns a frame on a header that had just been stamped.)
uint32_t crc32cOfWords(uint64_t w0, uint64_t w1, uint64_t w2, uint64_t w3);

// The portable implementation, exposed so tests can compare it with the hardware one.
uint32_t crc32cPortable(uint32_t crc, const void* data, size_t size);
// Whether crc32c() uses the SSE4.2 instruction on this CPU (below 256 bytes, or for all sizes
// when it lacks VPCLMULQDQ).
bool crc32cIsHardware();

}  // namespace cofab::wire
