// Seeded random bytes for tests that need incompressible, reproducible data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace cofab::testing {

inline std::vector<uint8_t> randomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace cofab::testing
