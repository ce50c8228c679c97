#include "coding/matmul/small_dense.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace cofab::coding::dense {

bool invert(std::span<const double> a, std::span<double> out, int n) {
  const size_t nn = static_cast<size_t>(n) * n;
  COFAB_CHECK(a.size() >= nn && out.size() >= nn);
  std::vector<double> m(a.begin(), a.begin() + nn);
  std::fill(out.begin(), out.begin() + nn, 0.0);
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i) * n + i] = 1.0;
  auto at = [n](std::span<double> x, int r, int c) -> double& {
    return x[static_cast<size_t>(r) * n + c];
  };
  std::span<double> ms(m);
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::fabs(at(ms, r, col)) > std::fabs(at(ms, pivot, col))) pivot = r;
    }
    if (at(ms, pivot, col) == 0.0) return false;
    if (pivot != col) {
      for (int j = 0; j < n; ++j) {
        std::swap(at(ms, pivot, j), at(ms, col, j));
        std::swap(at(out, pivot, j), at(out, col, j));
      }
    }
    const double s = 1.0 / at(ms, col, col);
    for (int j = 0; j < n; ++j) {
      at(ms, col, j) *= s;
      at(out, col, j) *= s;
    }
    for (int r = 0; r < n; ++r) {
      const double f = at(ms, r, col);
      if (r == col || f == 0.0) continue;
      for (int j = 0; j < n; ++j) {
        at(ms, r, j) -= f * at(ms, col, j);
        at(out, r, j) -= f * at(out, col, j);
      }
    }
  }
  return true;
}

std::vector<double> singularValues(std::span<const double> a, int rows, int cols) {
  // One-sided Jacobi on the columns of A: rotate column pairs until all are orthogonal; the
  // column norms are then the singular values. Columns are stored contiguously (column-major).
  COFAB_CHECK(a.size() >= static_cast<size_t>(rows) * cols);
  std::vector<double> c(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j)
      c[static_cast<size_t>(j) * rows + r] = a[static_cast<size_t>(r) * cols + j];
  }
  std::vector<double> norm2(cols);
  for (int j = 0; j < cols; ++j) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += c[j * rows + r] * c[j * rows + r];
    norm2[j] = s;
  }
  const double eps = std::numeric_limits<double>::epsilon();
  for (int sweep = 0; sweep < 60; ++sweep) {
    bool rotated = false;
    for (int p = 0; p < cols - 1; ++p) {
      double* cp = &c[static_cast<size_t>(p) * rows];
      for (int q = p + 1; q < cols; ++q) {
        double* cq = &c[static_cast<size_t>(q) * rows];
        double gamma = 0;
        for (int r = 0; r < rows; ++r) gamma += cp[r] * cq[r];
        const double alpha = norm2[p], beta = norm2[q];
        if (gamma == 0.0 || std::fabs(gamma) <= eps * std::sqrt(alpha * beta)) continue;
        rotated = true;
        const double zeta = (beta - alpha) / (2.0 * gamma);
        const double t =
            std::copysign(1.0, zeta) / (std::fabs(zeta) + std::sqrt(1.0 + zeta * zeta));
        const double cs = 1.0 / std::sqrt(1.0 + t * t);
        const double sn = cs * t;
        double np = 0, nq = 0;
        for (int r = 0; r < rows; ++r) {
          const double x = cp[r], y = cq[r];
          cp[r] = cs * x - sn * y;
          cq[r] = sn * x + cs * y;
          np += cp[r] * cp[r];
          nq += cq[r] * cq[r];
        }
        norm2[p] = np;
        norm2[q] = nq;
      }
    }
    if (!rotated) break;
  }
  std::vector<double> sv(cols);
  for (int j = 0; j < cols; ++j) sv[j] = std::sqrt(norm2[j]);
  std::sort(sv.begin(), sv.end(), std::greater<>());
  return sv;
}

double conditionNumber(std::span<const double> a, int n) {
  std::vector<double> sv = singularValues(a, n, n);
  if (sv.empty()) return 1.0;
  if (sv.back() == 0.0) return std::numeric_limits<double>::infinity();
  return sv.front() / sv.back();
}

}  // namespace cofab::coding::dense
