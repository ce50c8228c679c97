// Element-wise reduction kernels used by the collectives (fabric/comm/collectives.h).
//
// Pure functions on caller-owned memory, callable from any thread (the collectives call them on
// transport I/O threads). Each kernel is a plain loop the compiler vectorises; the dispatcher
// picks an AVX-512 or AVX2 build of it at run time (GCC function multiversioning), so one
// binary runs well on any x86-64. f16 and bf16 are widened to f32, combined in f32 and rounded
// once per call (round to nearest even). Integer sums wrap (two's complement), like NCCL's.
// min and max return NaN when any input is NaN, on every rank and whichever rank held it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace cofab::comm {

// Values travel in message headers (fabric/comm/op_header.h): never renumber.
enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3 };

std::string_view reduceOpName(ReduceOp op);
StatusOr<ReduceOp> parseReduceOp(std::string_view name);
// InvalidArgument for dtypes the collectives cannot reduce (u8) naming the op and dtype.
Status checkReducible(DType dtype, ReduceOp op);

// dst[i] = a[i] (op) b[i] for i < n. dst may alias a or b exactly (in-place), not partially.
// kAvg combines like kSum; the division by the rank count happens once, in the last combine
// (reduceFinal), or not at all for f16, whose contributions enter pre-scaled (scaledSumF16).
void reduce(DType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n);

// Like reduce(), and then divides by `divisor` (kAvg's last step; integers truncate toward zero).
// For other ops it is reduce(). Folding the division into the last combine keeps f16/bf16 at
// one rounding and saves a pass over memory.
void reduceFinal(DType dtype, ReduceOp op, int divisor, void* dst, const void* a, const void* b,
                 size_t n);

// An f16 average adds raw values in f16 partial sums, which overflow (65504) long before the
// average does: 3 ranks averaging 40000 got inf. Its contributions enter scaled by 1/n instead
// and no division follows: dst[i] = a[i] * aScale + b[i] * bScale in f32, rounded once to f16.
// dst may alias a or b exactly. The collectives use it for every combine of an f16 kAvg.
inline bool avgPrescaled(DType dtype, ReduceOp op) {
  return dtype == DType::kF16 && op == ReduceOp::kAvg;
}
void scaledSumF16(void* dst, const void* a, float aScale, const void* b, float bScale, size_t n);

// Which instruction set the dispatcher chose for f32 sums on this CPU ("avx512f", "avx2",
// "default"), for benchmarks and cofab-info-like reports.
std::string_view reduceIsa();

}  // namespace cofab::comm
