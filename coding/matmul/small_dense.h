// Small dense FP64 linear algebra for code construction and decode coefficients: k x k systems
// with k in the tens, where calling LAPACK would cost more in glue than in flops. Bulk matrix
// products never come here: they go through BLAS.
//
// Pure functions on caller-owned row-major arrays; safe from any thread.
#pragma once

#include <span>
#include <vector>

namespace cofab::coding::dense {

// Inverts the n x n row-major matrix `a` with partial pivoting into `out`. False when a pivot is
// exactly zero (singular); ill-conditioning is the caller's business (see conditionNumber).
bool invert(std::span<const double> a, std::span<double> out, int n);

// Singular values of the rows x cols row-major matrix (one-sided Jacobi: accurate to working
// precision even for small singular values), descending.
std::vector<double> singularValues(std::span<const double> a, int rows, int cols);

// 2-norm condition number sigma_max / sigma_min; +inf when singular.
double conditionNumber(std::span<const double> a, int n);

}  // namespace cofab::coding::dense
