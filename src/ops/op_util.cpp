#include "ops/op_util.h"

#include <algorithm>

namespace npusim::ops {

int64_t normalize_dim(int64_t dim, int64_t rank, const char* what) {
  const int64_t bound = std::max<int64_t>(rank, 1);
  if (dim < -bound || dim >= bound)
    fail(std::string(what) + " " + std::to_string(dim) + " is out of range for rank " + std::to_string(rank));
  return dim < 0 ? dim + bound : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      fail("shapes " + shape_string(a) + " and " + shape_string(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {
int promotion_rank(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::UInt8: return 1;
    case DType::Int8: return 2;
    case DType::Int16: return 3;
    case DType::Int32: return 4;
    case DType::Int64: return 5;
    case DType::BFloat16: return 6;
    case DType::Float16: return 7;
    case DType::Float32: return 8;
    case DType::Float64: return 9;
  }
  return 8;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::BFloat16 && b == DType::Float16) || (a == DType::Float16 && b == DType::BFloat16))
    return DType::Float32;
  if ((a == DType::UInt8 && b == DType::Int8) || (a == DType::Int8 && b == DType::UInt8)) return DType::Int16;
  return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

DType promote_with_scalar(DType a, bool scalar_is_float) {
  if (is_floating(a)) return a;
  if (scalar_is_float) return DType::Float32;
  return a == DType::Bool ? DType::Int64 : a;
}

std::vector<int64_t> broadcast_strides(const Shape& input, const Shape& out_shape) {
  std::vector<int64_t> strides(out_shape.size(), 0);
  const size_t offset = out_shape.size() - input.size();
  int64_t stride = 1;
  for (size_t i = input.size(); i-- > 0;) {
    strides[i + offset] = input[i] == 1 ? 0 : stride;
    stride *= input[i];
  }
  return strides;
}

Tensor make_output(const TensorMeta& meta) { return Tensor(reference_dtype(meta.dtype), meta.shape); }

void expect_inputs(std::span<const TensorMeta> inputs, size_t count, const char* op) {
  if (inputs.size() != count)
    fail(std::string(op) + " expects " + std::to_string(count) + " inputs, got " + std::to_string(inputs.size()));
}

void expect_rank(const TensorMeta& meta, int rank, const char* what) {
  if (static_cast<int>(meta.shape.size()) != rank)
    fail(std::string(what) + " must have rank " + std::to_string(rank) + ", got shape " + shape_string(meta.shape));
}

TensorMeta same_as_input(std::span<const TensorMeta> inputs, size_t index) {
  if (inputs.size() <= index) fail("missing input " + std::to_string(index));
  return inputs[index];
}

double read_element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Float32: return t.data<float>()[i];
    case DType::Int64: return static_cast<double>(t.data<int64_t>()[i]);
    case DType::Bool: return t.data<uint8_t>()[i] ? 1.0 : 0.0;
    default: return t.element_as_double(i);
  }
}

void write_element(Tensor& t, int64_t i, double value) {
  switch (t.dtype()) {
    case DType::Float32: t.mutable_data<float>()[i] = static_cast<float>(value); return;
    case DType::Int64: t.mutable_data<int64_t>()[i] = static_cast<int64_t>(value); return;
    case DType::Bool: t.mutable_data<uint8_t>()[i] = value != 0.0 ? 1 : 0; return;
    default: fail("write_element: tensor is not in the reference domain (" + std::string(dtype_name(t.dtype())) + ")");
  }
}

bool is_matrix_product(const std::string& op) {
  return op == "linear" || op == "matmul" || op == "mm" || op == "bmm" || op == "addmm" || op == "baddbmm";
}

// Which dims of a rank-`rank` tensor are reduced: the `dim` list, where null or [] means every dim.
std::vector<bool> reduced_dims(const Attrs& attrs, int64_t rank) {
  const std::vector<int64_t> dims = attrs.get_ints("dim", {});
  std::vector<bool> reduced(static_cast<size_t>(rank), dims.empty());
  for (int64_t dim : dims) {
    const int64_t d = normalize_dim(dim, rank);
    if (rank == 0) continue;  // dim 0 or -1 of a 0-d tensor reduces nothing
    if (reduced[static_cast<size_t>(d)]) fail("dim " + std::to_string(dim) + " appears more than once in the list");
    reduced[static_cast<size_t>(d)] = true;
  }
  return reduced;
}

}  // namespace npusim::ops
