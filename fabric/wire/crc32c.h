// CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected 0x82F63B78).
//
// Used for the wire header checksum and the optional payload checksum (fabric/wire/header.h).
// The SSE4.2 crc32 instruction is used when the CPU has it (checked once, at first use), a
// table-driven portable version otherwise; both give identical results. Pure functions, callable
// from any thread.
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

// The portable implementation, exposed so tests can compare it with the hardware one.
uint32_t crc32cPortable(uint32_t crc, const void* data, size_t size);
// Whether crc32c() uses the SSE4.2 instruction on this CPU.
bool crc32cIsHardware();

}  // namespace cofab::wire
