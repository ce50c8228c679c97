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
  // column norms are then the singular values.
  COFAB_CHECK(a.size() >= static_cast<size_t>(rows) * cols);
  std::vector<std::vector<double>> c(cols, std::vector<double>(rows));
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) c[j][r] = a[static_cast<size_t>(r) * cols + j];
  }
  const double eps = std::numeric_limits<double>::epsilon();
  for (int sweep = 0; sweep < 60; ++sweep) {
    bool rotated = false;
    for (int p = 0; p < cols - 1; ++p) {
      for (int q = p + 1; q < cols; ++q) {
        double alpha = 0, beta = 0, gamma = 0;
        for (int r = 0; r < rows; ++r) {
          alpha += c[p][r] * c[p][r];
          beta += c[q][r] * c[q][r];
          gamma += c[p][r] * c[q][r];
        }
        if (std::fabs(gamma) <= eps * std::sqrt(alpha * beta) || gamma == 0.0) continue;
        rotated = true;
        const double zeta = (beta - alpha) / (2.0 * gamma);
        const double t =
            std::copysign(1.0, zeta) / (std::fabs(zeta) + std::sqrt(1.0 + zeta * zeta));
        const double cs = 1.0 / std::sqrt(1.0 + t * t);
        const double sn = cs * t;
        for (int r = 0; r < rows; ++r) {
          const double x = c[p][r], y = c[q][r];
          c[p][r] = cs * x - sn * y;
          c[q][r] = sn * x + cs * y;
        }
      }
    }
    if (!rotated) break;
  }
  std::vector<double> sv(cols);
  for (int j = 0; j < cols; ++j) {
    double s = 0;
    for (double v : c[j]) s += v * v;
    sv[j] = std::sqrt(s);
  }
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
