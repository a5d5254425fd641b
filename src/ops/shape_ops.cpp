// Shape ops: views and copies that move elements without computing on them (reshape, permute, expand, slice,
// cat, split, ...). References copy elements by byte size, so they work for every dtype.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "ops/op_util.h"

namespace npusim {

namespace {

using namespace ops;

constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr int64_t kMaxOutputs = int64_t{1} << 16;

int64_t rank_of(const Shape& shape) { return static_cast<int64_t>(shape.size()); }

std::vector<TensorMeta> one_output(Shape shape, DType dtype) { return {TensorMeta{std::move(shape), dtype}}; }

void check_size_limit(const Shape& shape, const std::string& op) {
  if (shape_numel(shape) > kMaxElements)
    fail(op + ": result shape " + shape_string(shape) + " has more than 2^40 elements");
}

// ---------------------------------------------------------------------------------------------------------------
// Strided views: every shape op is a view (shape, strides, offset) of its input, materialized by one copy loop.

struct StridedView {
  Shape shape;
  std::vector<int64_t> strides;  // in elements; 0 repeats an element, negative walks backwards
  int64_t offset = 0;
};

StridedView contiguous_view(const Shape& shape) { return {shape, contiguous_strides(shape), 0}; }

StridedView sliced(StridedView view, size_t dim, int64_t start, int64_t length, int64_t step = 1) {
  view.offset += start * view.strides[dim];
  view.shape[dim] = length;
  view.strides[dim] *= step;
  return view;
}

StridedView selected(StridedView view, size_t dim, int64_t index) {
  view.offset += index * view.strides[dim];
  view.shape.erase(view.shape.begin() + static_cast<std::ptrdiff_t>(dim));
  view.strides.erase(view.strides.begin() + static_cast<std::ptrdiff_t>(dim));
  return view;
}

Tensor materialize(const Tensor& source, const StridedView& view) {
  Tensor out(source.dtype(), view.shape);
  const int64_t count = out.numel();
  if (count == 0) return out;
  const size_t element = dtype_size(source.dtype());
  const std::byte* from = source.bytes();
  std::byte* to = out.mutable_bytes();
  const size_t rank = view.shape.size();
  std::vector<int64_t> index(rank, 0);
  int64_t position = view.offset;
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(to + static_cast<size_t>(i) * element, from + static_cast<size_t>(position) * element, element);
    for (size_t d = rank; d-- > 0;) {
      position += view.strides[d];
      if (++index[d] < view.shape[d]) break;
      position -= view.strides[d] * view.shape[d];
      index[d] = 0;
    }
  }
  return out;
}

// Copies `part` (same rank as `out`) into `out` at `offset` along `dim`.
void copy_into(const Tensor& part, Tensor& out, size_t dim, int64_t offset) {
  const Tensor converted = part.to(out.dtype());
  const size_t element = dtype_size(out.dtype());
  const Shape& shape = out.shape();
  int64_t outer = 1;
  for (size_t d = 0; d < dim; ++d) outer *= shape[d];
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t block = converted.shape()[dim] * inner;
  if (block == 0) return;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.mutable_bytes() + static_cast<size_t>((o * shape[dim] + offset) * inner) * element,
                converted.bytes() + static_cast<size_t>(o * block) * element, static_cast<size_t>(block) * element);
  }
}

std::vector<Tensor> reshape_reference(const Attrs&, std::span<const Tensor> inputs,
                                      std::span<const TensorMeta> outputs) {
  return {inputs[0].reshaped(outputs[0].shape)};
}

// ---------------------------------------------------------------------------------------------------------------
// reshape / flatten / unflatten / squeeze / unsqueeze

// Resolves one -1 in a requested shape against the element count.
Shape resolve_shape(const std::vector<int64_t>& requested, int64_t numel, const std::string& op) {
  Shape shape = requested;
  std::optional<size_t> inferred;
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (inferred) fail(op + ": only one dimension can be -1 in " + shape_string(requested));
      inferred = i;
    } else if (shape[i] < 0) {
      fail(op + ": invalid dimension " + std::to_string(shape[i]) + " in " + shape_string(requested));
    } else if (shape[i] == 0) {
      has_zero = true;
    }
  }
  int64_t known = 1;
  if (has_zero) {
    known = 0;
  } else {
    for (int64_t d : shape) {
      if (d == -1) continue;
      if (known > std::numeric_limits<int64_t>::max() / d)
        fail(op + ": shape " + shape_string(requested) + " overflows");
      known *= d;
    }
  }
  if (inferred) {
    if (known == 0)
      fail(op + ": cannot infer the -1 in " + shape_string(requested) + " for " + std::to_string(numel) +
           " elements (it could be any value)");
    if (numel % known != 0)
      fail(op + ": shape " + shape_string(requested) + " is invalid for " + std::to_string(numel) + " elements");
    shape[*inferred] = numel / known;
  } else if (known != numel) {
    fail(op + ": shape " + shape_string(requested) + " is invalid for " + std::to_string(numel) + " elements");
  }
  return shape;
}

std::vector<TensorMeta> infer_reshape(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const TensorMeta& self = inputs[0];
  if (inputs.size() == 2) {  // view_as / reshape_as
    if (shape_numel(inputs[1].shape) != shape_numel(self.shape))
      fail("reshape: cannot view " + shape_string(self.shape) + " as " + shape_string(inputs[1].shape));
    return one_output(inputs[1].shape, self.dtype);
  }
  if (attrs.is_none("shape")) fail("reshape: missing attribute 'shape'");
  return one_output(resolve_shape(attrs.get_ints("shape"), shape_numel(self.shape), "reshape"), self.dtype);
}

std::vector<TensorMeta> infer_flatten(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const Shape& in = inputs[0].shape;
  if (in.empty()) return one_output({1}, inputs[0].dtype);
  const int64_t start = normalize_dim(attrs.get_int("start_dim"), rank_of(in), "flatten start_dim");
  const int64_t end = normalize_dim(attrs.get_int("end_dim"), rank_of(in), "flatten end_dim");
  if (start > end) fail("flatten: start_dim " + std::to_string(start) + " comes after end_dim " + std::to_string(end));
  Shape out(in.begin(), in.begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= in[static_cast<size_t>(d)];
  out.push_back(merged);
  out.insert(out.end(), in.begin() + end + 1, in.end());
  return one_output(out, inputs[0].dtype);
}

std::vector<TensorMeta> infer_unflatten(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const Shape& in = inputs[0].shape;
  if (in.empty()) fail("unflatten: cannot unflatten a 0-dim tensor");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in)));
  const std::vector<int64_t> sizes = attrs.get_ints("sizes");
  if (sizes.empty()) fail("unflatten: sizes must not be empty");
  const Shape middle = resolve_shape(sizes, in[dim], "unflatten");
  Shape out(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(dim));
  out.insert(out.end(), middle.begin(), middle.end());
  out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(dim) + 1, in.end());
  return one_output(out, inputs[0].dtype);
}

std::vector<TensorMeta> infer_squeeze(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const Shape& in = inputs[0].shape;
  std::set<int64_t> dims;
  if (attrs.is_none("dim")) {
    for (int64_t d = 0; d < rank_of(in); ++d) dims.insert(d);
  } else {
    for (int64_t d : attrs.get_ints("dim")) dims.insert(normalize_dim(d, rank_of(in), "squeeze dim"));
  }
  Shape out;
  for (int64_t d = 0; d < rank_of(in); ++d) {
    if (!(dims.count(d) && in[static_cast<size_t>(d)] == 1)) out.push_back(in[static_cast<size_t>(d)]);
  }
  return one_output(out, inputs[0].dtype);
}

std::vector<TensorMeta> infer_unsqueeze(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  Shape out = inputs[0].shape;
  const int64_t dim = normalize_dim(attrs.get_int("dim"), rank_of(out) + 1, "unsqueeze dim");
  out.insert(out.begin() + dim, 1);
  return one_output(out, inputs[0].dtype);
}

// ---------------------------------------------------------------------------------------------------------------
// permute / transpose

std::vector<int64_t> permutation(const Attrs& attrs, int64_t rank) {
  const std::vector<int64_t> dims = attrs.get_ints("dims");
  if (rank_of(dims) != rank)
    fail("permute: dims " + shape_string(dims) + " must list all " + std::to_string(rank) + " dimensions");
  std::vector<int64_t> order;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t d : dims) {
    const int64_t dim = normalize_dim(d, rank, "permute dim");
    if (seen[static_cast<size_t>(dim)]) fail("permute: dims " + shape_string(dims) + " repeat a dimension");
    seen[static_cast<size_t>(dim)] = true;
    order.push_back(dim);
  }
  return order;
}

std::vector<int64_t> transposition(const Attrs& attrs, int64_t rank) {
  std::vector<int64_t> order(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) order[static_cast<size_t>(d)] = d;
  const int64_t dim0 = normalize_dim(attrs.get_int("dim0"), rank, "transpose dim0");
  const int64_t dim1 = normalize_dim(attrs.get_int("dim1"), rank, "transpose dim1");
  if (rank > 0) std::swap(order[static_cast<size_t>(dim0)], order[static_cast<size_t>(dim1)]);
  return order;
}

StridedView permuted(const Shape& shape, const std::vector<int64_t>& order) {
  const StridedView base = contiguous_view(shape);
  StridedView view;
  for (int64_t d : order) {
    view.shape.push_back(base.shape[static_cast<size_t>(d)]);
    view.strides.push_back(base.strides[static_cast<size_t>(d)]);
  }
  return view;
}

template <auto Order>
std::vector<TensorMeta> infer_reorder(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  return one_output(permuted(inputs[0].shape, Order(attrs, rank_of(inputs[0].shape))).shape, inputs[0].dtype);
}

template <auto Order>
std::vector<Tensor> reorder_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  return {materialize(inputs[0], permuted(inputs[0].shape(), Order(attrs, inputs[0].rank())))};
}

// ---------------------------------------------------------------------------------------------------------------
// expand / repeat

Shape expanded_shape(const Shape& in, const std::vector<int64_t>& size) {
  if (size.size() < in.size())
    fail("expand: size " + shape_string(size) + " has fewer dimensions than the input " + shape_string(in));
  const size_t lead = size.size() - in.size();
  Shape out(size.size());
  for (size_t i = 0; i < size.size(); ++i) {
    if (i < lead) {
      if (size[i] < 0)
        fail("expand: new leading dimension " + std::to_string(i) + " cannot be " + std::to_string(size[i]));
      out[i] = size[i];
      continue;
    }
    const int64_t current = in[i - lead];
    if (size[i] == -1) {
      out[i] = current;
    } else if (size[i] < 0 || (current != 1 && current != size[i])) {
      fail("expand: cannot expand " + shape_string(in) + " to " + shape_string(size) + " (dimension " +
           std::to_string(i) + ")");
    } else {
      out[i] = size[i];
    }
  }
  check_size_limit(out, "expand");
  return out;
}

std::vector<TensorMeta> infer_expand(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  if (inputs.size() == 2) return one_output(expanded_shape(inputs[0].shape, inputs[1].shape), inputs[0].dtype);
  if (attrs.is_none("size")) fail("expand: missing attribute 'size'");
  return one_output(expanded_shape(inputs[0].shape, attrs.get_ints("size")), inputs[0].dtype);
}

std::vector<Tensor> expand_reference(const Attrs&, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
  const Shape& out = outputs[0].shape;
  return {materialize(inputs[0], {out, broadcast_strides(inputs[0].shape(), out), 0})};
}

// Input shape left-padded with ones to the length of `repeats`.
Shape repeat_padded_input(const Shape& in, const std::vector<int64_t>& repeats) {
  if (repeats.size() < in.size())
    fail("repeat: " + std::to_string(repeats.size()) + " repeats given for a tensor of rank " +
         std::to_string(in.size()));
  for (int64_t r : repeats) {
    if (r < 0) fail("repeat: repeats " + shape_string(repeats) + " must not be negative");
  }
  Shape padded(repeats.size() - in.size(), 1);
  padded.insert(padded.end(), in.begin(), in.end());
  return padded;
}

std::vector<TensorMeta> infer_repeat(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const std::vector<int64_t> repeats = attrs.get_ints("repeats");
  const Shape padded = repeat_padded_input(inputs[0].shape, repeats);
  Shape out(padded.size());
  for (size_t i = 0; i < padded.size(); ++i) {
    if (repeats[i] != 0 && padded[i] > kMaxElements / repeats[i]) fail("repeat: result is too large");
    out[i] = padded[i] * repeats[i];
  }
  check_size_limit(out, "repeat");
  return one_output(out, inputs[0].dtype);
}

// Repeating is a view with shape [r0, s0, r1, s1, ...] where each r walks with stride 0.
std::vector<Tensor> repeat_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
  const std::vector<int64_t> repeats = attrs.get_ints("repeats");
  const Shape padded = repeat_padded_input(inputs[0].shape(), repeats);
  const Shape strides = contiguous_strides(padded);
  StridedView view;
  for (size_t i = 0; i < padded.size(); ++i) {
    view.shape.insert(view.shape.end(), {repeats[i], padded[i]});
    view.strides.insert(view.strides.end(), {0, strides[i]});
  }
  return {materialize(inputs[0], view).reshaped(outputs[0].shape)};
}

// ---------------------------------------------------------------------------------------------------------------
// slice / select / narrow

struct SliceRange {
  size_t dim;
  int64_t start;
  int64_t length;
  int64_t step;
};

// PyTorch's clamping: negative bounds wrap once, then both clamp to [0, size]; an empty range is not an error.
SliceRange slice_range(const Attrs& attrs, const Shape& in) {
  if (in.empty()) fail("slice: cannot slice a 0-dim tensor");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in), "slice dim"));
  const int64_t step = attrs.get_int("step");
  if (step < 1) fail("slice: step must be positive, got " + std::to_string(step));
  const int64_t size = in[dim];
  int64_t start = attrs.get_int("start", 0);
  int64_t end = attrs.get_int("end", std::numeric_limits<int64_t>::max());
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  return {dim, start, end == start ? 0 : (end - start - 1) / step + 1, step};
}

std::vector<TensorMeta> infer_slice(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const SliceRange range = slice_range(attrs, inputs[0].shape);
  Shape out = inputs[0].shape;
  out[range.dim] = range.length;
  return one_output(out, inputs[0].dtype);
}

std::vector<Tensor> slice_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  const SliceRange r = slice_range(attrs, inputs[0].shape());
  return {materialize(inputs[0], sliced(contiguous_view(inputs[0].shape()), r.dim, r.start, r.length, r.step))};
}

std::pair<size_t, int64_t> select_position(const Attrs& attrs, const Shape& in) {
  if (in.empty()) fail("select: cannot select from a 0-dim tensor");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in), "select dim"));
  const int64_t index = attrs.get_int("index");
  if (index < -in[dim] || index >= in[dim])
    fail("select: index " + std::to_string(index) + " is out of range for dimension " + std::to_string(dim) +
         " of size " + std::to_string(in[dim]));
  return {dim, index < 0 ? index + in[dim] : index};
}

std::vector<TensorMeta> infer_select(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const auto [dim, index] = select_position(attrs, inputs[0].shape);
  Shape out = inputs[0].shape;
  out.erase(out.begin() + static_cast<std::ptrdiff_t>(dim));
  return one_output(out, inputs[0].dtype);
}

std::vector<Tensor> select_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  const auto [dim, index] = select_position(attrs, inputs[0].shape());
  return {materialize(inputs[0], selected(contiguous_view(inputs[0].shape()), dim, index))};
}

SliceRange narrow_range(const Attrs& attrs, const Shape& in) {
  if (in.empty()) fail("narrow: cannot narrow a 0-dim tensor");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in), "narrow dim"));
  int64_t start = attrs.get_int("start");
  const int64_t length = attrs.get_int("length");
  if (start < 0) start += in[dim];
  if (start < 0 || start > in[dim])
    fail("narrow: start " + std::to_string(attrs.get_int("start")) + " is out of range for size " +
         std::to_string(in[dim]));
  if (length < 0 || length > in[dim] - start)
    fail("narrow: start " + std::to_string(start) + " + length " + std::to_string(length) + " exceeds size " +
         std::to_string(in[dim]));
  return {dim, start, length, 1};
}

std::vector<TensorMeta> infer_narrow(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const SliceRange range = narrow_range(attrs, inputs[0].shape);
  Shape out = inputs[0].shape;
  out[range.dim] = range.length;
  return one_output(out, inputs[0].dtype);
}

std::vector<Tensor> narrow_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  const SliceRange r = narrow_range(attrs, inputs[0].shape());
  return {materialize(inputs[0], sliced(contiguous_view(inputs[0].shape()), r.dim, r.start, r.length))};
}

// ---------------------------------------------------------------------------------------------------------------
// cat / stack

void check_list_sizes(const Attrs& attrs, size_t count, const char* op) {
  if (attrs.is_none("_tensor_list_sizes")) return;
  const std::vector<int64_t> sizes = attrs.get_ints("_tensor_list_sizes");
  if (sizes.size() != 1 || sizes[0] != static_cast<int64_t>(count))
    fail(std::string(op) + ": _tensor_list_sizes " + shape_string(sizes) + " does not match " + std::to_string(count) +
         " inputs");
}

DType promoted_dtype(std::span<const TensorMeta> inputs) {
  DType dtype = inputs[0].dtype;
  for (const TensorMeta& meta : inputs) dtype = promote_types(dtype, meta.dtype);
  return dtype;
}

// PyTorch still accepts 1-D empty tensors in cat whatever the other shapes are, and skips them.
bool skipped_by_cat(const Shape& shape) { return shape.size() == 1 && shape[0] == 0; }

std::vector<TensorMeta> infer_cat(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  check_list_sizes(attrs, inputs.size(), "cat");
  const DType dtype = promoted_dtype(inputs);
  const auto first =
      std::find_if(inputs.begin(), inputs.end(), [](const TensorMeta& m) { return !skipped_by_cat(m.shape); });
  if (first == inputs.end()) return one_output({0}, dtype);
  Shape out = first->shape;
  if (out.empty()) fail("cat: zero-dimensional tensors cannot be concatenated");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(out), "cat dim"));
  out[dim] = 0;
  for (const TensorMeta& meta : inputs) {
    if (skipped_by_cat(meta.shape)) continue;
    bool compatible = meta.shape.size() == out.size();
    for (size_t d = 0; compatible && d < out.size(); ++d) compatible = d == dim || meta.shape[d] == out[d];
    if (!compatible)
      fail("cat: shape " + shape_string(meta.shape) + " does not match " + shape_string(first->shape) +
           " outside dimension " + std::to_string(dim));
    out[dim] += meta.shape[dim];
  }
  return one_output(out, dtype);
}

std::vector<Tensor> cat_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                  std::span<const TensorMeta> outputs) {
  Tensor out = make_output(outputs[0]);
  if (out.numel() == 0) return {out};
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), out.rank()));
  int64_t offset = 0;
  for (const Tensor& part : inputs) {
    if (skipped_by_cat(part.shape())) continue;
    copy_into(part, out, dim, offset);
    offset += part.shape()[dim];
  }
  return {out};
}

std::vector<TensorMeta> infer_stack(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  check_list_sizes(attrs, inputs.size(), "stack");
  for (const TensorMeta& meta : inputs) {
    if (meta.shape != inputs[0].shape)
      fail("stack: shape " + shape_string(meta.shape) + " differs from " + shape_string(inputs[0].shape));
  }
  Shape out = inputs[0].shape;
  const int64_t dim = normalize_dim(attrs.get_int("dim"), rank_of(out) + 1, "stack dim");
  out.insert(out.begin() + dim, static_cast<int64_t>(inputs.size()));
  return one_output(out, promoted_dtype(inputs));
}

std::vector<Tensor> stack_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                    std::span<const TensorMeta> outputs) {
  Tensor out = make_output(outputs[0]);
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), out.rank()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    Shape unsqueezed = inputs[i].shape();
    unsqueezed.insert(unsqueezed.begin() + static_cast<std::ptrdiff_t>(dim), 1);
    copy_into(inputs[i].reshaped(unsqueezed), out, dim, static_cast<int64_t>(i));
  }
  return {out};
}

// ---------------------------------------------------------------------------------------------------------------
// split / chunk / unbind

struct SplitPlan {
  size_t dim;
  std::vector<int64_t> lengths;
};

SplitPlan split_plan(const Attrs& attrs, const Shape& in) {
  if (in.empty()) fail("split: cannot split a 0-dim tensor");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in), "split dim"));
  const int64_t size = in[dim];
  if (!attrs.is_none("split_sizes")) {
    const std::vector<int64_t> lengths = attrs.get_ints("split_sizes");
    int64_t total = 0;
    for (int64_t length : lengths) {
      if (length < 0) fail("split: split_sizes " + shape_string(lengths) + " must not be negative");
      total += length;
    }
    if (total != size)
      fail("split: split_sizes " + shape_string(lengths) + " do not add up to the dimension size " +
           std::to_string(size));
    return {dim, lengths};
  }
  if (attrs.is_none("split_size")) fail("split: needs attribute 'split_size' or 'split_sizes'");
  const int64_t split_size = attrs.get_int("split_size");
  if (split_size < 0 || (split_size == 0 && size != 0))
    fail("split: split_size " + std::to_string(split_size) + " is invalid for dimension size " + std::to_string(size));
  std::vector<int64_t> lengths;
  for (int64_t start = 0; start < size; start += split_size) lengths.push_back(std::min(split_size, size - start));
  if (lengths.empty()) lengths.push_back(0);
  return {dim, lengths};
}

SplitPlan chunk_plan(const Attrs& attrs, const Shape& in) {
  if (in.empty()) fail("chunk: cannot chunk a 0-dim tensor");
  const auto dim = static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in), "chunk dim"));
  const int64_t chunks = attrs.get_int("chunks");
  if (chunks <= 0) fail("chunk: chunks must be positive, got " + std::to_string(chunks));
  const int64_t size = in[dim];
  if (size == 0) {
    if (chunks > kMaxOutputs) fail("chunk: " + std::to_string(chunks) + " chunks is too many");
    return {dim, std::vector<int64_t>(static_cast<size_t>(chunks), 0)};
  }
  const int64_t chunk = (size + chunks - 1) / chunks;
  std::vector<int64_t> lengths;
  for (int64_t start = 0; start < size; start += chunk) lengths.push_back(std::min(chunk, size - start));
  return {dim, lengths};
}

template <auto Plan>
std::vector<TensorMeta> infer_split(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const SplitPlan plan = Plan(attrs, inputs[0].shape);
  std::vector<TensorMeta> outputs;
  for (int64_t length : plan.lengths) {
    TensorMeta meta = inputs[0];
    meta.shape[plan.dim] = length;
    outputs.push_back(meta);
  }
  return outputs;
}

template <auto Plan>
std::vector<Tensor> split_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  const SplitPlan plan = Plan(attrs, inputs[0].shape());
  const StridedView whole = contiguous_view(inputs[0].shape());
  std::vector<Tensor> outputs;
  int64_t start = 0;
  for (int64_t length : plan.lengths) {
    outputs.push_back(materialize(inputs[0], sliced(whole, plan.dim, start, length)));
    start += length;
  }
  return outputs;
}

size_t unbind_dim(const Attrs& attrs, const Shape& in) {
  if (in.empty()) fail("unbind: cannot unbind a 0-dim tensor");
  return static_cast<size_t>(normalize_dim(attrs.get_int("dim"), rank_of(in), "unbind dim"));
}

std::vector<TensorMeta> infer_unbind(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const size_t dim = unbind_dim(attrs, inputs[0].shape);
  Shape part = inputs[0].shape;
  part.erase(part.begin() + static_cast<std::ptrdiff_t>(dim));
  return std::vector<TensorMeta>(static_cast<size_t>(inputs[0].shape[dim]), TensorMeta{part, inputs[0].dtype});
}

std::vector<Tensor> unbind_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  const size_t dim = unbind_dim(attrs, inputs[0].shape());
  const StridedView whole = contiguous_view(inputs[0].shape());
  std::vector<Tensor> outputs;
  for (int64_t i = 0; i < inputs[0].shape()[dim]; ++i)
    outputs.push_back(materialize(inputs[0], selected(whole, dim, i)));
  return outputs;
}

// ---------------------------------------------------------------------------------------------------------------
// flip / roll

std::vector<size_t> distinct_dims(const std::vector<int64_t>& dims, int64_t rank, const char* op) {
  std::vector<size_t> result;
  for (int64_t d : dims) {
    const auto dim = static_cast<size_t>(normalize_dim(d, rank, op));
    if (std::find(result.begin(), result.end(), dim) != result.end())
      fail(std::string(op) + ": dims " + shape_string(dims) + " repeat a dimension");
    result.push_back(dim);
  }
  return result;
}

std::vector<TensorMeta> infer_flip(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  distinct_dims(attrs.get_ints("dims"), rank_of(inputs[0].shape), "flip dim");
  return {inputs[0]};
}

std::vector<Tensor> flip_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  StridedView view = contiguous_view(inputs[0].shape());
  for (size_t dim : distinct_dims(attrs.get_ints("dims"), inputs[0].rank(), "flip dim")) {
    if (inputs[0].rank() == 0) break;
    view.offset += (view.shape[dim] - 1) * view.strides[dim];
    view.strides[dim] = -view.strides[dim];
  }
  return {materialize(inputs[0], view)};
}

std::vector<std::pair<size_t, int64_t>> roll_plan(const Attrs& attrs, const Shape& in) {
  const std::vector<int64_t> shifts = attrs.get_ints("shifts");
  const std::vector<int64_t> dims = attrs.get_ints("dims");
  if (dims.empty()) {
    if (shifts.size() != 1) fail("roll: without dims, shifts must hold one value, got " + shape_string(shifts));
    return {{0, shifts[0]}};  // on the flattened tensor
  }
  if (shifts.size() != dims.size())
    fail("roll: shifts " + shape_string(shifts) + " and dims " + shape_string(dims) + " differ in length");
  if (in.empty()) fail("roll: cannot roll a 0-dim tensor along a dimension");
  std::vector<std::pair<size_t, int64_t>> plan;
  for (size_t i = 0; i < dims.size(); ++i)
    plan.emplace_back(static_cast<size_t>(normalize_dim(dims[i], rank_of(in), "roll dim")), shifts[i]);
  return plan;
}

std::vector<TensorMeta> infer_roll(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  roll_plan(attrs, inputs[0].shape);
  return {inputs[0]};
}

// Rolling one dimension by s moves its last s entries to the front.
Tensor roll_one(const Tensor& in, size_t dim, int64_t shift) {
  const int64_t size = in.shape()[dim];
  if (size == 0) return in;
  const int64_t s = ((shift % size) + size) % size;
  Tensor out(in.dtype(), in.shape());
  const StridedView whole = contiguous_view(in.shape());
  copy_into(materialize(in, sliced(whole, dim, size - s, s)), out, dim, 0);
  copy_into(materialize(in, sliced(whole, dim, 0, size - s)), out, dim, s);
  return out;
}

std::vector<Tensor> roll_reference(const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
  const bool flattened = attrs.get_ints("dims").empty();
  Tensor result = flattened ? inputs[0].reshaped({inputs[0].numel()}) : inputs[0];
  for (const auto& [dim, shift] : roll_plan(attrs, result.shape())) result = roll_one(result, dim, shift);
  return {result.reshaped(inputs[0].shape())};
}

// ---------------------------------------------------------------------------------------------------------------

template <auto Infer, auto Compute>
OpDef unary_shape_op(std::string name, std::vector<AtenSpelling> spellings, std::vector<AttrSpec> attrs) {
  return checked_op<Infer, Compute>(std::move(name), std::move(spellings), std::move(attrs), 1, 1);
}

AtenSpelling aten(std::string op_type, std::map<std::string, std::string> rename = {}) {
  return {std::move(op_type), std::move(rename), {}};
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  // view_as / reshape_as take the target shape from a second input.
  r.add(checked_op<infer_reshape, reshape_reference>(
      "reshape",
      {aten("aten.view.default", {{"size", "shape"}}), aten("aten.reshape.default"),
       aten("aten._unsafe_view.default", {{"size", "shape"}}), aten("aten.view_as.default"),
       aten("aten.reshape_as.default")},
      {optional("shape", AttrType::Ints)}, 1, 2));
  r.add(unary_shape_op<infer_flatten, reshape_reference>(
      "flatten", {aten("aten.flatten.using_ints")},
      {with_default("start_dim", AttrType::Int, int64_t{0}), with_default("end_dim", AttrType::Int, int64_t{-1})}));
  r.add(unary_shape_op<infer_unflatten, reshape_reference>(
      "unflatten", {aten("aten.unflatten.int")}, {required("dim", AttrType::Int), required("sizes", AttrType::Ints)}));
  // No `dim` squeezes every size-1 dimension.
  r.add(unary_shape_op<infer_squeeze, reshape_reference>(
      "squeeze", {aten("aten.squeeze.default"), aten("aten.squeeze.dim"), aten("aten.squeeze.dims")},
      {optional("dim", AttrType::Ints)}));
  r.add(unary_shape_op<infer_unsqueeze, reshape_reference>("unsqueeze", {aten("aten.unsqueeze.default")},
                                                           {required("dim", AttrType::Int)}));
  r.add(unary_shape_op<infer_reorder<permutation>, reorder_reference<permutation>>(
      "permute", {aten("aten.permute.default")}, {required("dims", AttrType::Ints)}));
  r.add(unary_shape_op<infer_reorder<transposition>, reorder_reference<transposition>>(
      "transpose",
      {aten("aten.transpose.int"), aten("aten.swapaxes.default", {{"axis0", "dim0"}, {"axis1", "dim1"}}),
       aten("aten.swapdims.default")},
      {required("dim0", AttrType::Int), required("dim1", AttrType::Int)}));
  // expand_as takes the target shape from a second input.
  r.add(checked_op<infer_expand, expand_reference>(
      "expand", {aten("aten.expand.default"), aten("aten.expand_as.default")},
      {optional("size", AttrType::Ints), with_default("implicit", AttrType::Bool, false)}, 1, 2));
  r.add(unary_shape_op<infer_repeat, repeat_reference>("repeat", {aten("aten.repeat.default")},
                                                       {required("repeats", AttrType::Ints)}));
  r.add(unary_shape_op<infer_slice, slice_reference>(
      "slice", {aten("aten.slice.Tensor")},
      {with_default("dim", AttrType::Int, int64_t{0}), with_default("start", AttrType::Int, int64_t{0}),
       with_default("end", AttrType::Int, std::numeric_limits<int64_t>::max()),
       with_default("step", AttrType::Int, int64_t{1})}));
  r.add(unary_shape_op<infer_select, select_reference>(
      "select", {aten("aten.select.int")}, {required("dim", AttrType::Int), required("index", AttrType::Int)}));
  r.add(unary_shape_op<infer_narrow, narrow_reference>(
      "narrow", {aten("aten.narrow.default")},
      {required("dim", AttrType::Int), required("start", AttrType::Int), required("length", AttrType::Int)}));
  r.add(checked_op<infer_cat, cat_reference>(
      "cat", {aten("aten.cat.default"), aten("aten.concat.default"), aten("aten.concatenate.default")},
      {with_default("dim", AttrType::Int, int64_t{0}), optional("_tensor_list_sizes", AttrType::Ints)}, 1, -1));
  r.add(checked_op<infer_stack, stack_reference>(
      "stack", {aten("aten.stack.default")},
      {with_default("dim", AttrType::Int, int64_t{0}), optional("_tensor_list_sizes", AttrType::Ints)}, 1, -1));
  // split.Tensor gives a chunk length, split_with_sizes the list of lengths.
  r.add(unary_shape_op<infer_split<split_plan>, split_reference<split_plan>>(
      "split",
      {aten("aten.split.Tensor"), aten("aten.unsafe_split.Tensor"), aten("aten.split_with_sizes.default"),
       aten("aten.unsafe_split_with_sizes.default"), aten("aten.split.sizes", {{"split_size", "split_sizes"}})},
      {optional("split_size", AttrType::Int), optional("split_sizes", AttrType::Ints),
       with_default("dim", AttrType::Int, int64_t{0})}));
  r.add(unary_shape_op<infer_split<chunk_plan>, split_reference<chunk_plan>>(
      "chunk", {aten("aten.chunk.default")},
      {required("chunks", AttrType::Int), with_default("dim", AttrType::Int, int64_t{0})}));
  r.add(unary_shape_op<infer_unbind, unbind_reference>("unbind", {aten("aten.unbind.int")},
                                                       {with_default("dim", AttrType::Int, int64_t{0})}));
  r.add(unary_shape_op<infer_flip, flip_reference>("flip", {aten("aten.flip.default")},
                                                   {required("dims", AttrType::Ints)}));
  r.add(unary_shape_op<infer_roll, roll_reference>(
      "roll", {aten("aten.roll.default")},
      {required("shifts", AttrType::Ints), with_default("dims", AttrType::Ints, std::vector<int64_t>{})}));
}

}  // namespace npusim
