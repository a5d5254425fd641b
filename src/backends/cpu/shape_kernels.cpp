// Shape kernels: every op that only moves elements is a strided view of its input copied into the contiguous
// output (permute, transpose, expand, repeat, slice, select, narrow, flip, split, chunk, unbind), a plain copy
// (reshape family, clone, alias, dropout, getitem) that disappears when the planner made the output a view, or a
// row copy (cat, stack, index_select, index_copy). Elements are moved by size, so every storage type works.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/avx2_transpose.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/strided_loop.h"
#include "core/cpu_features.h"
#include "ops/op_util.h"

namespace npusim::cpu {

namespace {

struct View {
  Shape shape;
  std::vector<int64_t> strides;  // elements; 0 repeats, negative walks backwards
  int64_t offset = 0;
};

View contiguous_view(const Shape& shape) { return {shape, contiguous_strides(shape), 0}; }

int64_t rank_of(const Shape& shape) { return static_cast<int64_t>(shape.size()); }

void copy_elements(const std::byte* from, int64_t stride, std::byte* to, int64_t count, size_t element) {
  if (stride == 1) {
    std::memmove(to, from, static_cast<size_t>(count) * element);
    return;
  }
  const auto step = static_cast<std::ptrdiff_t>(stride * static_cast<int64_t>(element));
  switch (element) {
    case 1:
      for (int64_t i = 0; i < count; ++i, from += step) to[i] = *from;
      return;
    case 2:
      for (int64_t i = 0; i < count; ++i, from += step) std::memcpy(to + 2 * i, from, 2);
      return;
    case 4:
      for (int64_t i = 0; i < count; ++i, from += step) std::memcpy(to + 4 * i, from, 4);
      return;
    default:
      for (int64_t i = 0; i < count; ++i, from += step)
        std::memcpy(to + element * static_cast<size_t>(i), from, element);
      return;
  }
}

Kernel nothing_to_do() {
  Kernel kernel;
  kernel.run = [] {};
  kernel.writes_nothing = true;
  return kernel;
}

// A view that is a batch of matrix transposes: out[b][r][c] = in[offset + b * batch_stride + r + c * column_stride]
// (a permute that moves the input's contiguous dim away from the last, as NCHW <-> NHWC).
struct Transposes {
  int64_t batches = 1, rows = 0, columns = 0, batch_stride = 0, column_stride = 0, offset = 0;
};

// The view as Transposes: size-1 dims dropped, neighbours that walk the input as one dim merged, then at most three
// dims left with input strides [batch, 1, column], the column stride not 1.
std::optional<Transposes> as_transposes(const View& view) {
  Shape shape;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < view.shape.size(); ++d) {
    if (view.shape[d] == 1) continue;
    if (!shape.empty() && strides.back() == view.strides[d] * view.shape[d]) {
      shape.back() *= view.shape[d];
      strides.back() = view.strides[d];
      continue;
    }
    shape.push_back(view.shape[d]);
    strides.push_back(view.strides[d]);
  }
  if (shape.size() == 2) {
    shape.insert(shape.begin(), 1);
    strides.insert(strides.begin(), 0);
  }
  if (shape.size() != 3 || strides[1] != 1 || strides[2] <= 1 || strides[0] < 0) return std::nullopt;
  return Transposes{shape[0], shape[1], shape[2], strides[0], strides[2], view.offset};
}

#if defined(__x86_64__)
// An 8 x 8 block: the 8 rows at `in` (row stride in_stride) become the 8 columns at `out` (row stride out_stride).
__attribute__((target("avx2"))) void transpose8x8(const float* in, int64_t in_stride, float* out, int64_t out_stride) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * in_stride);
  transpose8(r);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + i * out_stride, r[i]);
}
#endif

// Rows [row0, row1) of batch b of a 4-byte Transposes: 8 x 8 blocks where the CPU has AVX2, the edges one by one.
void transpose_rows(const Transposes& t, const float* in, float* out, int64_t b, int64_t row0, int64_t row1,
                    bool avx2) {
  const float* source = in + t.offset + b * t.batch_stride;
  float* target = out + b * t.rows * t.columns;
  int64_t r = row0;
#if defined(__x86_64__)
  if (avx2)
    for (; r + 8 <= row1; r += 8) {
      int64_t c = 0;
      for (; c + 8 <= t.columns; c += 8)
        transpose8x8(source + c * t.column_stride + r, t.column_stride, target + r * t.columns + c, t.columns);
      for (; c < t.columns; ++c)
        for (int64_t i = r; i < r + 8; ++i) target[i * t.columns + c] = source[c * t.column_stride + i];
    }
#endif
  (void)avx2;
  for (; r < row1; ++r)
    for (int64_t c = 0; c < t.columns; ++c) target[r * t.columns + c] = source[c * t.column_stride + r];
}

// Copies `view` of `in` into the contiguous `out` (same element type).
std::optional<Kernel> strided_copy(const KernelContext& ctx, const Buffer& in, const Buffer& out, const View& view) {
  if (in.elem != out.elem || shape_numel(view.shape) != out.numel()) return std::nullopt;
  if (const std::optional<Transposes> t = as_transposes(view); t && elem_size(in.elem) == 4 && out.numel() > 0) {
    // Pieces of 64 rows: whole 8-row blocks, enough pieces for every thread.
    constexpr int64_t kRowsPerPiece = 64;
    const int64_t pieces_per_batch = (t->rows + kRowsPerPiece - 1) / kRowsPerPiece;
    const auto* from = reinterpret_cast<const float*>(in.data);
    auto* to = reinterpret_cast<float*>(out.data);
    const bool avx2 = cpu_features().avx2;
    Kernel kernel;
    kernel.run = [t = *t, from, to, avx2, pieces_per_batch, pool = &ctx.pool] {
      const auto run = [&](int64_t begin, int64_t end, int) {
        for (int64_t piece = begin; piece < end; ++piece) {
          const int64_t b = piece / pieces_per_batch, row0 = piece % pieces_per_batch * kRowsPerPiece;
          transpose_rows(t, from, to, b, row0, std::min(t.rows, row0 + kRowsPerPiece), avx2);
        }
      };
      const int64_t pieces = t.batches * pieces_per_batch;
      if (t.batches * t.rows * t.columns < kParallelElements)
        run(0, pieces, 0);
      else
        pool->parallel_for(pieces, 1, run);
    };
    return kernel;
  }
  const std::vector<std::vector<int64_t>> strides{view.strides};
  const std::vector<int64_t> bases{view.offset};
  std::optional<StridedLoop> loop = make_loop(view.shape, strides, bases);
  if (!loop) return std::nullopt;
  const size_t element = elem_size(in.elem);
  const std::byte* from = in.data;
  std::byte* to = out.data;
  auto rows = [loop = *loop, from, to, element](int64_t begin, int64_t end, int) {
    walk(loop, begin, end, [&](int64_t position, int64_t count, const int64_t* offsets) {
      copy_elements(from + offsets[0] * static_cast<int64_t>(element), loop.inner_stride(0),
                    to + position * static_cast<int64_t>(element), count, element);
    });
  };
  ThreadPool* pool = &ctx.pool;
  const int64_t total = out.numel();
  Kernel kernel;
  kernel.run = [rows, pool, total] {
    if (total < kParallelElements)
      rows(0, total, 0);
    else
      pool->parallel_for(total, kParallelGrain, rows);
  };
  return kernel;
}

// Output `index` is input `input` with the same elements: nothing to do when the planner made it a view.
std::optional<Kernel> plain_copy(const KernelContext& ctx, size_t input = 0, size_t index = 0) {
  if (input >= ctx.inputs.size() || index >= ctx.outputs.size()) return std::nullopt;
  const Buffer& in = ctx.inputs[input];
  const Buffer& out = ctx.outputs[index];
  if (in.numel() != out.numel() || in.elem != out.elem) return std::nullopt;
  if (in.data == out.data) return nothing_to_do();
  const size_t bytes = out.bytes();
  const std::byte* from = in.data;
  std::byte* to = out.data;
  Kernel kernel;
  kernel.run = [from, to, bytes] { std::memmove(to, from, bytes); };
  kernel.shareable_inputs = {input};
  return kernel;
}

std::optional<Kernel> copy_input0(const KernelContext& ctx) { return plain_copy(ctx); }

std::optional<Kernel> getitem(const KernelContext& ctx) {
  const int64_t index = ctx.node.attrs.get_int("index");
  if (index < 0) return std::nullopt;
  return plain_copy(ctx, static_cast<size_t>(index));
}

std::optional<Kernel> no_outputs(const KernelContext& ctx) {
  if (!ctx.outputs.empty()) return std::nullopt;
  return nothing_to_do();
}

// ---- views ----

using ViewFn = std::optional<View> (*)(const Attrs& attrs, const Shape& in, const Shape& out);

std::optional<View> permuted(const Shape& in, const std::vector<int64_t>& order) {
  const View base = contiguous_view(in);
  View view;
  for (int64_t d : order) {
    if (d < 0 || d >= rank_of(in)) return std::nullopt;
    view.shape.push_back(base.shape[static_cast<size_t>(d)]);
    view.strides.push_back(base.strides[static_cast<size_t>(d)]);
  }
  return view;
}

std::optional<View> permute_view(const Attrs& attrs, const Shape& in, const Shape&) {
  std::vector<int64_t> order;
  for (int64_t d : attrs.get_ints("dims")) order.push_back(ops::normalize_dim(d, rank_of(in)));
  return permuted(in, order);
}

std::optional<View> transpose_view(const Attrs& attrs, const Shape& in, const Shape&) {
  std::vector<int64_t> order(in.size());
  for (size_t d = 0; d < in.size(); ++d) order[d] = static_cast<int64_t>(d);
  if (in.empty()) return contiguous_view(in);
  std::swap(order[static_cast<size_t>(ops::normalize_dim(attrs.get_int("dim0"), rank_of(in)))],
            order[static_cast<size_t>(ops::normalize_dim(attrs.get_int("dim1"), rank_of(in)))]);
  return permuted(in, order);
}

std::optional<View> t_view(const Attrs&, const Shape& in, const Shape&) {
  if (in.size() < 2) return contiguous_view(in);
  return permuted(in, {1, 0});
}

std::optional<View> expand_view(const Attrs&, const Shape& in, const Shape& out) {
  return View{out, ops::broadcast_strides(in, out), 0};
}

std::optional<View> repeat_view(const Attrs& attrs, const Shape& in, const Shape&) {
  const std::vector<int64_t> repeats = attrs.get_ints("repeats");
  if (repeats.size() < in.size()) return std::nullopt;
  Shape padded(repeats.size() - in.size(), 1);
  padded.insert(padded.end(), in.begin(), in.end());
  const Shape strides = contiguous_strides(padded);
  View view;
  for (size_t i = 0; i < padded.size(); ++i) {
    view.shape.insert(view.shape.end(), {repeats[i], padded[i]});
    view.strides.insert(view.strides.end(), {0, strides[i]});
  }
  return view;
}

// PyTorch's slice clamping: negative bounds wrap once, then both clamp to [0, size].
std::optional<View> slice_view(const Attrs& attrs, const Shape& in, const Shape&) {
  if (in.empty()) return std::nullopt;
  const auto dim = static_cast<size_t>(ops::normalize_dim(attrs.get_int("dim", 0), rank_of(in)));
  const int64_t step = attrs.get_int("step", 1);
  if (step < 1) return std::nullopt;
  const int64_t size = in[dim];
  int64_t start = attrs.get_int("start", 0);
  int64_t end = attrs.get_int("end", std::numeric_limits<int64_t>::max());
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  View view = contiguous_view(in);
  view.offset += start * view.strides[dim];
  view.shape[dim] = end == start ? 0 : (end - start - 1) / step + 1;
  view.strides[dim] *= step;
  return view;
}

std::optional<View> narrow_view(const Attrs& attrs, const Shape& in, const Shape&) {
  if (in.empty()) return std::nullopt;
  const auto dim = static_cast<size_t>(ops::normalize_dim(attrs.get_int("dim"), rank_of(in)));
  int64_t start = attrs.get_int("start");
  if (start < 0) start += in[dim];
  View view = contiguous_view(in);
  view.offset += start * view.strides[dim];
  view.shape[dim] = attrs.get_int("length");
  return view;
}

std::optional<View> select_view(const Attrs& attrs, const Shape& in, const Shape&) {
  if (in.empty()) return std::nullopt;
  const auto dim = static_cast<size_t>(ops::normalize_dim(attrs.get_int("dim"), rank_of(in)));
  int64_t index = attrs.get_int("index");
  if (index < 0) index += in[dim];
  View view = contiguous_view(in);
  view.offset += index * view.strides[dim];
  view.shape.erase(view.shape.begin() + static_cast<std::ptrdiff_t>(dim));
  view.strides.erase(view.strides.begin() + static_cast<std::ptrdiff_t>(dim));
  return view;
}

std::optional<View> flip_view(const Attrs& attrs, const Shape& in, const Shape&) {
  View view = contiguous_view(in);
  if (in.empty()) return view;
  for (int64_t d : attrs.get_ints("dims")) {
    const auto dim = static_cast<size_t>(ops::normalize_dim(d, rank_of(in)));
    if (view.shape[dim] == 0) continue;
    view.offset += (view.shape[dim] - 1) * view.strides[dim];
    view.strides[dim] = -view.strides[dim];
  }
  return view;
}

template <ViewFn Fn>
std::optional<Kernel> view_kernel(const KernelContext& ctx) {
  if (ctx.inputs.empty() || ctx.outputs.size() != 1) return std::nullopt;
  const Buffer& in = ctx.inputs[0];
  const Buffer& out = ctx.outputs[0];
  const std::optional<View> view = Fn(ctx.node.attrs, in.meta.shape, out.meta.shape);
  if (!view) return std::nullopt;
  Shape shape = view->shape;
  if (Fn == repeat_view) shape = out.meta.shape;  // the repeat view has an interleaved shape of the same size
  if (shape != out.meta.shape) return std::nullopt;
  return strided_copy(ctx, in, out, *view);
}

// split / chunk / unbind: consecutive pieces along one dim; unbind drops the dim.
std::optional<Kernel> pieces_along(const KernelContext& ctx, int64_t dim, bool drop_dim) {
  if (ctx.inputs.size() != 1) return std::nullopt;
  const Buffer& in = ctx.inputs[0];
  if (in.meta.shape.empty()) return std::nullopt;
  const auto d = static_cast<size_t>(ops::normalize_dim(dim, rank_of(in.meta.shape)));
  std::vector<Kernel> parts;
  int64_t start = 0;
  for (const Buffer& out : ctx.outputs) {
    View view = contiguous_view(in.meta.shape);
    view.offset = start * view.strides[d];
    const int64_t length = drop_dim ? 1 : (out.meta.shape.size() > d ? out.meta.shape[d] : -1);
    if (length < 0) return std::nullopt;
    view.shape[d] = length;
    if (drop_dim) {
      view.shape.erase(view.shape.begin() + static_cast<std::ptrdiff_t>(d));
      view.strides.erase(view.strides.begin() + static_cast<std::ptrdiff_t>(d));
    }
    if (view.shape != out.meta.shape) return std::nullopt;
    std::optional<Kernel> part = strided_copy(ctx, in, out, view);
    if (!part) return std::nullopt;
    parts.push_back(std::move(*part));
    start += length;
  }
  if (start > in.meta.shape[d]) return std::nullopt;
  Kernel kernel;
  kernel.run = [parts] {
    for (const Kernel& part : parts) part.run();
  };
  return kernel;
}

std::optional<Kernel> split(const KernelContext& ctx) {
  return pieces_along(ctx, ctx.node.attrs.get_int("dim", 0), false);
}
std::optional<Kernel> unbind(const KernelContext& ctx) {
  return pieces_along(ctx, ctx.node.attrs.get_int("dim", 0), true);
}

// ---- cat / stack: each input is [outer, part * inner] rows placed side by side in the output ----

std::optional<Kernel> concatenate(const KernelContext& ctx, bool stacked) {
  const Buffer& out = ctx.outputs[0];
  if (out.numel() == 0) return nothing_to_do();
  const Shape& shape = out.meta.shape;
  const auto dim = static_cast<size_t>(ops::normalize_dim(ctx.node.attrs.get_int("dim", 0), rank_of(shape)));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  struct Part {
    const std::byte* data;
    Elem elem;
    int64_t row;     // elements per outer index
    int64_t offset;  // elements from the start of an output row
  };
  std::vector<Part> parts;
  int64_t offset = 0;
  for (const Buffer& in : ctx.inputs) {
    if (!stacked && in.meta.shape.size() == 1 && in.meta.shape[0] == 0) continue;  // skipped by cat
    const int64_t extent = stacked ? 1 : (in.meta.shape.size() > dim ? in.meta.shape[dim] : -1);
    if (extent < 0 || in.numel() != outer * extent * inner) return std::nullopt;
    parts.push_back({in.data, in.elem, extent * inner, offset * inner});
    offset += extent;
  }
  if (offset != shape[dim]) return std::nullopt;
  const int64_t out_row = shape[dim] * inner;
  const size_t element = elem_size(out.elem);
  std::byte* to = out.data;
  const Elem out_elem = out.elem;
  Kernel kernel;
  kernel.run = [parts, outer, out_row, element, to, out_elem] {
    for (const Part& part : parts)
      for (int64_t o = 0; o < outer; ++o)
        convert(part.data + static_cast<size_t>(o * part.row) * elem_size(part.elem), part.elem,
                to + static_cast<size_t>(o * out_row + part.offset) * element, out_elem, part.row);
  };
  return kernel;
}

std::optional<Kernel> cat(const KernelContext& ctx) { return concatenate(ctx, false); }
std::optional<Kernel> stack(const KernelContext& ctx) { return concatenate(ctx, true); }

// ---- index_select / index_copy: rows along one dim picked by an int64 index vector ----

struct AlongDim {
  int64_t outer = 1, size = 0, inner = 1;
};

AlongDim along(const Shape& shape, int64_t dim) {
  AlongDim a;
  const auto d = static_cast<size_t>(ops::normalize_dim(dim, rank_of(shape)));
  for (size_t i = 0; i < d; ++i) a.outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) a.inner *= shape[i];
  a.size = shape[d];
  return a;
}

int64_t checked_index(int64_t index, int64_t size, const char* op) {
  if (index < -size || index >= size)
    fail(std::string(op) + ": index " + std::to_string(index) + " is out of range for a dimension of size " +
         std::to_string(size));
  return index < 0 ? index + size : index;
}

std::optional<Kernel> index_select(const KernelContext& ctx) {
  const Buffer& in = ctx.inputs[0];
  const Buffer& index = ctx.inputs[1];
  const Buffer& out = ctx.outputs[0];
  if (in.meta.shape.empty() || index.elem != Elem::I64 || in.elem != out.elem) return std::nullopt;
  const AlongDim a = along(in.meta.shape, ctx.node.attrs.get_int("dim"));
  const int64_t picks = index.numel();
  const size_t element = elem_size(in.elem);
  Kernel kernel;
  kernel.run = [a, picks, element, from = in.data, indices = index.as<const int64_t>(), to = out.data] {
    for (int64_t j = 0; j < picks; ++j) {
      const int64_t row = checked_index(indices[j], a.size, "index_select");
      for (int64_t o = 0; o < a.outer; ++o)
        std::memcpy(to + static_cast<size_t>((o * picks + j) * a.inner) * element,
                    from + static_cast<size_t>((o * a.size + row) * a.inner) * element,
                    static_cast<size_t>(a.inner) * element);
    }
  };
  return kernel;
}

// index_copy(self, index, source): self with source's rows written at index (the KV-cache update).
std::optional<Kernel> index_copy(const KernelContext& ctx) {
  const Buffer& self = ctx.inputs[0];
  const Buffer& index = ctx.inputs[1];
  const Buffer& source = ctx.inputs[2];
  const Buffer& out = ctx.outputs[0];
  if (self.meta.shape.empty() || index.elem != Elem::I64 || self.elem != out.elem || source.elem != out.elem)
    return std::nullopt;
  const AlongDim a = along(self.meta.shape, ctx.node.attrs.get_int("dim"));
  const int64_t picks = index.numel();
  const size_t element = elem_size(out.elem);
  const size_t total = out.bytes();
  Kernel kernel;
  kernel.run = [a, picks, element, total, base = self.data, indices = index.as<const int64_t>(), rows = source.data,
                to = out.data] {
    if (base != to) std::memmove(to, base, total);
    for (int64_t j = 0; j < picks; ++j) {
      const int64_t row = checked_index(indices[j], a.size, "index_copy");
      for (int64_t o = 0; o < a.outer; ++o)
        std::memcpy(to + static_cast<size_t>((o * a.size + row) * a.inner) * element,
                    rows + static_cast<size_t>((o * picks + j) * a.inner) * element,
                    static_cast<size_t>(a.inner) * element);
    }
  };
  kernel.shareable_inputs = {0};  // an update of the cache in place
  return kernel;
}

}  // namespace

void add_shape_kernels(KernelTable& table) {
  for (const char* op : {"reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "alias", "clone", "dropout"})
    table.add(op, copy_input0);
  table.add("getitem", getitem);
  table.add("assert_metadata", no_outputs);
  table.add("permute", view_kernel<permute_view>);
  table.add("transpose", view_kernel<transpose_view>);
  table.add("t", view_kernel<t_view>);
  table.add("expand", view_kernel<expand_view>);
  table.add("repeat", view_kernel<repeat_view>);
  table.add("slice", view_kernel<slice_view>);
  table.add("narrow", view_kernel<narrow_view>);
  table.add("select", view_kernel<select_view>);
  table.add("flip", view_kernel<flip_view>);
  table.add("split", split);
  table.add("chunk", split);
  table.add("unbind", unbind);
  table.add("cat", cat);
  table.add("stack", stack);
  table.add("index_select", index_select);
  table.add("index_copy", index_copy);
}

}  // namespace npusim::cpu
