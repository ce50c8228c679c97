// XOR over raw bytes: the only arithmetic coded shuffling needs (DESIGN.md §6: exact, never float
// addition). Uses ISA-L's xor_gen where its contract holds (32-byte aligned buffers), a portable
// word loop otherwise. Pure functions over caller-owned memory; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cofab::coding {

// dst ^= src over `bytes` bytes. dst and src may not overlap partially (equal is fine: zeroes).
void xorInto(uint8_t* dst, const uint8_t* src, size_t bytes);

// dst = srcs[0] ^ srcs[1] ^ ... (overwrites dst; an empty list zeroes it). dst may be one of the
// sources, listed any number of times; sources may not overlap dst partially.
void xorOf(uint8_t* dst, std::span<const uint8_t* const> srcs, size_t bytes);

}  // namespace cofab::coding
