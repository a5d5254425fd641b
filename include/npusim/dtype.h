#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace npusim {

enum class DType : uint8_t {
  Float32,
  Float64,
  Float16,
  BFloat16,
  Int8,
  Int16,
  Int32,
  Int64,
  UInt8,
  Bool,
};

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "float32", "bfloat16", ...
// Accepts "float32", "torch.float32", "f32" style safetensors names ("F32", "BF16", ...).
std::optional<DType> parse_dtype(std::string_view text);
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // integers, not bool

// The reference path computes floats in fp32, integers in int64 and keeps bools.
DType reference_dtype(DType dtype);

float bf16_to_float(uint16_t bits);
// Round to nearest even; NaN stays a quiet NaN. Inline: kernels store one value at a time with it.
inline uint16_t float_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>((word + rounding) >> 16);
}
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);  // round to nearest even

}  // namespace npusim
