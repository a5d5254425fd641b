#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "npusim/dtype.h"
#include "npusim/error.h"

namespace npusim {

using Shape = std::vector<int64_t>;

// The machine's physical memory: no single allocation larger than this is attempted (it could never succeed).
size_t physical_memory_bytes();
int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);  // "[1, 3, 224, 224]"
Shape contiguous_strides(const Shape& shape);  // in elements

// Where a tensor's own memory comes from: ordinary pages, or, for a weight that decoding streams once per token,
// transparent huge pages taken at the first touch (faster to stream, slower to fault in).
enum class TensorMemory : uint8_t { Ordinary, Streamed };

// A dense, row-major tensor. Storage is shared: copies of a Tensor alias the same bytes. A tensor made by
// `Tensor::borrow` points into memory owned elsewhere (a mapped file) and keeps its owner alive.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, TensorMemory memory = TensorMemory::Ordinary);  // zero-filled
  static Tensor borrow(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int64_t index) const;  // negative index counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  const std::byte* bytes() const { return data_; }
  std::byte* mutable_bytes();  // fails on borrowed (read-only) tensors
  bool borrowed() const { return data_ != nullptr && !writable_; }

  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(data_);
  }
  template <typename T>
  T* mutable_data() {
    return reinterpret_cast<T*>(mutable_bytes());
  }

  // Same bytes, another shape with the same element count.
  Tensor reshaped(Shape shape) const;
  // Converted copy (or this tensor when already of that dtype).
  Tensor to(DType dtype, TensorMemory memory = TensorMemory::Ordinary) const;
  // Copy in the reference domain: fp32 for floats, int64 for integers, bool for bool.
  Tensor to_reference() const { return to(reference_dtype(dtype_)); }
  // Element i as double, whatever the dtype.
  double element_as_double(int64_t index) const;
  // Copy in memory of its own (a borrowed tensor's copy no longer reads the mapped file).
  Tensor clone(TensorMemory memory = TensorMemory::Ordinary) const;

 private:
  DType dtype_ = DType::Float32;
  Shape shape_;
  std::shared_ptr<const void> owner_;
  std::byte* data_ = nullptr;
  bool writable_ = false;
};

}  // namespace npusim
