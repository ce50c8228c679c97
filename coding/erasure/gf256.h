// Portable GF(2^8) arithmetic with the field ISA-L uses (polynomial x^8+x^4+x^3+x^2+1, 0x11d),
// so that matrices built here and by ISA-L are byte-for-byte the same. This is the reference
// the tests trust and the fallback codec when ISA-L is not built in: clear, not fast.
//
// Everything here is pure functions over caller-owned memory; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace cofab::coding::gf256 {

uint8_t mul(uint8_t a, uint8_t b);
// Multiplicative inverse; inv(0) is 0 (as in ISA-L's gf_inv), callers never ask for it.
uint8_t inv(uint8_t a);

// The (k+m) x k systematic Cauchy generator of ISA-L's gf_gen_cauchy1_matrix: identity on top,
// then 1 / (i xor j) for parity row i in [k, k+m) and column j. MDS while k + m <= 256.
std::vector<uint8_t> cauchyGenerator(int k, int m);

// Inverts the n x n row-major matrix `in` (left intact) into `out`. False when singular.
bool invertMatrix(std::span<const uint8_t> in, std::span<uint8_t> out, int n);

// out[r] = sum_j coeffs[r * srcCount + j] * srcs[j] over `bytes` bytes, for r < rows.
// Outputs are overwritten. The slow, obviously correct kernel (one table lookup per byte).
void mulAdd(std::span<const uint8_t> coeffs, int srcCount, int rows, const uint8_t* const* srcs,
            uint8_t* const* outs, size_t bytes);

// outs[r] ^= coeffs[r * srcCount + srcIndex] * src: one source's contribution (incremental).
void mulAddOne(std::span<const uint8_t> coeffs, int srcCount, int rows, int srcIndex,
               const uint8_t* src, uint8_t* const* outs, size_t bytes);

}  // namespace cofab::coding::gf256
