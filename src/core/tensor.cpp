#include "npusim/tensor.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/zeroed_memory.h"

namespace npusim {

namespace {

// A request larger than the machine's memory can never succeed: refuse it with the shape rather than throwing
// bad_alloc (or, under AddressSanitizer, aborting) deep inside an allocation.
size_t checked_allocation_bytes(DType dtype, const Shape& shape) {
  const auto numel = static_cast<size_t>(shape_numel(shape));
  const size_t element = dtype_size(dtype);
  const size_t memory = physical_memory_bytes();
  if (numel > memory / element)
    fail("cannot allocate a " + std::string(dtype_name(dtype)) + " tensor of shape " + shape_string(shape) + ": " +
         (numel > std::numeric_limits<size_t>::max() / element ? std::string("its size overflows")
                                                               : std::to_string(numel * element) + " bytes") +
         ", more than this machine's " + std::to_string(memory) + " bytes of memory");
  return numel * element;
}

}  // namespace

size_t physical_memory_bytes() {
  static const size_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page_size = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return std::numeric_limits<size_t>::max();
    return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
  }();
  return bytes;
}

int64_t shape_numel(const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("negative dimension in shape " + shape_string(shape));
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d) fail("shape " + shape_string(shape) + " overflows");
    count *= d;
  }
  return count;
}

std::string shape_string(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

Tensor::Tensor(DType dtype, Shape shape, TensorMemory memory)
    : dtype_(dtype), shape_(std::move(shape)), writable_(true) {
  std::shared_ptr<std::byte> storage = allocate_zeroed(checked_allocation_bytes(dtype_, shape_), "a tensor",
                                                       memory == TensorMemory::Streamed ? Pages::Huge : Pages::Small);
  data_ = storage.get();
  owner_ = std::move(storage);
}

Tensor Tensor::borrow(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.owner_ = std::move(owner);
  t.data_ = const_cast<std::byte*>(static_cast<const std::byte*>(data));
  t.writable_ = false;
  return t;
}

int64_t Tensor::dim(int64_t index) const {
  const int64_t r = rank();
  if (index < 0) index += r;
  if (index < 0 || index >= r)
    fail("dimension " + std::to_string(index) + " out of range for shape " + shape_string(shape_));
  return shape_[static_cast<size_t>(index)];
}

std::byte* Tensor::mutable_bytes() {
  if (!writable_) fail("tensor is read-only (it borrows mapped memory)");
  return data_;
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel()) fail("cannot reshape " + shape_string(shape_) + " to " + shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

double Tensor::element_as_double(int64_t i) const {
  switch (dtype_) {
    case DType::Float32:
      return data<float>()[i];
    case DType::Float64:
      return data<double>()[i];
    case DType::Float16:
      return fp16_to_float(data<uint16_t>()[i]);
    case DType::BFloat16:
      return bf16_to_float(data<uint16_t>()[i]);
    case DType::Int8:
      return data<int8_t>()[i];
    case DType::Int16:
      return data<int16_t>()[i];
    case DType::Int32:
      return data<int32_t>()[i];
    case DType::Int64:
      return static_cast<double>(data<int64_t>()[i]);
    case DType::UInt8:
      return data<uint8_t>()[i];
    case DType::Bool:
      return data<uint8_t>()[i] ? 1.0 : 0.0;
  }
  return 0.0;
}

namespace {

template <typename Out>
void convert_all(const Tensor& in, Out* out) {
  const int64_t n = in.numel();
  if (in.dtype() == DType::Int64) {
    const auto* src = in.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(src[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(in.element_as_double(i));
}

}  // namespace

Tensor Tensor::to(DType target, TensorMemory memory) const {
  if (target == dtype_) return *this;
  Tensor out(target, shape_, memory);
  const int64_t n = numel();
  switch (target) {
    case DType::Float32: {
      auto* dst = out.mutable_data<float>();
      if (dtype_ == DType::BFloat16) {
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(data<uint16_t>()[i]);
      } else if (dtype_ == DType::Float16) {
        for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(data<uint16_t>()[i]);
      } else {
        convert_all(*this, dst);
      }
      break;
    }
    case DType::Float64:
      convert_all(*this, out.mutable_data<double>());
      break;
    case DType::Float16:
      for (int64_t i = 0; i < n; ++i)
        out.mutable_data<uint16_t>()[i] = float_to_fp16(static_cast<float>(element_as_double(i)));
      break;
    case DType::BFloat16:
      for (int64_t i = 0; i < n; ++i)
        out.mutable_data<uint16_t>()[i] = float_to_bf16(static_cast<float>(element_as_double(i)));
      break;
    case DType::Int8:
      convert_all(*this, out.mutable_data<int8_t>());
      break;
    case DType::Int16:
      convert_all(*this, out.mutable_data<int16_t>());
      break;
    case DType::Int32:
      convert_all(*this, out.mutable_data<int32_t>());
      break;
    case DType::Int64:
      convert_all(*this, out.mutable_data<int64_t>());
      break;
    case DType::UInt8:
      convert_all(*this, out.mutable_data<uint8_t>());
      break;
    case DType::Bool:
      for (int64_t i = 0; i < n; ++i) out.mutable_data<uint8_t>()[i] = element_as_double(i) != 0.0 ? 1 : 0;
      break;
  }
  return out;
}

Tensor Tensor::clone(TensorMemory memory) const {
  Tensor out(dtype_, shape_, memory);
  if (nbytes()) std::memcpy(out.mutable_bytes(), data_, nbytes());
  return out;
}

}  // namespace npusim
