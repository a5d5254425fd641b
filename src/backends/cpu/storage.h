#pragma once
// How the CPU backend stores values: floating values in the program's storage dtype (fp32, fp16 or bf16),
// integers as int64 and bools as uint8 0/1. Kernels compute floats in fp32 and convert at the edges.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/zeroed_memory.h"
#include "npusim/dtype.h"
#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim::cpu {

enum class Elem : uint8_t { F32, F16, BF16, I64, Bool };

size_t elem_size(Elem elem);
inline bool is_float_elem(Elem elem) { return elem == Elem::F32 || elem == Elem::F16 || elem == Elem::BF16; }

// The float storage element of a program's compute dtype; fails for anything but fp32, fp16 and bf16.
Elem float_storage(DType compute_dtype);
// Storage element of a value of `dtype` when floats are stored as `floats`.
Elem storage_elem(DType dtype, Elem floats);
// How every value of a program is stored, by ValueId: floats as `floats`, except rotary frequencies, which stay
// fp32 because positions multiply them.
std::vector<Elem> value_storage_elems(const Graph& graph, Elem floats);
// The dtype of the reference domain a storage element converts to (fp32, int64 or bool).
DType reference_dtype_of(Elem elem);

// Float-to-integer conversion without undefined behaviour: NaN becomes 0, out-of-range values saturate.
inline int64_t float_to_int64(double value) {
  if (std::isnan(value)) return 0;
  if (value >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
  if (value <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(value);
}

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// Element i of a buffer as float / as int64 (bools 0 or 1), and the reverse. For scalar paths; bulk paths use
// the converters below.
float load_float(const std::byte* data, Elem elem, int64_t i);
int64_t load_int(const std::byte* data, Elem elem, int64_t i);
void store_float(std::byte* data, Elem elem, int64_t i, float value);
void store_int(std::byte* data, Elem elem, int64_t i, int64_t value);

// Bulk conversions between a buffer and fp32 / int64 arrays (vectorized where the CPU allows).
void to_float(const std::byte* src, Elem elem, float* dst, int64_t count);
void from_float(const float* src, std::byte* dst, Elem elem, int64_t count);
void to_int(const std::byte* src, Elem elem, int64_t* dst, int64_t count);
void from_int(const int64_t* src, std::byte* dst, Elem elem, int64_t count);
// Any element type to any other (float via fp32, integers exactly).
void convert(const std::byte* src, Elem from, std::byte* dst, Elem to, int64_t count);

// A reference-domain tensor (fp32 floats, int64 integers, bool) copied into / out of storage.
void tensor_to_storage(const Tensor& tensor, std::byte* dst, Elem elem);
Tensor storage_to_tensor(const std::byte* src, Elem elem, const Shape& shape);

// One zero-filled allocation aligned for vector loads.
class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, Pages pages = Pages::Small);
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  ZeroedMemory data_;
  size_t size_ = 0;
};

}  // namespace npusim::cpu
