#include "backends/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "backends/cuda/attention_decode.h"
#include "backends/cuda/attention_mma.h"
#include "backends/cuda/blas_lt.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/cudnn_conv.h"
#include "backends/cuda/device_kernels.h"
#include "backends/cuda/pointwise_ops.h"
#include "backends/cuda/reduction_ops.h"
#include "ops/op_util.h"
#include "ops/pool_window.h"

namespace npusim::cuda {

namespace {

static_assert(static_cast<int>(Elem::F32) == kF32 && static_cast<int>(Elem::F16) == kF16 &&
              static_cast<int>(Elem::BF16) == kBF16 && static_cast<int>(Elem::I64) == kI64 &&
              static_cast<int>(Elem::Bool) == kBool);

Operand none() { return {nullptr, kF32}; }

// Element strides of a contiguous shape.
std::vector<int64_t> strides_of(const Shape& shape) { return contiguous_strides(shape); }

// An indexer over `shape` with the operands' strides, dims of size 1 dropped and neighbouring dims that every
// operand walks contiguously merged (fewer divisions per element); nothing when the rank stays too large.
std::optional<Indexer> make_indexer(const Shape& shape, const std::vector<std::vector<int64_t>>& operand_strides) {
  if (operand_strides.size() > 4) return std::nullopt;
  Shape sizes;
  std::vector<std::vector<int64_t>> strides(operand_strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const bool merge = !sizes.empty() && std::all_of(strides.begin(), strides.end(), [&](const auto& s) {
      const size_t o = static_cast<size_t>(&s - strides.data());
      return s.back() == operand_strides[o][d] * shape[d];
    });
    if (merge) {
      sizes.back() *= shape[d];
      for (size_t o = 0; o < strides.size(); ++o) strides[o].back() = operand_strides[o][d];
      continue;
    }
    sizes.push_back(shape[d]);
    for (size_t o = 0; o < strides.size(); ++o) strides[o].push_back(operand_strides[o][d]);
  }
  if (sizes.size() > static_cast<size_t>(kMaxRank)) return std::nullopt;
  Indexer ix;
  ix.rank = static_cast<int>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    ix.sizes[d] = sizes[d];
    for (size_t o = 0; o < strides.size(); ++o) ix.strides[o][d] = strides[o][d];
  }
  return ix;
}

// ---- views and copies ----

const std::set<std::string> kViewOps = {"reshape",   "flatten", "unflatten", "squeeze",
                                        "unsqueeze", "alias",   "clone",     "dropout"};

Launch copy_whole(const Node& node, const DeviceValue& in, const DeviceValue& out) {
  return [node = &node, in, out](cudaStream_t stream) {
    if (in.data == out.data && in.elem == out.elem) return;
    if (in.elem == out.elem) {
      check_cuda(cudaMemcpyAsync(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync",
                 describe_node(*node));
      return;
    }
    Indexer ix;
    ix.rank = 1;
    ix.sizes[0] = out.numel();
    ix.strides[0][0] = ix.strides[1][0] = 1;
    check_launch(launch_copy(stream, ix, out.data, elem_code(out.elem), as_operand(in)), "launch_copy", *node);
  };
}

std::optional<Launch> view_op(const OpContext& ctx) {
  if (ctx.inputs.empty() || ctx.outputs.size() != 1 || ctx.inputs[0].numel() != ctx.outputs[0].numel())
    return std::nullopt;
  return copy_whole(ctx.node, ctx.inputs[0], ctx.outputs[0]);
}

std::optional<Launch> to_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1 || ctx.inputs[0].numel() != ctx.outputs[0].numel())
    return std::nullopt;
  return copy_whole(ctx.node, ctx.inputs[0], ctx.outputs[0]);
}

// The output as a strided view of the input: `strides` per output dim (in input elements) from `offset`.
std::optional<Launch> strided_copy(const OpContext& ctx, const std::vector<int64_t>& strides, int64_t offset) {
  const DeviceValue& in = ctx.inputs[0];
  const DeviceValue& out = ctx.outputs[0];
  const auto ix = make_indexer(out.meta.shape, {strides_of(out.meta.shape), strides});
  if (!ix) return std::nullopt;
  const Operand source{in.data + offset * static_cast<int64_t>(cpu::elem_size(in.elem)), elem_code(in.elem)};
  return [node = &ctx.node, ix = *ix, out, source](cudaStream_t stream) {
    check_launch(launch_copy(stream, ix, out.data, elem_code(out.elem), source), "launch_copy", *node);
  };
}

// The input dim each output dim of a transpose, t or permute comes from.
std::optional<std::vector<int64_t>> dim_order(const Node& node, const Shape& shape) {
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> order(shape.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
  const Attrs& a = node.attrs;
  if (node.op == "transpose") {
    if (rank == 0) return std::nullopt;
    std::swap(order[static_cast<size_t>(ops::normalize_dim(a.get_int("dim0"), rank))],
              order[static_cast<size_t>(ops::normalize_dim(a.get_int("dim1"), rank))]);
  } else if (node.op == "t") {
    if (rank == 2) std::swap(order[0], order[1]);
  } else if (node.op == "permute") {
    const std::vector<int64_t> dims = a.get_ints("dims");
    if (static_cast<int64_t>(dims.size()) != rank) return std::nullopt;
    for (size_t d = 0; d < dims.size(); ++d) order[d] = ops::normalize_dim(dims[d], rank);
  } else {
    return std::nullopt;
  }
  return order;
}

std::optional<Launch> transpose_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const auto found = transposed_source_strides(ctx.node, ctx.inputs[0].meta.shape);
  if (!found) return std::nullopt;
  if (ctx.inputs[0].data == ctx.outputs[0].data && ctx.inputs[0].elem == ctx.outputs[0].elem)
    return [](cudaStream_t) {};  // an alias: only dims of size 1 moved
  return strided_copy(ctx, *found, 0);
}

std::optional<Launch> expand_op(const OpContext& ctx) {
  if (ctx.inputs.empty() || ctx.outputs.size() != 1) return std::nullopt;
  return strided_copy(ctx, ops::broadcast_strides(ctx.inputs[0].meta.shape, ctx.outputs[0].meta.shape), 0);
}

int64_t clamp_start(int64_t start, int64_t size) {
  if (start < 0) start += size;
  return std::clamp<int64_t>(start, 0, size);
}

std::optional<Launch> slice_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const Shape& shape = ctx.inputs[0].meta.shape;
  const auto rank = static_cast<int64_t>(shape.size());
  const Attrs& a = ctx.node.attrs;
  const auto dim = static_cast<size_t>(ops::normalize_dim(a.get_int("dim", 0), rank));
  std::vector<int64_t> strides = strides_of(shape);
  int64_t start = 0;
  if (ctx.node.op == "slice") {
    const int64_t step = a.get_int("step", 1);
    if (step < 1) return std::nullopt;
    start = clamp_start(a.get_int("start", 0), shape[dim]);
    const int64_t offset = start * strides[dim];
    strides[dim] *= step;
    return strided_copy(ctx, strides, offset);
  }
  if (ctx.node.op == "narrow") {
    start = a.get_int("start");
    if (start < 0) start += shape[dim];
    return strided_copy(ctx, strides, start * strides[dim]);
  }
  // select: the dim disappears
  int64_t index = a.get_int("index");
  if (index < 0) index += shape[dim];
  if (index < 0 || index >= shape[dim]) return std::nullopt;
  const int64_t offset = index * strides[dim];
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(dim));
  return strided_copy(ctx, strides, offset);
}

std::optional<Launch> cat_op(const OpContext& ctx) {
  if (ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue out = ctx.outputs[0];
  const Shape& shape = out.meta.shape;
  if (shape.empty()) return std::nullopt;
  const auto dim =
      static_cast<size_t>(ops::normalize_dim(ctx.node.attrs.get_int("dim", 0), static_cast<int64_t>(shape.size())));
  const std::vector<int64_t> out_strides = strides_of(shape);
  struct Piece {
    Indexer ix;
    Operand source;
    std::byte* dst;
  };
  std::vector<Piece> pieces;
  int64_t along = 0;
  for (const DeviceValue& in : ctx.inputs) {
    if (in.meta.shape.size() != shape.size()) {
      if (in.numel() == 0) continue;  // the legacy empty [0] tensor
      return std::nullopt;
    }
    const auto ix = make_indexer(in.meta.shape, {out_strides, strides_of(in.meta.shape)});
    if (!ix) return std::nullopt;
    pieces.push_back(
        {*ix, as_operand(in), out.data + along * out_strides[dim] * static_cast<int64_t>(cpu::elem_size(out.elem))});
    along += in.meta.shape[dim];
  }
  if (along != shape[dim]) return std::nullopt;
  return [node = &ctx.node, pieces, out](cudaStream_t stream) {
    for (const Piece& piece : pieces)
      check_launch(launch_copy(stream, piece.ix, piece.dst, elem_code(out.elem), piece.source), "launch_copy", *node);
  };
}

// ---- elementwise ----

const std::map<std::string, BinaryOp> kBinaryOps = {
    {"add", BinaryOp::Add},
    {"sub", BinaryOp::Sub},
    {"mul", BinaryOp::Mul},
    {"div", BinaryOp::Div},
    {"maximum", BinaryOp::Maximum},
    {"minimum", BinaryOp::Minimum},
    {"eq", BinaryOp::Eq},
    {"ne", BinaryOp::Ne},
    {"lt", BinaryOp::Lt},
    {"le", BinaryOp::Le},
    {"gt", BinaryOp::Gt},
    {"ge", BinaryOp::Ge},
    {"logical_and", BinaryOp::LogicalAnd},
    {"logical_or", BinaryOp::LogicalOr},
    {"bitwise_and", BinaryOp::BitwiseAnd},
    {"bitwise_or", BinaryOp::BitwiseOr},
    {"bitwise_xor", BinaryOp::BitwiseXor},
    {"add_relu", BinaryOp::AddRelu},
    {"silu_mul", BinaryOp::SiluMul},
};

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le || op == BinaryOp::Gt ||
         op == BinaryOp::Ge || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr;
}

std::optional<Launch> binary_op(const OpContext& ctx) {
  if (std::optional<Launch> generated = generated_node(ctx)) return generated;
  const BinaryOp op = kBinaryOps.at(ctx.node.op);
  const Attrs& a = ctx.node.attrs;
  if (ctx.outputs.size() != 1 || ctx.inputs.empty() || ctx.inputs.size() > 2) return std::nullopt;
  if (!a.is_none("rounding_mode")) return std::nullopt;
  const DeviceValue out = ctx.outputs[0];
  const DeviceValue& x = ctx.inputs[0];
  const bool out_float = cpu::is_float_elem(out.elem);
  const bool is_bitwise = op == BinaryOp::BitwiseAnd || op == BinaryOp::BitwiseOr || op == BinaryOp::BitwiseXor;
  if (is_bitwise && out_float) return std::nullopt;
  if (op == BinaryOp::Div && !out_float) return std::nullopt;
  if (is_comparison(op) && out.elem != Elem::Bool) return std::nullopt;
  double scalar = 0.0;
  int64_t int_scalar = 0;
  Operand second = none();
  std::vector<std::vector<int64_t>> strides{strides_of(out.meta.shape),
                                            ops::broadcast_strides(x.meta.shape, out.meta.shape)};
  if (ctx.inputs.size() == 2) {
    second = as_operand(ctx.inputs[1]);
    strides.push_back(ops::broadcast_strides(ctx.inputs[1].meta.shape, out.meta.shape));
  } else {
    if (a.is_none("other")) return std::nullopt;
    const bool float_scalar = !a.is_integer("other");
    // Integer math with a fractional scalar, or an integer comparison with one, would need the promotion rules.
    if (float_scalar && !cpu::is_float_elem(x.elem)) return std::nullopt;
    scalar = a.get_float("other");
    int_scalar = float_scalar ? 0 : a.get_int("other");
    strides.push_back(std::vector<int64_t>(out.meta.shape.size(), 0));
  }
  double alpha = 1.0;
  int64_t int_alpha = 1;
  if (!a.is_none("alpha")) {
    if (op != BinaryOp::Add && op != BinaryOp::Sub) return std::nullopt;
    alpha = a.get_float("alpha");
    if (!out_float) {
      if (!a.is_integer("alpha")) return std::nullopt;
      int_alpha = a.get_int("alpha");
    }
  }
  const auto ix = make_indexer(out.meta.shape, strides);
  if (!ix) return std::nullopt;
  return [node = &ctx.node, op, ix = *ix, out, first = as_operand(x), second, scalar, int_scalar, alpha,
          int_alpha](cudaStream_t stream) {
    check_launch(launch_binary(stream, op, ix, out.data, elem_code(out.elem), first, second, scalar, int_scalar, alpha,
                               int_alpha),
                 "launch_binary", *node);
  };
}

std::optional<UnaryOp> unary_of(const std::string& op, const Attrs& attrs) {
  if (op == "relu") return UnaryOp::Relu;
  if (op == "silu") return UnaryOp::Silu;
  if (op == "sigmoid") return UnaryOp::Sigmoid;
  if (op == "tanh") return UnaryOp::Tanh;
  if (op == "neg") return UnaryOp::Neg;
  if (op == "exp") return UnaryOp::Exp;
  if (op == "gelu") {
    const std::string approximate = attrs.is_none("approximate") ? "none" : attrs.get_string("approximate");
    if (approximate == "none") return UnaryOp::Gelu;
    if (approximate == "tanh") return UnaryOp::GeluTanh;
  }
  return std::nullopt;
}

std::optional<Launch> unary_op(const OpContext& ctx) {
  if (std::optional<Launch> generated = generated_node(ctx)) return generated;
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue in = ctx.inputs[0], out = ctx.outputs[0];
  if (!cpu::is_float_elem(in.elem) || !cpu::is_float_elem(out.elem) || in.numel() != out.numel()) return std::nullopt;
  const auto op = unary_of(ctx.node.op, ctx.node.attrs);
  if (!op) return std::nullopt;
  return [node = &ctx.node, op = *op, in, out](cudaStream_t stream) {
    check_launch(launch_unary(stream, op, out.numel(), out.data, elem_code(out.elem), as_operand(in)), "launch_unary",
                 *node);
  };
}

std::optional<Launch> where_op(const OpContext& ctx) {
  if (std::optional<Launch> generated = generated_node(ctx)) return generated;
  if (ctx.outputs.size() != 1 || ctx.inputs.size() < 2 || ctx.inputs.size() > 3) return std::nullopt;
  const DeviceValue out = ctx.outputs[0];
  const Shape& shape = out.meta.shape;
  std::vector<std::vector<int64_t>> strides{strides_of(shape)};
  for (const DeviceValue& in : ctx.inputs) strides.push_back(ops::broadcast_strides(in.meta.shape, shape));
  double other = 0.0;
  Operand b = none();
  if (ctx.inputs.size() == 3) {
    b = as_operand(ctx.inputs[2]);
  } else {
    if (ctx.node.attrs.is_none("other")) return std::nullopt;
    if (!cpu::is_float_elem(out.elem) && !ctx.node.attrs.is_integer("other")) return std::nullopt;
    other = ctx.node.attrs.get_float("other");
    strides.push_back(std::vector<int64_t>(shape.size(), 0));
  }
  const auto ix = make_indexer(shape, strides);
  if (!ix) return std::nullopt;
  return [node = &ctx.node, ix = *ix, out, cond = as_operand(ctx.inputs[0]), a = as_operand(ctx.inputs[1]), b,
          other](cudaStream_t stream) {
    check_launch(launch_where(stream, ix, out.data, elem_code(out.elem), cond, a, b, other), "launch_where", *node);
  };
}

// ---- LLM ops ----

std::optional<Launch> rope_op(const OpContext& ctx) {
  const std::optional<RopeCacheJob> job = rope_job(ctx);
  if (!job) return std::nullopt;
  return [node = &ctx.node, job = *job](cudaStream_t stream) {
    check_launch(launch_rope(stream, job.ix, job.width, job.out, job.out_elem, job.x, job.cos, job.sin), "launch_rope",
                 *node);
  };
}
double machine_epsilon(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return 0.0009765625;
    case DType::BFloat16:
      return 0.0078125;
    case DType::Float64:
      return std::numeric_limits<double>::epsilon();
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

std::optional<Launch> rms_norm_op(const OpContext& ctx) {
  if (ctx.outputs.size() != 1 || ctx.inputs.empty()) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], out = ctx.outputs[0];
  const std::vector<int64_t> normalized = ctx.node.attrs.get_ints("normalized_shape");
  if (normalized.size() > x.meta.shape.size()) return std::nullopt;
  int64_t row_size = 1;
  for (int64_t size : normalized) row_size *= size;
  if (row_size == 0 || !cpu::is_float_elem(x.elem)) return std::nullopt;
  const Operand weight = ctx.inputs.size() == 2 ? as_operand(ctx.inputs[1]) : none();
  if (ctx.inputs.size() == 2 && ctx.inputs[1].numel() != row_size) return std::nullopt;
  const double eps = rms_norm_eps(ctx.node, out.meta.dtype);
  const int64_t rows = x.numel() / row_size;
  return [node = &ctx.node, rows, row_size, eps, out, x, weight](cudaStream_t stream) {
    check_launch(launch_rms_norm(stream, rows, row_size, eps, out.data, elem_code(out.elem), as_operand(x), weight),
                 "launch_rms_norm", *node);
  };
}

std::optional<Launch> layer_norm_op(const OpContext& ctx) {
  if (ctx.inputs.empty() || ctx.inputs.size() > 3 || (ctx.outputs.size() != 1 && ctx.outputs.size() != 3))
    return std::nullopt;
  const DeviceValue x = ctx.inputs[0], out = ctx.outputs[0];
  int64_t row_size = 1;
  for (int64_t size : ctx.node.attrs.get_ints("normalized_shape")) row_size *= size;
  if (!cpu::is_float_elem(x.elem) || !cpu::is_float_elem(out.elem) || x.numel() != out.numel()) return std::nullopt;
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (ctx.inputs[i].numel() != row_size || !cpu::is_float_elem(ctx.inputs[i].elem)) return std::nullopt;
  const Operand weight = ctx.inputs.size() >= 2 ? as_operand(ctx.inputs[1]) : none();
  const Operand bias = ctx.inputs.size() == 3 ? as_operand(ctx.inputs[2]) : none();
  Operand mean = none(), rstd = none();
  if (ctx.outputs.size() == 3) {
    if (!cpu::is_float_elem(ctx.outputs[1].elem) || !cpu::is_float_elem(ctx.outputs[2].elem)) return std::nullopt;
    mean = as_operand(ctx.outputs[1]);
    rstd = as_operand(ctx.outputs[2]);
  }
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  const int64_t rows = row_size > 0 ? x.numel() / row_size : 0;
  return [node = &ctx.node, rows, row_size, eps, out, x, weight, bias, mean, rstd](cudaStream_t stream) {
    check_launch(launch_layer_norm(stream, rows, row_size, eps, out.data, elem_code(out.elem), as_operand(x), weight,
                                   bias, mean, rstd),
                 "launch_layer_norm", *node);
  };
}

std::optional<Launch> embedding_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 2 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue table = ctx.inputs[0], indices = ctx.inputs[1], out = ctx.outputs[0];
  if (table.meta.shape.size() != 2 || indices.elem != Elem::I64) return std::nullopt;
  return [node = &ctx.node, table, indices, out, error = ctx.error_flag](cudaStream_t stream) {
    check_launch(
        launch_embedding(stream, indices.numel(), table.meta.shape[0], table.meta.shape[1], out.data,
                         elem_code(out.elem), as_operand(table), reinterpret_cast<const int64_t*>(indices.data), error),
        "launch_embedding", *node);
  };
}

// The geometry of an index_copy as a cache write (source [outer, count, inner] into self [outer, dim_size, inner]),
// with out, index and source set; nothing when the kernel does not take it.
std::optional<RopeCacheJob> index_copy_geometry(const OpContext& ctx) {
  if (ctx.inputs.size() != 3 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue self = ctx.inputs[0], index = ctx.inputs[1], source = ctx.inputs[2], out = ctx.outputs[0];
  const Shape& shape = self.meta.shape;
  if (shape.empty() || index.elem != Elem::I64 || index.meta.shape.size() > 1) return std::nullopt;
  const auto dim =
      static_cast<size_t>(ops::normalize_dim(ctx.node.attrs.get_int("dim"), static_cast<int64_t>(shape.size())));
  RopeCacheJob job;
  job.kind = RopeCacheKind::CopyToCache;
  int64_t outer = 1;
  for (size_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) job.inner *= shape[d];
  job.dim_size = shape[dim];
  job.index_count = index.numel();
  job.count = outer * job.index_count * job.inner;
  if (source.numel() != job.count) return std::nullopt;
  job.out = out.data;
  job.out_elem = elem_code(out.elem);
  job.x = as_operand(source);
  job.source_index_stride = job.inner;
  job.source_outer_stride = job.index_count * job.inner;
  job.index = reinterpret_cast<const int64_t*>(index.data);
  job.error = ctx.error_flag;
  return job;
}

std::optional<Launch> index_copy_op(const OpContext& ctx) {
  const std::optional<RopeCacheJob> job = index_copy_geometry(ctx);
  if (!job) return std::nullopt;
  const Launch copy = copy_whole(ctx.node, ctx.inputs[0], ctx.outputs[0]);
  const int64_t slice = job->index_count * job->inner, outer = slice == 0 ? 0 : job->count / slice;
  return [node = &ctx.node, copy, outer, job = *job](cudaStream_t stream) {
    copy(stream);
    check_launch(launch_index_copy(stream, outer, job.dim_size, job.inner, job.index_count, job.out, job.out_elem,
                                   job.x, job.index, job.error),
                 "launch_index_copy", *node);
  };
}
// self[i0, i1, ...] with index tensors on self's leading dims (no None slots).
std::optional<Launch> index_op(const OpContext& ctx) {
  if (ctx.outputs.size() != 1 || ctx.inputs.size() < 2 || ctx.inputs.size() > 4) return std::nullopt;
  if (!ctx.node.attrs.is_none("_tensor_list_none_masks")) return std::nullopt;
  const DeviceValue self = ctx.inputs[0], out = ctx.outputs[0];
  const size_t count = ctx.inputs.size() - 1;
  if (count > self.meta.shape.size()) return std::nullopt;
  Shape broadcast = ctx.inputs[1].meta.shape;
  for (size_t t = 1; t <= count; ++t) {
    if (ctx.inputs[t].elem != Elem::I64) return std::nullopt;
    broadcast = ops::broadcast_shapes(broadcast, ctx.inputs[t].meta.shape);
  }
  const std::vector<int64_t> self_strides = strides_of(self.meta.shape);
  GatherParams g;
  g.count = static_cast<int>(count);
  g.inner = count < self.meta.shape.size() ? self_strides[count - 1] : 1;
  std::vector<std::vector<int64_t>> strides{strides_of(broadcast)};
  for (size_t t = 0; t < count; ++t) {
    g.index[t] = reinterpret_cast<const int64_t*>(ctx.inputs[t + 1].data);
    g.dim_size[t] = self.meta.shape[t];
    g.dim_stride[t] = self_strides[t];
    strides.push_back(ops::broadcast_strides(ctx.inputs[t + 1].meta.shape, broadcast));
  }
  if (shape_numel(broadcast) * g.inner != out.numel()) return std::nullopt;
  const auto ix = make_indexer(broadcast, strides);
  if (!ix) return std::nullopt;
  return [node = &ctx.node, ix = *ix, g, out, self, error = ctx.error_flag](cudaStream_t stream) {
    check_launch(launch_index(stream, ix, g, out.data, elem_code(out.elem), as_operand(self), error), "launch_index",
                 *node);
  };
}

std::optional<Launch> rotary_embedding_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 2 || ctx.outputs.size() != 2) return std::nullopt;
  const DeviceValue frequencies = ctx.inputs[0], positions = ctx.inputs[1], cos = ctx.outputs[0], sin = ctx.outputs[1];
  if (!cpu::is_float_elem(frequencies.elem) || positions.elem != Elem::I64 || cos.elem != sin.elem) return std::nullopt;
  const int64_t half = frequencies.numel();
  if (cos.numel() != positions.numel() * 2 * half || sin.numel() != cos.numel()) return std::nullopt;
  const auto scaling = static_cast<float>(ctx.node.attrs.get_float("attention_scaling", 1.0));
  return [node = &ctx.node, frequencies, positions, cos, sin, half, scaling](cudaStream_t stream) {
    check_launch(
        launch_rotary_embedding(stream, positions.numel(), half, scaling, cos.data, sin.data, elem_code(cos.elem),
                                as_operand(frequencies), reinterpret_cast<const int64_t*>(positions.data)),
        "launch_rotary_embedding", *node);
  };
}

std::optional<Launch> softmax_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], out = ctx.outputs[0];
  const auto rank = static_cast<int64_t>(x.meta.shape.size());
  if (rank == 0 || !cpu::is_float_elem(x.elem) || !cpu::is_float_elem(out.elem)) return std::nullopt;
  if (ops::normalize_dim(ctx.node.attrs.get_int("dim"), rank) != rank - 1) return std::nullopt;
  const int64_t width = x.meta.shape.back();
  if (width == 0) return std::nullopt;
  const bool log = ctx.node.op == "log_softmax";
  return [node = &ctx.node, x, out, width, log](cudaStream_t stream) {
    check_launch(launch_softmax(stream, x.numel() / width, width, out.data, elem_code(out.elem), as_operand(x), log),
                 "launch_softmax", *node);
  };
}

std::optional<AttentionParams> attention_params(const OpContext& ctx) {
  const Attrs& a = ctx.node.attrs;
  if (ctx.outputs.size() != 1 || ctx.inputs.size() < 3) return std::nullopt;
  const DeviceValue q = ctx.inputs[0], k = ctx.inputs[1], v = ctx.inputs[2];
  const size_t rank = q.meta.shape.size();
  if (rank < 3 || rank > 4) return std::nullopt;
  AttentionParams p{};
  p.batch = rank == 4 ? q.meta.shape[0] : 1;
  p.q_heads = q.meta.shape[rank - 3];
  p.k_heads = k.meta.shape[rank - 3];
  p.v_heads = v.meta.shape[rank - 3];
  p.length = q.meta.shape[rank - 2];
  p.embed = q.meta.shape[rank - 1];
  p.source = k.meta.shape[rank - 2];
  p.value_embed = v.meta.shape[rank - 1];
  if (p.k_heads == 0 || p.v_heads == 0) return std::nullopt;
  p.scale =
      static_cast<float>(a.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(p.embed)) : a.get_float("scale"));
  p.causal = a.get_bool("is_causal", false);
  p.zero_masked_rows = a.get_bool("zero_masked_rows", false);
  p.tensor_cores = !environment_is("NPUSIM_CUDA_MMA_ATTENTION", "0");
  size_t next = 3;
  if (a.get_bool("has_mask", false)) {
    const DeviceValue& mask = ctx.inputs[next++];
    Shape scores{p.batch, p.q_heads, p.length, p.source};
    const std::vector<int64_t> s = ops::broadcast_strides(mask.meta.shape, scores);
    p.mask = mask.data;
    p.mask_elem = elem_code(mask.elem);
    p.mask_batch_stride = s[0];
    p.mask_head_stride = s[1];
    p.mask_row_stride = s[2];
    p.mask_column_stride = s[3];
  }
  if (a.get_bool("has_cache_position", false)) {
    const size_t slot = next++;
    const DeviceValue& position = ctx.inputs[slot];
    if (position.elem != Elem::I64) return std::nullopt;
    p.cache_position = reinterpret_cast<const int64_t*>(position.data);
    p.cache_position_count = position.numel();
    p.positions_ready = slot < ctx.inputs_ready_at_start.size() && ctx.inputs_ready_at_start[slot];
  }
  if (next != ctx.inputs.size() || !attention_supported(p, as_operand(k), as_operand(v))) return std::nullopt;
  return p;
}

// The attention of `ctx` writing into `out` (the node's output, or another value where the output is laid out
// otherwise).
std::optional<Launch> attention_launch(const OpContext& ctx, const AttentionParams& p, const DeviceValue& out) {
  const DeviceValue q = ctx.inputs[0], k = ctx.inputs[1], v = ctx.inputs[2];
  std::shared_ptr<DeviceBuffer> scratch;
  if (const int64_t floats = attention_scratch_floats(p); floats > 0) {
    scratch = std::make_shared<DeviceBuffer>(static_cast<size_t>(floats) * sizeof(float),
                                             describe_node(ctx.node) + ": attention partials");
    // The tiled kernel's run counters (at the end) start at zero; the last run of each head resets its own.
    NPUSIM_CUDA_CHECK(cudaMemset(scratch->data(), 0, scratch->size()), describe_node(ctx.node));
  }
  return [node = &ctx.node, p, out, q, k, v, scratch](cudaStream_t stream) {
    check_launch(launch_attention(stream, p, out.data, elem_code(out.elem), as_operand(q), as_operand(k), as_operand(v),
                                  scratch ? reinterpret_cast<float*>(scratch->data()) : nullptr),
                 "launch_attention", *node);
  };
}

std::optional<Launch> attention_op(const OpContext& ctx) {
  const std::optional<AttentionParams> p = attention_params(ctx);
  if (!p) return std::nullopt;
  return attention_launch(ctx, *p, ctx.outputs[0]);
}

// ---- GEMM ----

bool gemm_epilogues_enabled() { return !environment_is("NPUSIM_CUDA_GEMM_EPILOGUE", "0"); }

// Whether a convolution adds a bias or a residual or applies an activation after its sums.
bool conv_has_epilogue(const ConvParams& p, Operand bias, Operand residual) {
  return bias.data || residual.data || p.activation != UnaryOp::Identity || p.use_clamp;
}

// out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias) (+ residual, as C) on cuBLASLt: the bias in the GEMM's epilogue when it has
// an algorithm for that, else a second launch; nothing when cuBLASLt takes neither (or, with a residual, no epilogue).
std::optional<Launch> library_linear(const OpContext& ctx, int64_t m, int64_t n, int64_t k, Operand bias,
                                     const DeviceValue* residual = nullptr, const DeviceValue* into = nullptr) {
  Blas* blas = Blas::instance();
  if (!blas) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], w = ctx.inputs[1], out = into ? *into : ctx.outputs[0];
  const std::string label = describe_node(ctx.node);
  GemmSpec spec;
  spec.rows = m;
  spec.cols = n;
  spec.depth = k;
  spec.elem = elem_code(out.elem);
  spec.b_transposed = true;
  spec.accumulate = residual != nullptr;
  GemmOperands operands{x.data, w.data, residual ? residual->data : nullptr, nullptr, out.data};
  if (bias.data && bias.elem == spec.elem && gemm_epilogues_enabled()) {
    spec.bias = GemmSpec::Bias::PerColumn;
    operands.bias = bias.data;
    if (auto plan = blas->plan(spec, operands, ctx.stream, label))
      return [plan, label](cudaStream_t stream) { plan->run(stream, label); };
    spec.bias = GemmSpec::Bias::None;
    operands.bias = nullptr;
  }
  if (residual && bias.data) return std::nullopt;  // the bias would land after the residual
  auto plan = blas->plan(spec, operands, ctx.stream, label);
  if (!plan) return std::nullopt;
  return [node = &ctx.node, plan, label, m, n, out, bias](cudaStream_t stream) {
    plan->run(stream, label);
    if (bias.data)
      check_launch(launch_bias_activation(stream, m, n, out.data, elem_code(out.elem), bias, UnaryOp::Identity),
                   "launch_bias_activation", *node);
  };
}

std::optional<Launch> linear_op(const OpContext& ctx) {
  if (ctx.inputs.size() < 2 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], w = ctx.inputs[1], out = ctx.outputs[0];
  if (w.meta.shape.size() != 2 || x.meta.shape.empty()) return std::nullopt;
  const int64_t n = w.meta.shape[0], k = w.meta.shape[1];
  if (x.meta.shape.back() != k || !cpu::is_float_elem(x.elem) || !cpu::is_float_elem(out.elem)) return std::nullopt;
  const int64_t m = k > 0 ? x.numel() / k : 0;
  const Operand bias = ctx.inputs.size() == 3 ? as_operand(ctx.inputs[2]) : none();
  const bool one_type = x.elem == w.elem && w.elem == out.elem;
  const bool aligned = reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  if (one_type && aligned && m == 1 && n > 0 && gemv_supports(k, elem_code(out.elem))) {
    return [node = &ctx.node, n, k, x, w, out, bias](cudaStream_t stream) {
      check_launch(launch_gemv(stream, n, k, out.data, elem_code(out.elem), x.data, w.data, bias), "launch_gemv",
                   *node);
    };
  }
  if (one_type && k > 0 && m > 0 && n > 0 && std::max({m, n, k}) < std::numeric_limits<int>::max())
    if (auto library = library_linear(ctx, m, n, k, bias)) return library;
  return [node = &ctx.node, m, n, k, x, w, out, bias](cudaStream_t stream) {
    check_launch(launch_linear(stream, m, n, k, out.data, elem_code(out.elem), as_operand(x), as_operand(w), bias),
                 "launch_linear", *node);
  };
}

// matmul, mm, bmm and addmm (inputs bias, a, b) on cuBLASLt: a[..., rows, depth] · b[..., depth, cols] with 1-D
// operands promoted to matrices. The batch dims either match, or belong to one side only (a shared right operand
// folds the batch into the rows of one product); other broadcasts, and storages that differ, run on the host.
std::optional<Launch> matmul_op(const OpContext& ctx) {
  const bool addmm = ctx.node.op == "addmm";
  if (ctx.inputs.size() != (addmm ? 3u : 2u) || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue a = ctx.inputs[addmm ? 1 : 0], b = ctx.inputs[addmm ? 2 : 1], out = ctx.outputs[0];
  if (!cpu::is_float_elem(out.elem) || a.elem != out.elem || b.elem != out.elem) return std::nullopt;
  Shape a_shape = a.meta.shape, b_shape = b.meta.shape;
  if (a_shape.empty() || b_shape.empty()) return std::nullopt;
  if (a_shape.size() == 1) a_shape.insert(a_shape.begin(), 1);
  if (b_shape.size() == 1) b_shape.push_back(1);
  const int64_t rows = a_shape[a_shape.size() - 2], depth = a_shape.back(), cols = b_shape.back();
  if (b_shape[b_shape.size() - 2] != depth) return std::nullopt;
  const int64_t a_batch = shape_numel(Shape(a_shape.begin(), a_shape.end() - 2));
  const int64_t b_batch = shape_numel(Shape(b_shape.begin(), b_shape.end() - 2));
  const int64_t batch = rows * cols > 0 ? out.numel() / (rows * cols) : 0;
  if (out.numel() == 0 || depth == 0) return std::nullopt;  // nothing to multiply: the reference fills it
  GemmSpec spec;
  spec.cols = cols;
  spec.depth = depth;
  spec.elem = elem_code(out.elem);
  if (b_batch == 1 && a_batch == batch) {
    spec.rows = rows * batch;
  } else if ((a_batch == batch || a_batch == 1) && b_batch == batch) {
    spec.rows = rows;
    spec.batch = batch;
    spec.a_batch_stride = a_batch == 1 ? 0 : rows * depth;
    spec.b_batch_stride = depth * cols;
    spec.d_batch_stride = rows * cols;
  } else {
    return std::nullopt;
  }
  GemmOperands operands{a.data, b.data, nullptr, nullptr, out.data};
  if (addmm) {
    const DeviceValue bias = ctx.inputs[0];
    if (ctx.node.attrs.get_float("alpha", 1.0) != 1.0 || ctx.node.attrs.get_float("beta", 1.0) != 1.0 ||
        bias.elem != out.elem)
      return std::nullopt;
    if (bias.numel() == cols && (bias.meta.shape.size() == 1 || bias.meta.shape[0] == 1)) {
      spec.bias = GemmSpec::Bias::PerColumn;
      operands.bias = bias.data;
    } else if (bias.meta.shape == out.meta.shape) {
      spec.accumulate = true;
      operands.c = bias.data;
    } else {
      return std::nullopt;
    }
  }
  Blas* blas = Blas::instance();
  if (!blas || std::max({spec.rows, cols, depth}) >= std::numeric_limits<int>::max()) return std::nullopt;
  const std::string label = describe_node(ctx.node);
  auto plan = blas->plan(spec, operands, ctx.stream, label);
  if (!plan) return std::nullopt;
  return [plan, label](cudaStream_t stream) { plan->run(stream, label); };
}

// ---- CNN ----

std::vector<int64_t> pair_of(const Attrs& attrs, const std::string& name, std::vector<int64_t> fallback) {
  std::vector<int64_t> values = attrs.get_ints(name, std::move(fallback));
  if (values.size() == 1) values.push_back(values[0]);
  return values;
}

// Per sample out[Cout, pixels] = W[Cout, K] · col[K, pixels], where col is the input itself for a pointwise
// convolution and im2col's columns otherwise: one strided-batched GEMM over as many samples as the columns budget
// takes. The output is NCHW, so the bias is per row of the row-major result, which cuBLASLt's bias epilogue
// cannot add in its column order; it is folded into the GEMM instead when im2col runs anyway: the weights get the
// bias as one more column (padded to 16 bytes with zeros) and im2col a row of ones, while the residual rides as C
// (beta = 1) and ReLU in the epilogue, in the program's order relu(conv + bias + residual). Pointwise
// convolutions try the bias epilogue in row order. Whatever the GEMM cannot take (clamp, other activations, no
// algorithm) runs as the plain GEMM followed by the elementwise epilogue kernel; when tuning, a fused GEMM is kept
// only when it is not slower than that pair.
class ConvAsGemm {
 public:
  ConvAsGemm(const OpContext& ctx, Blas* blas, const ConvParams& p, const DeviceValue& x, const DeviceValue& w,
             const DeviceValue& out, Operand bias, Operand residual)
      : ctx_(ctx), blas_(blas), p_(p), x_(x), w_(w), out_(out), bias_(bias), residual_(residual) {
    pixels_ = p.out_h * p.out_w;
    depth_ = p.in_channels * p.kernel_h * p.kernel_w;
    pointwise_ =
        p.kernel_h == 1 && p.kernel_w == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
    elem_bytes_ = static_cast<int64_t>(cpu::elem_size(out.elem));
    label_ = describe_node(ctx.node);
  }

  std::optional<Launch> make() {
    if (!pointwise_ && depth_ + 16 > kMaxIm2colGrid) return std::nullopt;
    const bool has_epilogue = conv_has_epilogue(p_, bias_, residual_);
    const bool try_fused = has_epilogue && epilogue_fits() && gemm_epilogues_enabled();
    const bool augment = try_fused && bias_.data && !pointwise_;
    const int64_t vector = 16 / elem_bytes_;
    const int64_t widest = augment ? (depth_ + 1 + vector - 1) / vector * vector : depth_;
    chunk_ = p_.batch;
    if (!pointwise_) {
      const int64_t sample_bytes = widest * pixels_ * elem_bytes_;
      chunk_ = std::clamp<int64_t>(im2col_budget_bytes() / sample_bytes, 1, std::min(p_.batch, kMaxIm2colGrid));
      ctx_.scratch->reserve(static_cast<size_t>(chunk_ * sample_bytes), label_ + ": im2col columns");
    }
    const bool tune = gemm_tuning_enabled();
    std::optional<Variant> fused;
    if (try_fused) fused = augment ? augmented_variant(widest) : variant(true);
    std::optional<Variant> plain;
    if (!fused || tune) plain = variant(false);
    if (fused && plain && tune && fused->milliseconds() > plain->milliseconds() + epilogue_ms()) fused.reset();
    if (fused) return launch(std::move(*fused), false);
    if (!plain) return std::nullopt;
    return launch(std::move(*plain), has_epilogue);
  }

 private:
  struct Chunk {
    int64_t first, count;
    std::shared_ptr<const GemmPlan> plan;
  };

  // One way to run the GEMMs: the weights (with the bias column when augmented), the depth of a sample's columns,
  // and a plan per chunk of samples (the last one may be shorter).
  struct Variant {
    bool fused = false;
    const void* weights = nullptr;
    std::shared_ptr<DeviceBuffer> weight_memory;  // the augmented weights, when the variant has its own
    int64_t depth = 0;
    std::vector<Chunk> chunks;

    double milliseconds() const {
      double total = 0.0;
      for (const Chunk& chunk : chunks) total += chunk.plan->milliseconds();
      return total;
    }
  };

  // im2col's grid has a block row per column row and a block layer per sample.
  static constexpr int64_t kMaxIm2colGrid = 65535;

  static int64_t im2col_budget_bytes() {
    const char* text = std::getenv("NPUSIM_CUDA_IM2COL_BYTES");
    const int64_t bytes = text ? std::atoll(text) : 0;
    return bytes > 0 ? bytes : int64_t{64} << 20;
  }

  bool epilogue_fits() const {
    const int elem = elem_code(out_.elem);
    return !p_.use_clamp && (p_.activation == UnaryOp::Identity || p_.activation == UnaryOp::Relu) &&
           (!bias_.data || bias_.elem == elem) && (!residual_.data || residual_.elem == elem);
  }

  int64_t sample_in() const { return p_.in_channels * p_.in_h * p_.in_w; }
  int64_t sample_out() const { return p_.out_channels * pixels_; }

  GemmOperands operands(const Variant& v, int64_t first, bool row_bias) const {
    GemmOperands o;
    o.a = v.weights;
    o.b = pointwise_ ? x_.data + first * sample_in() * elem_bytes_ : ctx_.scratch->data();
    o.d = out_.data + first * sample_out() * elem_bytes_;
    if (v.fused && residual_.data)
      o.c = static_cast<const std::byte*>(residual_.data) + first * sample_out() * elem_bytes_;
    if (row_bias) o.bias = bias_.data;
    return o;
  }

  // Plans for every chunk; nothing when cuBLASLt has no algorithm for one.
  std::optional<Variant> plan_chunks(Variant v) const {
    const bool row_bias = v.fused && bias_.data && v.weights == w_.data;
    for (int64_t first = 0; first < p_.batch; first += chunk_) {
      GemmSpec spec;
      spec.rows = p_.out_channels;
      spec.cols = pixels_;
      spec.depth = v.depth;
      spec.elem = elem_code(out_.elem);
      spec.batch = std::min(chunk_, p_.batch - first);
      spec.b_batch_stride = pointwise_ ? sample_in() : v.depth * pixels_;
      spec.d_batch_stride = sample_out();
      if (v.fused) {
        spec.bias = row_bias ? GemmSpec::Bias::PerRow : GemmSpec::Bias::None;
        spec.accumulate = residual_.data != nullptr;
        spec.relu = p_.activation == UnaryOp::Relu;
      }
      auto plan = blas_->plan(spec, operands(v, first, row_bias), ctx_.stream, label_);
      if (!plan) return std::nullopt;
      v.chunks.push_back({first, spec.batch, std::move(plan)});
    }
    return v;
  }

  std::optional<Variant> variant(bool fused) const {
    Variant v;
    v.fused = fused;
    v.weights = w_.data;
    v.depth = depth_;
    return plan_chunks(std::move(v));
  }

  // W' = [W | bias | 0...] with `depth` columns, built on the device at prepare time.
  std::optional<Variant> augmented_variant(int64_t depth) const {
    Variant v;
    v.fused = true;
    v.depth = depth;
    const auto row_bytes = static_cast<size_t>(depth * elem_bytes_),
               weight_bytes = static_cast<size_t>(depth_ * elem_bytes_), elem = static_cast<size_t>(elem_bytes_);
    const auto rows = static_cast<size_t>(p_.out_channels);
    v.weight_memory = std::make_shared<DeviceBuffer>(rows * row_bytes, label_ + ": weights with the bias column");
    std::byte* memory = v.weight_memory->data();
    const std::string what = label_ + ": appending the bias to the weights";
    NPUSIM_CUDA_CHECK(cudaMemsetAsync(memory, 0, rows * row_bytes, ctx_.stream), what);
    NPUSIM_CUDA_CHECK(cudaMemcpy2DAsync(memory, row_bytes, w_.data, weight_bytes, weight_bytes, rows,
                                        cudaMemcpyDeviceToDevice, ctx_.stream),
                      what);
    NPUSIM_CUDA_CHECK(cudaMemcpy2DAsync(memory + weight_bytes, row_bytes, bias_.data, elem, elem, rows,
                                        cudaMemcpyDeviceToDevice, ctx_.stream),
                      what);
    NPUSIM_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream), what);
    v.weights = memory;
    return plan_chunks(std::move(v));
  }

  double epilogue_ms() const {
    return time_on_stream(
        ctx_.stream,
        [&] {
          check_launch(launch_conv_epilogue(ctx_.stream, p_, out_.data, elem_code(out_.elem), bias_, residual_),
                       "launch_conv_epilogue", ctx_.node);
        },
        label_);
  }

  Launch launch(Variant v, bool epilogue_kernel) const {
    return [node = &ctx_.node, self = *this, v = std::move(v), epilogue_kernel](cudaStream_t stream) {
      const bool row_bias = v.fused && self.bias_.data && v.weights == self.w_.data;
      for (const Chunk& chunk : v.chunks) {
        if (!self.pointwise_) {
          const Operand first_sample{self.x_.data + chunk.first * self.sample_in() * self.elem_bytes_,
                                     elem_code(self.x_.elem)};
          check_launch(launch_im2col(stream, self.p_, chunk.count, v.depth, self.ctx_.scratch->data(), first_sample),
                       "launch_im2col", *node);
        }
        chunk.plan->run(stream, self.operands(v, chunk.first, row_bias), self.label_);
      }
      if (epilogue_kernel)
        check_launch(launch_conv_epilogue(stream, self.p_, self.out_.data, elem_code(self.out_.elem), self.bias_,
                                          self.residual_),
                     "launch_conv_epilogue", *node);
    };
  }

  OpContext ctx_;
  Blas* blas_;
  ConvParams p_;
  DeviceValue x_, w_, out_;
  Operand bias_, residual_;
  int64_t pixels_ = 0, depth_ = 0, elem_bytes_ = 0, chunk_ = 1;
  bool pointwise_ = false;
  std::string label_;
};

std::optional<Launch> conv_as_gemm(const OpContext& ctx, const ConvParams& p, const DeviceValue& x,
                                   const DeviceValue& w, const DeviceValue& out, Operand bias, Operand residual) {
  Blas* blas = Blas::instance();
  if (!blas || p.groups != 1 || x.elem != w.elem || w.elem != out.elem || !cpu::is_float_elem(out.elem))
    return std::nullopt;
  const int64_t pixels = p.out_h * p.out_w, depth = p.in_channels * p.kernel_h * p.kernel_w;
  if (pixels == 0 || depth == 0 || p.out_channels == 0 || p.batch == 0) return std::nullopt;
  if (std::max({pixels, depth, p.out_channels, p.batch}) >= std::numeric_limits<int>::max()) return std::nullopt;
  if (!ctx.scratch || !ctx.stream) return std::nullopt;
  return ConvAsGemm(ctx, blas, p, x, w, out, bias, residual).make();
}

Launch direct_conv(const OpContext& ctx, const ConvParams& p, const DeviceValue& x, const DeviceValue& w,
                   const DeviceValue& out, Operand bias, Operand residual) {
  return [node = &ctx.node, p, out, x, w, bias, residual](cudaStream_t stream) {
    check_launch(launch_conv2d(stream, p, out.data, elem_code(out.elem), as_operand(x), as_operand(w), bias, residual),
                 "launch_conv2d", *node);
  };
}

// One way to run a convolution, timed against the others at prepare.
struct ConvCandidate {
  std::string name;
  Launch launch;
  bool cudnn = false;
};

// The convolution on cuDNN: the fused call (bias, residual and ReLU in cuDNN) where the epilogue fits it, and the
// convolution alone followed by the epilogue kernel. Nothing when cuDNN is absent or takes neither; a cuDNN failure
// while planning leaves the node to the other paths.
std::vector<ConvCandidate> conv_on_cudnn(const OpContext& ctx, const ConvParams& p, const DeviceValue& x,
                                         const DeviceValue& w, const DeviceValue& out, Operand bias, Operand residual) {
  std::vector<ConvCandidate> candidates;
  Cudnn* dnn = Cudnn::instance();
  if (!dnn || x.elem != w.elem || w.elem != out.elem || !cpu::is_float_elem(out.elem)) return candidates;
  if (!ctx.scratch || !ctx.stream) return candidates;
  const CudnnConvRequest request{p, elem_code(out.elem), x.data, w.data, out.data, bias, residual};
  const bool has_epilogue = conv_has_epilogue(p, bias, residual);
  const std::string label = describe_node(ctx.node);
  for (const bool fused : {true, false}) {
    if (fused && !Cudnn::can_fuse(request)) continue;
    std::shared_ptr<const CudnnConvolution> plan;
    try {
      plan = dnn->plan(request, fused, ctx.stream, label);
    } catch (const Error& error) {
      if (environment_is("NPUSIM_CUDA_CONV_LOG", "1"))
        std::fprintf(stderr, "npusim conv: %s: cuDNN left out: %s\n", label.c_str(), error.what());
      cudaGetLastError();
      continue;
    }
    if (!plan) continue;
    ctx.scratch->reserve(plan->workspace_bytes(), label + ": cuDNN workspace");
    const bool epilogue_kernel = !fused && has_epilogue;
    Launch launch = [node = &ctx.node, plan, scratch = ctx.scratch, p, out, bias, residual,
                     epilogue_kernel](cudaStream_t stream) {
      plan->run(stream, scratch->data(), describe_node(*node));
      if (epilogue_kernel)
        check_launch(launch_conv_epilogue(stream, p, out.data, elem_code(out.elem), bias, residual),
                     "launch_conv_epilogue", *node);
    };
    candidates.push_back(
        {std::string("cuDNN ") + (fused ? "fused" : "+ epilogue") + " algo " + std::to_string(plan->algorithm()),
         std::move(launch), true});
  }
  return candidates;
}

// The fastest candidate, each timed as a whole launch on the node's buffers (the output is overwritten).
std::optional<Launch> fastest(const OpContext& ctx, std::vector<ConvCandidate> candidates) {
  if (candidates.empty()) return std::nullopt;
  const std::string label = describe_node(ctx.node);
  size_t best = 0;
  std::vector<double> times(candidates.size(), 0.0);
  if (candidates.size() > 1) {
    for (size_t i = 0; i < candidates.size(); ++i)
      times[i] = time_on_stream(
          ctx.stream, [&] { candidates[i].launch(ctx.stream); }, label);
    best = static_cast<size_t>(std::min_element(times.begin(), times.end()) - times.begin());
  }
  if (environment_is("NPUSIM_CUDA_CONV_LOG", "1")) {
    std::string line;
    for (size_t i = 0; i < candidates.size(); ++i)
      line += (i ? ", " : "") + candidates[i].name + " " + std::to_string(times[i]) + " ms";
    std::fprintf(stderr, "npusim conv: %s: %s; chosen %s\n", label.c_str(), line.c_str(),
                 candidates[best].name.c_str());
  }
  if (candidates[best].cudnn) count_cudnn_convolution_chosen();
  return std::move(candidates[best].launch);
}

std::optional<Launch> conv_op(const OpContext& ctx) {
  const Attrs& a = ctx.node.attrs;
  if (ctx.outputs.size() != 1 || ctx.inputs.size() < 2) return std::nullopt;
  if (!a.is_none("padding_mode")) return std::nullopt;
  const bool fused = ctx.node.op == "fused_conv2d";
  const bool has_bias = fused ? a.get_bool("has_bias", false) : ctx.inputs.size() == 3;
  const bool has_residual = fused && a.get_bool("has_residual", false);
  if (ctx.inputs.size() != 2 + (has_bias ? 1u : 0u) + (has_residual ? 1u : 0u)) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], w = ctx.inputs[1], out = ctx.outputs[0];
  const Shape& xs = x.meta.shape;
  const Shape& ws = w.meta.shape;
  const Shape& os = out.meta.shape;
  if (ws.size() != 4 || (xs.size() != 4 && xs.size() != 3) || os.size() != xs.size()) return std::nullopt;
  const size_t first = xs.size() - 3;
  ConvParams p{};
  p.batch = xs.size() == 4 ? xs[0] : 1;
  p.in_channels = xs[first];
  p.in_h = xs[first + 1];
  p.in_w = xs[first + 2];
  p.out_channels = os[first];
  p.out_h = os[first + 1];
  p.out_w = os[first + 2];
  p.kernel_h = ws[2];
  p.kernel_w = ws[3];
  const auto stride = pair_of(a, "stride", {1}), padding = pair_of(a, "padding", {0}),
             dilation = pair_of(a, "dilation", {1});
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) return std::nullopt;
  p.stride_h = stride[0];
  p.stride_w = stride[1];
  p.pad_h = padding[0];
  p.pad_w = padding[1];
  p.dilation_h = dilation[0];
  p.dilation_w = dilation[1];
  p.groups = a.get_int("groups", 1);
  p.activation = UnaryOp::Identity;
  if (fused) {
    const std::string activation = a.get_string("activation");
    if (activation == "hardtanh") {
      p.use_clamp = true;
      p.min_val = static_cast<float>(a.get_float("min_val", -1.0));
      p.max_val = static_cast<float>(a.get_float("max_val", 1.0));
    } else if (activation != "none") {
      const auto op = unary_of(activation, a);
      if (!op) return std::nullopt;
      p.activation = *op;
    }
  }
  const Operand bias = has_bias ? as_operand(ctx.inputs[2]) : none();
  const Operand residual = has_residual ? as_operand(ctx.inputs.back()) : none();
  std::vector<ConvCandidate> candidates;
  const ConvPath path = conv_path_from_environment();
  if (path != ConvPath::Lt) candidates = conv_on_cudnn(ctx, p, x, w, out, bias, residual);
  if (path != ConvPath::Cudnn || candidates.empty()) {
    std::optional<Launch> gemm = conv_as_gemm(ctx, p, x, w, out, bias, residual);
    if (gemm)
      candidates.push_back({"im2col + cuBLASLt", std::move(*gemm), false});
    else
      candidates.push_back({"direct", direct_conv(ctx, p, x, w, out, bias, residual), false});
  }
  return fastest(ctx, std::move(candidates));
}

std::optional<Launch> max_pool_op(const OpContext& ctx) {
  const Attrs& a = ctx.node.attrs;
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], out = ctx.outputs[0];
  const Shape& xs = x.meta.shape;
  const Shape& os = out.meta.shape;
  if ((xs.size() != 4 && xs.size() != 3) || os.size() != xs.size()) return std::nullopt;
  const std::optional<ops::PoolWindow> window = ops::pool_window(a, true);
  if (!window) return std::nullopt;
  const size_t r = xs.size();
  PoolParams p{};
  p.planes = x.numel() / (xs[r - 2] * xs[r - 1] == 0 ? 1 : xs[r - 2] * xs[r - 1]);
  p.in_h = xs[r - 2];
  p.in_w = xs[r - 1];
  p.out_h = os[r - 2];
  p.out_w = os[r - 1];
  p.kernel_h = window->kernel[0];
  p.kernel_w = window->kernel[1];
  p.stride_h = window->stride[0];
  p.stride_w = window->stride[1];
  p.pad_h = window->pad[0];
  p.pad_w = window->pad[1];
  p.dilation_h = window->dilation[0];
  p.dilation_w = window->dilation[1];
  if (p.in_h * p.in_w == 0) return std::nullopt;
  return [node = &ctx.node, p, out, x](cudaStream_t stream) {
    check_launch(launch_max_pool2d(stream, p, out.data, elem_code(out.elem), as_operand(x)), "launch_max_pool2d",
                 *node);
  };
}

std::optional<Launch> adaptive_avg_pool_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], out = ctx.outputs[0];
  const Shape& xs = x.meta.shape;
  const Shape& os = out.meta.shape;
  if ((xs.size() != 4 && xs.size() != 3) || os.size() != xs.size()) return std::nullopt;
  const size_t r = xs.size();
  const int64_t in_h = xs[r - 2], in_w = xs[r - 1], out_h = os[r - 2], out_w = os[r - 1];
  if (in_h * in_w == 0 || out_h * out_w == 0) return std::nullopt;
  const int64_t planes = x.numel() / (in_h * in_w);
  return [node = &ctx.node, planes, in_h, in_w, out_h, out_w, out, x](cudaStream_t stream) {
    check_launch(launch_adaptive_avg_pool2d(stream, planes, in_h, in_w, out_h, out_w, out.data, elem_code(out.elem),
                                            as_operand(x)),
                 "launch_adaptive_avg_pool2d", *node);
  };
}

std::map<std::string, OpFactory> build_table() {
  std::map<std::string, OpFactory> table;
  for (const std::string& op : kViewOps) table[op] = view_op;
  table["to"] = to_op;
  for (const char* op : {"transpose", "permute", "t"}) table[op] = transpose_op;
  table["expand"] = expand_op;
  for (const char* op : {"slice", "select", "narrow"}) table[op] = slice_op;
  table["cat"] = cat_op;
  for (const auto& [name, op] : kBinaryOps) table[name] = binary_op;
  for (const char* op : {"relu", "silu", "sigmoid", "tanh", "gelu", "neg", "exp"}) table[op] = unary_op;
  table["where"] = where_op;
  table["rope"] = rope_op;
  table["rms_norm"] = rms_norm_op;
  for (const char* op : {"layer_norm", "native_layer_norm"}) table[op] = layer_norm_op;
  table["embedding"] = embedding_op;
  table["index_copy"] = index_copy_op;
  table["index"] = index_op;
  table["rotary_embedding"] = rotary_embedding_op;
  for (const char* op : {"softmax", "log_softmax"}) table[op] = softmax_op;
  table["attention"] = attention_op;
  table["linear"] = linear_op;
  for (const char* op : {"matmul", "mm", "bmm", "addmm"}) table[op] = matmul_op;
  table["conv2d"] = conv_op;
  table["fused_conv2d"] = conv_op;
  table["max_pool2d"] = max_pool_op;
  table["adaptive_avg_pool2d"] = adaptive_avg_pool_op;
  add_generated_pointwise_ops(table);
  add_generated_reduction_ops(table);
  return table;
}

}  // namespace

std::optional<RopeCacheJob> rope_job(const OpContext& ctx) {
  if (ctx.inputs.size() != 3 || ctx.outputs.size() != 1) return std::nullopt;
  return rope_job(ctx, ctx.inputs[0], strides_of(ctx.inputs[0].meta.shape));
}

std::optional<RopeCacheJob> rope_job(const OpContext& ctx, const DeviceValue& x,
                                     const std::vector<int64_t>& x_strides) {
  if (ctx.inputs.size() != 3 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue out = ctx.outputs[0];
  const Shape& shape = out.meta.shape;
  // The kernel finds the rotated partner of an element at +-width/2 elements: x's last dim must be contiguous.
  if (shape.empty() || ctx.inputs[0].meta.shape != shape || x_strides.size() != shape.size() || x_strides.back() != 1)
    return std::nullopt;
  const auto ix =
      make_indexer(shape, {strides_of(shape), x_strides, ops::broadcast_strides(ctx.inputs[1].meta.shape, shape),
                           ops::broadcast_strides(ctx.inputs[2].meta.shape, shape)});
  if (!ix) return std::nullopt;
  RopeCacheJob job;
  job.kind = RopeCacheKind::RopeToOutput;
  job.count = out.numel();
  job.ix = *ix;
  job.width = shape.back();
  job.out = out.data;
  job.out_elem = elem_code(out.elem);
  job.x = as_operand(x);
  job.cos = as_operand(ctx.inputs[1]);
  job.sin = as_operand(ctx.inputs[2]);
  return job;
}

std::optional<RopeCacheJob> cache_write_job(const OpContext& ctx) {
  if (ctx.inputs.size() != 3 || ctx.outputs.size() != 1 || ctx.inputs[0].data != ctx.outputs[0].data)
    return std::nullopt;
  return index_copy_geometry(ctx);
}

RopeCacheJob rope_into_cache(RopeCacheJob rope, const RopeCacheJob& slot) {
  rope.kind = RopeCacheKind::RopeToCache;
  rope.out = slot.out;
  rope.out_elem = slot.out_elem;
  rope.dim_size = slot.dim_size;
  rope.inner = slot.inner;
  rope.index_count = slot.index_count;
  rope.index = slot.index;
  rope.error = slot.error;
  return rope;
}

std::optional<RopeCacheJob> cache_write_job(const OpContext& ctx, const DeviceValue& source,
                                            const std::vector<int64_t>& source_strides) {
  std::optional<RopeCacheJob> job = cache_write_job(ctx);
  const Shape& shape = ctx.inputs[2].meta.shape;
  if (!job || source_strides.size() != shape.size()) return std::nullopt;
  const auto dim =
      static_cast<size_t>(ops::normalize_dim(ctx.node.attrs.get_int("dim"), static_cast<int64_t>(shape.size())));
  // The dims after `dim` must be contiguous in the source, the ones before it one evenly strided run.
  int64_t inner = 1;
  for (size_t d = shape.size(); d-- > dim + 1;) {
    if (shape[d] != 1 && source_strides[d] != inner) return std::nullopt;
    inner *= shape[d];
  }
  std::optional<int64_t> outer_stride;
  int64_t run = 0;
  for (size_t d = dim; d-- > 0;) {
    if (shape[d] == 1) continue;
    if (outer_stride && source_strides[d] != run) return std::nullopt;
    if (!outer_stride) outer_stride = source_strides[d];
    run = source_strides[d] * shape[d];
  }
  job->x = as_operand(source);
  job->source_index_stride = source_strides[dim];
  job->source_outer_stride = outer_stride.value_or(0);
  return job;
}

std::optional<Launch> linear_with_residual(const OpContext& ctx, const DeviceValue& residual, const DeviceValue& out) {
  if (ctx.inputs.size() < 2 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue x = ctx.inputs[0], w = ctx.inputs[1], y = ctx.outputs[0];
  if (w.meta.shape.size() != 2 || x.meta.shape.empty() || !gemm_epilogues_enabled()) return std::nullopt;
  const int64_t n = w.meta.shape[0], k = w.meta.shape[1];
  const int64_t m = k > 0 ? x.numel() / k : 0;
  if (x.meta.shape.back() != k || m <= 1 || n <= 0 || std::max({m, n, k}) >= std::numeric_limits<int>::max() ||
      x.elem != w.elem || w.elem != y.elem || residual.elem != y.elem || out.elem != y.elem ||
      residual.meta.shape != y.meta.shape || out.meta.shape != y.meta.shape || !cpu::is_float_elem(y.elem))
    return std::nullopt;
  const Operand bias = ctx.inputs.size() == 3 ? as_operand(ctx.inputs[2]) : none();
  return library_linear(ctx, m, n, k, bias, &residual, &out);
}

std::optional<Launch> attention_with_heads_inner(const OpContext& ctx, const DeviceValue& out) {
  std::optional<AttentionParams> p = attention_params(ctx);
  if (!p) return std::nullopt;
  const DeviceValue& k = ctx.inputs[1];
  const DeviceValue& v = ctx.inputs[2];
  if (!p->tensor_cores || k.elem != v.elem || !mma_attention_applies(*p, elem_code(k.elem), k.data, v.data) ||
      out.numel() != ctx.outputs[0].numel() || out.elem != ctx.outputs[0].elem)
    return std::nullopt;
  p->heads_inner_output = true;
  return attention_launch(ctx, *p, out);
}

std::optional<Launch> cache_prefetch_launch(const OpContext& ctx) {
  if (ctx.node.op != "attention" || environment_is("NPUSIM_CUDA_CACHE_PREFETCH", "0")) return std::nullopt;
  const std::optional<AttentionParams> p = attention_params(ctx);
  const DeviceValue& k = ctx.inputs[1];
  const DeviceValue& v = ctx.inputs[2];
  if (!p || p->length != 1 || (p->cache_position && !p->positions_ready) || k.elem != v.elem ||
      p->k_heads != p->v_heads)
    return std::nullopt;
  return [node = &ctx.node, p = *p, k, v](cudaStream_t stream) {
    check_launch(launch_cache_prefetch(stream, p, elem_code(k.elem), k.data, v.data), "launch_cache_prefetch", *node);
  };
}

std::optional<std::vector<int64_t>> transposed_source_strides(const Node& node, const Shape& input_shape) {
  const auto order = dim_order(node, input_shape);
  if (!order) return std::nullopt;
  const std::vector<int64_t> in_strides = strides_of(input_shape);
  std::vector<int64_t> strides(order->size());
  for (size_t d = 0; d < strides.size(); ++d) strides[d] = in_strides[static_cast<size_t>((*order)[d])];
  return strides;
}

double rms_norm_eps(const Node& node, DType dtype) {
  return node.attrs.is_none("eps") ? machine_epsilon(dtype) : node.attrs.get_float("eps");
}

const std::map<std::string, OpFactory>& op_table() {
  static const std::map<std::string, OpFactory> table = build_table();
  return table;
}

std::vector<std::string> kernel_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, factory] : op_table()) ops.push_back(name);
  return ops;
}

bool output_aliases_input(const Node& node, const Graph& graph) {
  if (node.inputs.empty() || node.outputs.size() != 1) return false;
  if (kViewOps.count(node.op)) return true;
  const Shape& shape = graph.value(node.inputs[0]).meta.shape;
  const auto order = dim_order(node, shape);
  if (!order) return false;
  int64_t last = -1;
  for (int64_t d : *order) {
    if (shape[static_cast<size_t>(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

std::string describe_node(const Node& node) { return "node '" + node.name + "' (" + node.op + ")"; }

void check_launch(cudaError_t result, const char* launcher, const Node& node) {
  check_cuda(result, launcher, describe_node(node));
}

}  // namespace npusim::cuda
