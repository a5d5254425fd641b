// Indexing ops: advanced indexing (index.Tensor, index_put), index_select, index_copy, gather and scatter.
// Index tensors arrive as int64 in the reference domain; elements are copied by byte size, so every dtype works.
#include <algorithm>
#include <cstring>
#include <optional>

#include "ops/op_util.h"

namespace npusim {

namespace {

using namespace ops;

int64_t rank_of(const Shape& shape) { return static_cast<int64_t>(shape.size()); }

void check_index_dtype(const TensorMeta& index, const std::string& op) {
  if (index.dtype == DType::Bool || index.dtype == DType::UInt8)
    fail(op + ": boolean mask indices are not supported (their result shape depends on the data)");
  if (!is_integral(index.dtype))
    fail(op + ": index tensors must be integers, got " + std::string(dtype_name(index.dtype)));
}

// Wraps a negative index and checks the range; index values are data, so this runs in the reference.
int64_t checked_index(int64_t index, int64_t size, const std::string& op) {
  if (index < -size || index >= size)
    fail(op + ": index " + std::to_string(index) + " is out of range for a dimension of size " + std::to_string(size));
  return index < 0 ? index + size : index;
}

void copy_element(const Tensor& from, int64_t from_index, Tensor& to, int64_t to_index) {
  const size_t element = dtype_size(to.dtype());
  std::memcpy(to.mutable_bytes() + static_cast<size_t>(to_index) * element,
              from.bytes() + static_cast<size_t>(from_index) * element, element);
}

void add_element(const Tensor& from, int64_t from_index, Tensor& to, int64_t to_index) {
  if (to.dtype() == DType::Int64) {
    to.mutable_data<int64_t>()[to_index] += from.data<int64_t>()[from_index];
  } else {
    write_element(to, to_index, read_element(to, to_index) + read_element(from, from_index));
  }
}

// Advances a row-major multi-index; returns false after the last position.
bool next_position(std::vector<int64_t>& position, const Shape& shape) {
  for (size_t d = position.size(); d-- > 0;) {
    if (++position[d] < shape[d]) return true;
    position[d] = 0;
  }
  return false;
}

int64_t dot(const std::vector<int64_t>& position, const std::vector<int64_t>& strides) {
  int64_t offset = 0;
  for (size_t d = 0; d < position.size(); ++d) offset += position[d] * strides[d];
  return offset;
}

// ---------------------------------------------------------------------------------------------------------------
// Advanced indexing (index.Tensor, index_put): a list of index tensors, some slots None (= take the whole dim).

struct IndexPlan {
  Shape result;                      // shape of self[indices]
  Shape broadcast;                   // the index tensors broadcast together
  std::vector<size_t> indexed_dims;  // self dimension of each index tensor
  // For each result dimension: the self dimension it walks, or nullopt for a broadcast index dimension.
  std::vector<std::optional<size_t>> result_to_self;
  size_t broadcast_start = 0;  // first result dimension of the broadcast index block
};

// Which slots of the index list are None. torch_ir records `_tensor_list_none_masks` only when some are.
std::vector<bool> none_slots(const Attrs& attrs, size_t index_count, const std::string& op) {
  if (!attrs.is_none("_tensor_list_sizes")) {
    const std::vector<int64_t> sizes = attrs.get_ints("_tensor_list_sizes");
    if (sizes.size() != 1 || sizes[0] != static_cast<int64_t>(index_count))
      fail(op + ": _tensor_list_sizes " + shape_string(sizes) + " does not match " + std::to_string(index_count) +
           " index tensors");
  }
  if (attrs.is_none("_tensor_list_none_masks")) return std::vector<bool>(index_count, false);
  const AttrValue& value = attrs.get("_tensor_list_none_masks");
  std::vector<bool> mask;
  if (const auto* flags = std::get_if<std::vector<bool>>(&value)) {
    mask = *flags;
  } else if (const auto* numbers = std::get_if<std::vector<int64_t>>(&value)) {
    for (int64_t n : *numbers) mask.push_back(n != 0);
  } else {
    fail(op + ": _tensor_list_none_masks must be a list of booleans, got " + attr_value_string(value));
  }
  size_t present = 0;
  for (bool is_none : mask) present += is_none ? 0 : 1;
  if (present != index_count)
    fail(op + ": _tensor_list_none_masks " + attr_value_string(value) + " does not match " +
         std::to_string(index_count) + " index tensors");
  return mask;
}

IndexPlan plan_index(const Attrs& attrs, const Shape& self, std::span<const TensorMeta> indices,
                     const std::string& op) {
  if (indices.empty()) fail(op + ": needs at least one index tensor");
  const std::vector<bool> none = none_slots(attrs, indices.size(), op);
  if (none.size() > self.size())
    fail(op + ": " + std::to_string(none.size()) + " indices given for a tensor of rank " +
         std::to_string(self.size()));
  IndexPlan plan;
  plan.broadcast = indices[0].shape;
  size_t next = 0;
  for (size_t slot = 0; slot < none.size(); ++slot) {
    if (none[slot]) continue;
    check_index_dtype(indices[next], op);
    plan.broadcast = broadcast_shapes(plan.broadcast, indices[next].shape);
    plan.indexed_dims.push_back(slot);
    ++next;
  }
  const size_t first = plan.indexed_dims.front();
  const bool adjacent = plan.indexed_dims.back() - first + 1 == plan.indexed_dims.size();
  // PyTorch: adjacent index tensors put their broadcast dims in place; separated ones put them first.
  plan.broadcast_start = adjacent ? first : 0;
  auto is_indexed = [&](size_t d) {
    return std::find(plan.indexed_dims.begin(), plan.indexed_dims.end(), d) != plan.indexed_dims.end();
  };
  for (size_t d = 0; d < self.size(); ++d) {
    if (d == plan.broadcast_start && adjacent)
      plan.result_to_self.resize(plan.result_to_self.size() + plan.broadcast.size());
    if (!is_indexed(d)) plan.result_to_self.push_back(d);
  }
  if (!adjacent) plan.result_to_self.insert(plan.result_to_self.begin(), plan.broadcast.size(), std::nullopt);
  size_t b = 0;
  for (const auto& source : plan.result_to_self) plan.result.push_back(source ? self[*source] : plan.broadcast[b++]);
  return plan;
}

// Offset into self of every element of self[indices], in row-major order of the result.
std::vector<int64_t> gathered_offsets(const IndexPlan& plan, const Shape& self, std::span<const Tensor> indices,
                                      const std::string& op) {
  const Shape self_strides = contiguous_strides(self);
  std::vector<std::vector<int64_t>> index_strides;
  for (const Tensor& index : indices) index_strides.push_back(broadcast_strides(index.shape(), plan.broadcast));
  std::vector<int64_t> offsets;
  const int64_t count = shape_numel(plan.result);
  if (count == 0) return offsets;
  offsets.reserve(static_cast<size_t>(count));
  std::vector<int64_t> position(plan.result.size(), 0);
  std::vector<int64_t> broadcast_position(plan.broadcast.size(), 0);
  do {
    int64_t offset = 0;
    for (size_t r = 0; r < position.size(); ++r) {
      if (plan.result_to_self[r]) offset += position[r] * self_strides[*plan.result_to_self[r]];
    }
    std::copy_n(position.begin() + static_cast<std::ptrdiff_t>(plan.broadcast_start), plan.broadcast.size(),
                broadcast_position.begin());
    for (size_t j = 0; j < indices.size(); ++j) {
      const size_t dim = plan.indexed_dims[j];
      const int64_t value = indices[j].data<int64_t>()[dot(broadcast_position, index_strides[j])];
      offset += checked_index(value, self[dim], op) * self_strides[dim];
    }
    offsets.push_back(offset);
  } while (next_position(position, plan.result));
  return offsets;
}

std::vector<TensorMeta> infer_index(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const IndexPlan plan = plan_index(attrs, inputs[0].shape, inputs.subspan(1), "index");
  return {TensorMeta{plan.result, inputs[0].dtype}};
}

std::vector<Tensor> index_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                    std::span<const TensorMeta> outputs) {
  std::vector<TensorMeta> index_metas;
  for (const Tensor& index : inputs.subspan(1)) index_metas.push_back({index.shape(), DType::Int64});
  const IndexPlan plan = plan_index(attrs, inputs[0].shape(), index_metas, "index");
  Tensor out(inputs[0].dtype(), outputs[0].shape);
  const std::vector<int64_t> offsets = gathered_offsets(plan, inputs[0].shape(), inputs.subspan(1), "index");
  for (size_t i = 0; i < offsets.size(); ++i) copy_element(inputs[0], offsets[i], out, static_cast<int64_t>(i));
  return {out};
}

// index_put: inputs are self, the index tensors, then values.
std::vector<TensorMeta> infer_index_put(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  if (inputs.size() < 3) fail("index_put: expects self, at least one index tensor and values");
  const IndexPlan plan = plan_index(attrs, inputs[0].shape, inputs.subspan(1, inputs.size() - 2), "index_put");
  const Shape& values = inputs.back().shape;
  if (broadcast_shapes(values, plan.result) != plan.result)
    fail("index_put: values of shape " + shape_string(values) + " do not broadcast to the indexed shape " +
         shape_string(plan.result));
  return {inputs[0]};
}

std::vector<Tensor> index_put_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                        std::span<const TensorMeta>) {
  const std::span<const Tensor> indices = inputs.subspan(1, inputs.size() - 2);
  std::vector<TensorMeta> index_metas;
  for (const Tensor& index : indices) index_metas.push_back({index.shape(), DType::Int64});
  const IndexPlan plan = plan_index(attrs, inputs[0].shape(), index_metas, "index_put");
  Tensor out = inputs[0].clone();
  const Tensor values = inputs.back().to(out.dtype());
  const std::vector<int64_t> value_strides = broadcast_strides(values.shape(), plan.result);
  const std::vector<int64_t> offsets = gathered_offsets(plan, inputs[0].shape(), indices, "index_put");
  const bool accumulate = attrs.get_bool("accumulate");
  std::vector<int64_t> position(plan.result.size(), 0);
  for (int64_t offset : offsets) {
    const int64_t source = dot(position, value_strides);
    if (accumulate)
      add_element(values, source, out, offset);
    else
      copy_element(values, source, out, offset);
    next_position(position, plan.result);
  }
  return {out};
}

// ---------------------------------------------------------------------------------------------------------------
// index_select / index_copy: one integer index vector along `dim`.

struct AlongDim {
  size_t dim;
  int64_t outer;  // product of the dims before `dim`
  int64_t inner;  // product of the dims after `dim`
};

AlongDim along_dim(const Attrs& attrs, const Shape& shape, const std::string& op) {
  if (shape.empty()) fail(op + ": needs a tensor of rank 1 or more");
  AlongDim a{static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(shape), (op + " dim").c_str())), 1, 1};
  for (size_t d = 0; d < a.dim; ++d) a.outer *= shape[d];
  for (size_t d = a.dim + 1; d < shape.size(); ++d) a.inner *= shape[d];
  return a;
}

void check_index_vector(const TensorMeta& index, const std::string& op) {
  check_index_dtype(index, op);
  if (index.shape.size() > 1) fail(op + ": index must be 0-D or 1-D, got shape " + shape_string(index.shape));
}

// Copies `inner` contiguous elements.
void copy_run(const Tensor& from, int64_t from_start, Tensor& to, int64_t to_start, int64_t inner) {
  const size_t element = dtype_size(to.dtype());
  std::memcpy(to.mutable_bytes() + static_cast<size_t>(to_start) * element,
              from.bytes() + static_cast<size_t>(from_start) * element, static_cast<size_t>(inner) * element);
}

std::vector<TensorMeta> infer_index_select(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const AlongDim a = along_dim(attrs, inputs[0].shape, "index_select");
  check_index_vector(inputs[1], "index_select");
  Shape out = inputs[0].shape;
  out[a.dim] = shape_numel(inputs[1].shape);
  return {TensorMeta{out, inputs[0].dtype}};
}

std::vector<Tensor> index_select_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                           std::span<const TensorMeta> outputs) {
  const Tensor& self = inputs[0];
  const AlongDim a = along_dim(attrs, self.shape(), "index_select");
  const int64_t size = self.shape()[a.dim];
  const int64_t count = inputs[1].numel();
  Tensor out(self.dtype(), outputs[0].shape);
  for (int64_t l = 0; l < count; ++l) {
    const int64_t row = checked_index(inputs[1].data<int64_t>()[l], size, "index_select");
    for (int64_t o = 0; o < a.outer; ++o)
      copy_run(self, (o * size + row) * a.inner, out, (o * count + l) * a.inner, a.inner);
  }
  return {out};
}

// index_copy: inputs are self, index, source; the result is a copy of self with source rows written at index.
std::vector<TensorMeta> infer_index_copy(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const Shape& self = inputs[0].shape;
  const AlongDim a = along_dim(attrs, self, "index_copy");
  check_index_vector(inputs[1], "index_copy");
  Shape expected = self;
  expected[a.dim] = shape_numel(inputs[1].shape);
  if (inputs[2].shape != expected)
    fail("index_copy: source of shape " + shape_string(inputs[2].shape) + " does not match " + shape_string(expected) +
         " (self " + shape_string(self) + " with dimension " + std::to_string(a.dim) + " sized by the index)");
  return {inputs[0]};
}

std::vector<Tensor> index_copy_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                         std::span<const TensorMeta>) {
  Tensor out = inputs[0].clone();
  const AlongDim a = along_dim(attrs, out.shape(), "index_copy");
  const Tensor source = inputs[2].to(out.dtype());
  const int64_t size = out.shape()[a.dim];
  const int64_t count = inputs[1].numel();
  for (int64_t l = 0; l < count; ++l) {
    const int64_t row = checked_index(inputs[1].data<int64_t>()[l], size, "index_copy");
    for (int64_t o = 0; o < a.outer; ++o)
      copy_run(source, (o * count + l) * a.inner, out, (o * size + row) * a.inner, a.inner);
  }
  return {out};
}

// ---------------------------------------------------------------------------------------------------------------
// gather / scatter: an index tensor of the same rank as self, indexing along `dim` element by element.

size_t elementwise_index_dim(const Attrs& attrs, const Shape& self, const TensorMeta& index, const std::string& op) {
  check_index_dtype(index, op);
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(self), (op + " dim").c_str()));
  if (index.shape.size() != self.size())
    fail(op + ": index of shape " + shape_string(index.shape) + " must have the rank of self " + shape_string(self));
  for (size_t d = 0; d < self.size(); ++d) {
    if (d != dim && index.shape[d] > self[d])
      fail(op + ": index of shape " + shape_string(index.shape) + " is larger than self " + shape_string(self) +
           " in dimension " + std::to_string(d));
  }
  return dim;
}

std::vector<TensorMeta> infer_gather(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  elementwise_index_dim(attrs, inputs[0].shape, inputs[1], "gather");
  return {TensorMeta{inputs[1].shape, inputs[0].dtype}};
}

// Visits every element of `index`: fn(position in index, self offset it addresses).
template <typename Fn>
void for_each_addressed(const Tensor& index, const Shape& self, size_t dim, const std::string& op, Fn fn) {
  if (index.numel() == 0) return;
  const Shape self_strides = contiguous_strides(self);
  std::vector<int64_t> position(index.shape().size(), 0);
  int64_t i = 0;
  do {
    int64_t offset = 0;
    for (size_t d = 0; d < position.size(); ++d) {
      const int64_t coordinate = d == dim ? checked_index(index.data<int64_t>()[i], self[d], op) : position[d];
      offset += coordinate * self_strides[d];
    }
    fn(position, i++, offset);
  } while (next_position(position, index.shape()));
}

std::vector<Tensor> gather_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
  const Shape& self = inputs[0].shape();
  const size_t dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(self)));
  Tensor out(inputs[0].dtype(), outputs[0].shape);
  for_each_addressed(inputs[1], self, dim, "gather", [&](const std::vector<int64_t>&, int64_t i, int64_t offset) {
    copy_element(inputs[0], offset, out, i);
  });
  return {out};
}

// scatter.src / scatter_add: inputs self, index, src. scatter.value: self, index and the `value` attribute.
std::vector<TensorMeta> infer_scatter(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const std::string op = "scatter";
  elementwise_index_dim(attrs, inputs[0].shape, inputs[1], op);
  if (inputs.size() == 3) {
    const Shape& src = inputs[2].shape;
    bool fits = src.size() == inputs[1].shape.size();
    for (size_t d = 0; fits && d < src.size(); ++d) fits = inputs[1].shape[d] <= src[d];
    if (!fits)
      fail(op + ": src of shape " + shape_string(src) + " is smaller than index " + shape_string(inputs[1].shape));
  } else if (attrs.is_none("value")) {
    fail(op + ": needs a src tensor or a 'value' attribute");
  }
  return {inputs[0]};
}

template <bool Accumulate>
std::vector<Tensor> scatter_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  Tensor out = inputs[0].clone();
  Tensor src;
  if (inputs.size() == 3) {
    src = inputs[2].to(out.dtype());
  } else {
    src = Tensor(out.dtype(), {});
    if (src.dtype() == DType::Int64 && attrs.is_integer("value"))
      src.mutable_data<int64_t>()[0] = attrs.get_int("value");
    else
      write_element(src, 0, attrs.get_float("value"));
  }
  const Shape src_strides = src.rank() == 0 ? Shape(inputs[1].shape().size(), 0) : contiguous_strides(src.shape());
  const size_t dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), out.rank()));
  for_each_addressed(inputs[1], out.shape(), dim, "scatter",
                     [&](const std::vector<int64_t>& position, int64_t, int64_t offset) {
                       const int64_t from = dot(position, src_strides);
                       if (Accumulate)
                         add_element(src, from, out, offset);
                       else
                         copy_element(src, from, out, offset);
                     });
  return {out};
}

AtenSpelling aten(std::string op_type) { return {std::move(op_type), {}, {}}; }

AttrSpec dim_attr() { return {"dim", AttrType::Int, std::nullopt, true}; }

}  // namespace

void register_index_ops(OpRegistry& r) {
  // `_tensor_list_none_masks` (no AttrSpec: no AttrType holds a bool list) flags the None slots of the one index
  // list, as a flat bool list: the reader flattens torch_ir's one-list nesting [[...]].
  r.add(checked_op<infer_index, index_reference>("index",
                                                 {aten("aten.index.Tensor"), aten("aten._unsafe_index.Tensor")},
                                                 {optional("_tensor_list_sizes", AttrType::Ints)}, 2, -1));
  r.add(checked_op<infer_index_put, index_put_reference>(
      "index_put",
      {aten("aten.index_put.default"), aten("aten.index_put_.default"), aten("aten._unsafe_index_put.default")},
      {with_default("accumulate", AttrType::Bool, false), optional("_tensor_list_sizes", AttrType::Ints)}, 3, -1));
  r.add(checked_op<infer_index_select, index_select_reference>("index_select", {aten("aten.index_select.default")},
                                                               {dim_attr()}, 2, 2));
  r.add(checked_op<infer_index_copy, index_copy_reference>(
      "index_copy", {aten("aten.index_copy.default"), aten("aten.index_copy_.default")},
      {with_default("dim", AttrType::Int, int64_t{0})}, 3, 3));
  r.add(checked_op<infer_gather, gather_reference>(
      "gather", {aten("aten.gather.default")}, {dim_attr(), with_default("sparse_grad", AttrType::Bool, false)}, 2, 2));
  r.add(checked_op<infer_scatter, scatter_reference<false>>(
      "scatter",
      {aten("aten.scatter.src"), aten("aten.scatter.value"), aten("aten.scatter_.src"), aten("aten.scatter_.value")},
      {dim_attr(), optional("value", AttrType::Scalar)}, 2, 3));
  r.add(checked_op<infer_scatter, scatter_reference<true>>(
      "scatter_add", {aten("aten.scatter_add.default"), aten("aten.scatter_add_.default")}, {dim_attr()}, 3, 3));
}

}  // namespace npusim
