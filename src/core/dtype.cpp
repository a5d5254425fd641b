#include "npusim/dtype.h"

#include <cstring>

namespace npusim {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64:
      return 8;
    case DType::Float32:
    case DType::Int32:
      return 4;
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int16:
      return 2;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool:
      return 1;
  }
  return 1;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Float16:
      return "float16";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Int8:
      return "int8";
    case DType::Int16:
      return "int16";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::UInt8:
      return "uint8";
    case DType::Bool:
      return "bool";
  }
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view text) {
  if (text.starts_with("torch.")) text.remove_prefix(6);
  struct Entry {
    std::string_view name;
    DType dtype;
  };
  static constexpr Entry kEntries[] = {
      {"float32", DType::Float32},   {"float", DType::Float32},  {"F32", DType::Float32},
      {"float64", DType::Float64},   {"double", DType::Float64}, {"F64", DType::Float64},
      {"float16", DType::Float16},   {"half", DType::Float16},   {"F16", DType::Float16},
      {"bfloat16", DType::BFloat16}, {"BF16", DType::BFloat16},  {"int8", DType::Int8},
      {"I8", DType::Int8},           {"int16", DType::Int16},    {"I16", DType::Int16},
      {"int32", DType::Int32},       {"int", DType::Int32},      {"I32", DType::Int32},
      {"int64", DType::Int64},       {"long", DType::Int64},     {"I64", DType::Int64},
      {"uint8", DType::UInt8},       {"U8", DType::UInt8},       {"bool", DType::Bool},
      {"BOOL", DType::Bool},
  };
  for (const auto& entry : kEntries)
    if (entry.name == text) return entry.dtype;
  return std::nullopt;
}

bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Float16 || dtype == DType::BFloat16;
}

bool is_integral(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::Int16 || dtype == DType::Int32 || dtype == DType::Int64 ||
         dtype == DType::UInt8;
}

DType reference_dtype(DType dtype) {
  if (is_floating(dtype)) return DType::Float32;
  if (is_integral(dtype)) return DType::Int64;
  return DType::Bool;
}

float bf16_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

float fp16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      word = sign;
    } else {
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      word = sign | (exponent << 23) | (mantissa << 13);
    }
  } else {
    word = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

uint16_t float_to_fp16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const uint32_t abs = word & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                               // subnormal half or zero
    if (abs < 0x33000000u) return sign;
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 + (113 - exponent) - 1
    uint32_t half = mantissa >> (shift);
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t remainder = abs & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

}  // namespace npusim
