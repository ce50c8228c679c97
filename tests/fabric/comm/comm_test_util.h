// Helpers for the communicator and collective tests: communicators for threads as ranks,
// deterministic inputs, element conversion for every dtype, and the serial reference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "fabric/comm/communicator.h"
#include "fabric/comm/reduce_kernels.h"
#include "fabric/rendezvous/store.h"

namespace cofab::comm::testing {

// Creates `n` communicators over `store` concurrently (one thread each, as setup requires).
StatusOr<std::vector<std::unique_ptr<Communicator>>> makeComms(int n, Store* store,
                                                                const std::string& transport,
                                                                const std::string& name = "t");

// Element i of rank r's input. Pattern 0: small integers (every dtype holds them and their sums
// exactly, so every algorithm must match the reference bit for bit). Pattern 1: values in
// [-1, 1) (floats: checked against an error bound).
double inputValue(int pattern, int rank, size_t i);

// Host buffer of `count` elements of `dtype` (f16/bf16 as their bit patterns).
std::vector<uint8_t> makeBuffer(DType dtype, size_t count);
void setElement(DType dtype, void* data, size_t i, double v);
double getElement(DType dtype, const void* data, size_t i);
// The value `v` rounded to `dtype`, as double.
double roundTo(DType dtype, double v);

// The reference: element i reduced over `n` ranks of pattern `pattern`, in rank order, in
// double, then rounded once to the dtype (avg: sum / n, truncated for integers).
double reference(DType dtype, ReduceOp op, int pattern, int n, size_t i);
// An upper bound on |result - reference| for pattern 1: each of the n - 1 combines may round
// to the dtype (ring partial sums travel in the dtype), each costing half an ulp of at most
// sum|x|; the final rounding another half ulp. 0 for exact cases.
double tolerance(DType dtype, ReduceOp op, int pattern, int n, size_t i);

// Checks `count` elements of a reduced buffer against the reference; "" or the first mismatch.
std::string checkReduced(DType dtype, ReduceOp op, int pattern, int n, const void* data,
                         size_t count, size_t offset = 0);

inline constexpr DType kReduceDTypes[] = {DType::kF32, DType::kF64, DType::kF16,
                                          DType::kBF16, DType::kI32, DType::kI64};
inline constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                          ReduceOp::kMax};

}  // namespace cofab::comm::testing
