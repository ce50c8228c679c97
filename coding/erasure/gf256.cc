#include "coding/erasure/gf256.h"

#include <array>
#include <cstring>

#include "core/check.h"

namespace cofab::coding::gf256 {
namespace {

struct Tables {
  std::array<uint8_t, 256> log{};
  std::array<uint8_t, 512> exp{};
  // mulTable[a][b]: 64 KiB, makes the reference codec a lookup per byte.
  std::array<std::array<uint8_t, 256>, 256> mulTable{};

  Tables() {
    unsigned x = 1;
    for (int i = 0; i < 255; ++i) {
      exp[i] = static_cast<uint8_t>(x);
      log[x] = static_cast<uint8_t>(i);
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (int i = 255; i < 512; ++i) exp[i] = exp[i - 255];
    for (int a = 0; a < 256; ++a) {
      for (int b = 0; b < 256; ++b) {
        mulTable[a][b] = (a == 0 || b == 0) ? 0 : exp[log[a] + log[b]];
      }
    }
  }
};

const Tables& tables() {
  static const Tables t;  // function-local: built on first use, thread-safe
  return t;
}

}  // namespace

uint8_t mul(uint8_t a, uint8_t b) { return tables().mulTable[a][b]; }

uint8_t inv(uint8_t a) {
  if (a == 0) return 0;
  const Tables& t = tables();
  return t.exp[255 - t.log[a]];
}

std::vector<uint8_t> cauchyGenerator(int k, int m) {
  COFAB_CHECK(k > 0 && m >= 0 && k <= 256 && m <= 256 - k) << "k=" << k << " m=" << m;
  const int rows = k + m;
  std::vector<uint8_t> g(static_cast<size_t>(rows) * k, 0);
  for (int i = 0; i < k; ++i) g[static_cast<size_t>(i) * k + i] = 1;
  for (int i = k; i < rows; ++i) {
    for (int j = 0; j < k; ++j) {
      g[static_cast<size_t>(i) * k + j] = inv(static_cast<uint8_t>(i ^ j));
    }
  }
  return g;
}

bool invertMatrix(std::span<const uint8_t> in, std::span<uint8_t> out, int n) {
  const size_t nn = static_cast<size_t>(n) * n;
  COFAB_CHECK(in.size() >= nn && out.size() >= nn);
  std::vector<uint8_t> a(in.begin(), in.begin() + nn);
  std::fill(out.begin(), out.begin() + nn, 0);
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i) * n + i] = 1;
  auto row = [n](std::span<uint8_t> m, int r) { return m.data() + static_cast<size_t>(r) * n; };
  std::span<uint8_t> as(a);
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    while (pivot < n && row(as, pivot)[col] == 0) ++pivot;
    if (pivot == n) return false;
    if (pivot != col) {
      std::swap_ranges(row(as, pivot), row(as, pivot) + n, row(as, col));
      std::swap_ranges(row(out, pivot), row(out, pivot) + n, row(out, col));
    }
    const uint8_t s = inv(row(as, col)[col]);
    for (int j = 0; j < n; ++j) {
      row(as, col)[j] = mul(row(as, col)[j], s);
      row(out, col)[j] = mul(row(out, col)[j], s);
    }
    for (int r = 0; r < n; ++r) {
      const uint8_t f = row(as, r)[col];
      if (r == col || f == 0) continue;
      for (int j = 0; j < n; ++j) {
        row(as, r)[j] ^= mul(f, row(as, col)[j]);
        row(out, r)[j] ^= mul(f, row(out, col)[j]);
      }
    }
  }
  return true;
}

void mulAdd(std::span<const uint8_t> coeffs, int srcCount, int rows, const uint8_t* const* srcs,
            uint8_t* const* outs, size_t bytes) {
  for (int r = 0; r < rows; ++r) {
    std::memset(outs[r], 0, bytes);
    for (int j = 0; j < srcCount; ++j) {
      const auto& t = tables().mulTable[coeffs[static_cast<size_t>(r) * srcCount + j]];
      const uint8_t* s = srcs[j];
      uint8_t* o = outs[r];
      for (size_t b = 0; b < bytes; ++b) o[b] ^= t[s[b]];
    }
  }
}

void mulAddOne(std::span<const uint8_t> coeffs, int srcCount, int rows, int srcIndex,
               const uint8_t* src, uint8_t* const* outs, size_t bytes) {
  for (int r = 0; r < rows; ++r) {
    const auto& t = tables().mulTable[coeffs[static_cast<size_t>(r) * srcCount + srcIndex]];
    uint8_t* o = outs[r];
    for (size_t b = 0; b < bytes; ++b) o[b] ^= t[src[b]];
  }
}

}  // namespace cofab::coding::gf256
