// Reducer: the aggregator's element-wise reduction, with a fixed order so that results are
// bit-exact and reproducible.
//
// Order (part of the contract, docs/AGGREGATOR.md): for every element i,
//   acc = x_0[i]; acc = acc + x_1[i]; ...; acc = acc + x_{n-1}[i]   (left fold, rank order)
// in the accumulation type (f32 for f32/f16/bf16, f64 for f64), then for an average
// acc = acc / n, then one rounding to the element type (round to nearest even). Contributions
// are buffered and folded in worker-rank order when the round completes, so arrival order,
// retransmissions and failovers cannot change a single bit. Pure function; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace cofab::aggregator {

// contributions[r] points to `count` elements of `dtype` (worker r's chunk); writes `count`
// elements to `out`, which may be contributions[0] exactly (each block of it is read before it
// is written) but must not overlap any other input. dtype must be f32, f64, f16 or bf16 (checked by
// the caller: COFAB_CHECK here).
void reduceInRankOrder(DType dtype, bool average, std::span<const uint8_t* const> contributions,
                       size_t count, uint8_t* out);

}  // namespace cofab::aggregator
