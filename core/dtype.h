// Element types cofab moves and reduces. Values are part of the wire format (fabric/wire):
// never renumber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace cofab {

enum class DType : uint8_t {
  kF32 = 1,
  kF64 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI32 = 5,
  kI64 = 6,
  kU8 = 7,
};

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kU8};

// Size in bytes of one element.
size_t dtypeSize(DType dtype);
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8".
std::string_view dtypeName(DType dtype);
// Parses the names above (also "float32", "float", "half", "bfloat16", "int32", ...).
StatusOr<DType> parseDType(std::string_view name);
// True for values of the enum (used when decoding untrusted bytes).
bool isValidDType(uint8_t raw);
bool isFloatingDType(DType dtype);

}  // namespace cofab
