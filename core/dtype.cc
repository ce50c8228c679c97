#include "core/dtype.h"

#include <string>

namespace cofab {

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  COFAB_CHECK(false) << "invalid DType " << static_cast<int>(dtype);
  return 0;
}

std::string_view dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "invalid";
}

StatusOr<DType> parseDType(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::kF32},   {"float32", DType::kF32}, {"float", DType::kF32},
      {"f64", DType::kF64},   {"float64", DType::kF64}, {"double", DType::kF64},
      {"f16", DType::kF16},   {"float16", DType::kF16}, {"half", DType::kF16},
      {"bf16", DType::kBF16}, {"bfloat16", DType::kBF16},
      {"i32", DType::kI32},   {"int32", DType::kI32},
      {"i64", DType::kI64},   {"int64", DType::kI64},
      {"u8", DType::kU8},     {"uint8", DType::kU8},
  };
  for (const auto& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) +
                         "'; expected one of f32, f64, f16, bf16, i32, i64, u8");
}

bool isValidDType(uint8_t raw) { return raw >= 1 && raw <= 7; }

bool isFloatingDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

}  // namespace cofab
