// Neural-network kernels: softmax and log_softmax along any dim, masked_softmax, rms_norm, layer_norm, inference
// batch_norm, embedding, max/avg/adaptive pooling, and attention (scaled_dot_product_attention and the fused
// attention op). Lines are converted to fp32 in per-thread scratch, statistics accumulate in double like the
// reference, and results are stored in the output's storage type.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "backends/cpu/attention_kernels.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/vector_math.h"
#include "ops/gemm.h"
#include "ops/pool_window.h"

namespace npusim::cpu {

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

bool floating_io(const KernelContext& ctx, size_t inputs) {
  if (ctx.inputs.size() < inputs || ctx.outputs.empty()) return false;
  for (size_t i = 0; i < inputs; ++i)
    if (!is_floating(ctx.inputs[i].meta.dtype)) return false;
  return is_floating(ctx.outputs[0].meta.dtype);
}

// A dim of a shape as [outer, size, inner].
struct Lines {
  int64_t outer = 1, size = 1, inner = 1;
  int64_t count() const { return outer * inner; }
  int64_t start(int64_t line) const { return line / inner * size * inner + line % inner; }
};

Lines lines_along(const Shape& shape, int64_t dim) {
  Lines l;
  if (shape.empty()) return l;
  const auto d = static_cast<size_t>(ops::normalize_dim(dim, static_cast<int64_t>(shape.size())));
  for (size_t i = 0; i < d; ++i) l.outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) l.inner *= shape[i];
  l.size = shape[d];
  return l;
}

void load_line(const Buffer& b, int64_t start, int64_t stride, int64_t count, float* out) {
  if (stride == 1) {
    to_float(b.data + static_cast<size_t>(start) * elem_size(b.elem), b.elem, out, count);
    return;
  }
  for (int64_t i = 0; i < count; ++i) out[i] = load_float(b.data, b.elem, start + i * stride);
}

void store_line(const float* values, const Buffer& b, int64_t start, int64_t stride, int64_t count) {
  if (stride == 1) {
    from_float(values, b.data + static_cast<size_t>(start) * elem_size(b.elem), b.elem, count);
    return;
  }
  for (int64_t i = 0; i < count; ++i) store_float(b.data, b.elem, start + i * stride, values[i]);
}

// Runs fn(line, worker) for every line, split over the pool when the work is large.
template <typename Fn>
void for_lines(ThreadPool& pool, int64_t lines, int64_t line_size, const Fn& fn) {
  auto range = [&](int64_t begin, int64_t end, int worker) {
    for (int64_t line = begin; line < end; ++line) fn(line, worker);
  };
  if (lines * line_size < kParallelElements)
    range(0, lines, 0);
  else
    pool.parallel_for(lines, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(line_size, 1)), range);
}

// Softmax of one line in place, as the reference: shifted by the max, sums in double; all -inf gives NaN unless
// `zero_masked` (then zeros).
void softmax_line(float* x, int64_t n, bool log, bool zero_masked = false) {
  float peak = kNegativeInfinity;
  for (int64_t i = 0; i < n; ++i) peak = std::isnan(x[i]) || x[i] > peak ? x[i] : peak;
  if (zero_masked && peak == kNegativeInfinity) {
    std::fill(x, x + n, 0.0f);
    return;
  }
  double sum = 0.0;
  if (!log && vector_exp_shifted(x, n, peak, sum)) {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] / sum);
    return;
  }
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - peak);
  if (log) {
    const double shift = peak + std::log(sum);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] - shift);
    return;
  }
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::exp(static_cast<double>(x[i]) - peak) / sum);
}

// ---------------------------------------------------------------------------------------------------------------
// softmax / log_softmax / masked_softmax

std::optional<Kernel> softmax_kernel(const KernelContext& ctx, bool log) {
  if (!floating_io(ctx, 1) || ctx.inputs.size() != 1) return std::nullopt;
  const Buffer in = ctx.inputs[0], out = ctx.outputs[0];
  const Lines l = lines_along(in.meta.shape, ctx.node.attrs.get_int("dim"));
  ctx.scratch.reserve_per_worker(floats_bytes(l.size));
  Kernel kernel;
  kernel.run = [=, pool = &ctx.pool, scratch = &ctx.scratch] {
    for_lines(*pool, l.count(), l.size, [&](int64_t line, int worker) {
      float* x = scratch->worker_as<float>(worker);
      const int64_t start = l.start(line);
      load_line(in, start, l.inner, l.size, x);
      softmax_line(x, l.size, log);
      store_line(x, out, start, l.inner, l.size);
    });
  };
  share_all_inputs(kernel, ctx);
  return kernel;
}

std::optional<Kernel> softmax(const KernelContext& ctx) { return softmax_kernel(ctx, false); }
std::optional<Kernel> log_softmax(const KernelContext& ctx) { return softmax_kernel(ctx, true); }

// softmax(scores + mask) over the last dim; both broadcast to the output.
std::optional<Kernel> masked_softmax(const KernelContext& ctx) {
  if (ctx.inputs.size() != 2 || !is_floating(ctx.inputs[0].meta.dtype) || ctx.outputs.size() != 1) return std::nullopt;
  const Buffer scores = ctx.inputs[0], mask = ctx.inputs[1], out = ctx.outputs[0];
  const Shape& shape = out.meta.shape;
  if (shape.empty()) return std::nullopt;
  const int64_t width = shape.back();
  std::vector<std::vector<int64_t>> row_strides;
  std::array<int64_t, 2> column{};
  for (size_t k = 0; k < 2; ++k) {
    std::vector<int64_t> strides = ops::broadcast_strides(ctx.inputs[k].meta.shape, shape);
    column[k] = strides.back();
    strides.pop_back();
    row_strides.push_back(strides);
  }
  const Shape rows_shape(shape.begin(), shape.end() - 1);
  std::optional<StridedLoop> loop = make_loop(rows_shape, row_strides);
  if (!loop) return std::nullopt;
  ctx.scratch.reserve_per_worker(floats_bytes(2 * width));
  const int64_t rows = shape_numel(rows_shape);
  Kernel kernel;
  kernel.run = [=, loop = *loop, pool = &ctx.pool, scratch = &ctx.scratch] {
    auto range = [&](int64_t begin, int64_t end, int worker) {
      float* x = scratch->worker_as<float>(worker);
      float* m = x + width;
      walk(loop, begin, end, [&](int64_t row, int64_t count, const int64_t* offsets) {
        for (int64_t r = 0; r < count; ++r) {
          load_line(scores, offsets[0] + r * loop.inner_stride(0), column[0], width, x);
          load_line(mask, offsets[1] + r * loop.inner_stride(1), column[1], width, m);
          for (int64_t i = 0; i < width; ++i) x[i] += m[i];
          softmax_line(x, width, false);
          store_line(x, out, (row + r) * width, 1, width);
        }
      });
    };
    if (rows * width < kParallelElements)
      range(0, rows, 0);
    else
      pool->parallel_for(rows, 1, range);
  };
  share_all_inputs(kernel, ctx);
  return kernel;
}

// ---------------------------------------------------------------------------------------------------------------
// rms_norm / layer_norm over the trailing normalized_shape dims; batch_norm per channel

double machine_epsilon(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return std::numeric_limits<double>::epsilon();
    case DType::Float16:
      return 0.0009765625;
    case DType::BFloat16:
      return 0.0078125;
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

int64_t normalized_size(const KernelContext& ctx) {
  const std::vector<int64_t> normalized = ctx.node.attrs.get_ints("normalized_shape");
  const Shape& x = ctx.inputs[0].meta.shape;
  if (normalized.size() > x.size() ||
      !std::equal(normalized.begin(), normalized.end(), x.end() - static_cast<int64_t>(normalized.size())))
    return -1;
  return shape_numel(normalized);
}

std::optional<Kernel> rms_norm(const KernelContext& ctx) {
  if (!floating_io(ctx, ctx.inputs.size()) || ctx.inputs.size() > 2) return std::nullopt;
  const int64_t width = normalized_size(ctx);
  if (width < 0) return std::nullopt;
  const Buffer x = ctx.inputs[0], out = ctx.outputs[0];
  const std::optional<Buffer> weight = ctx.inputs.size() == 2 ? std::optional(ctx.inputs[1]) : std::nullopt;
  const double eps = ctx.node.attrs.is_none("eps") ? machine_epsilon(out.meta.dtype) : ctx.node.attrs.get_float("eps");
  const int64_t rows = width > 0 ? x.numel() / width : 0;
  ctx.scratch.reserve_per_worker(floats_bytes(2 * width));
  Kernel kernel;
  kernel.run = [=, pool = &ctx.pool, scratch = &ctx.scratch] {
    for_lines(*pool, rows, width, [&](int64_t row, int worker) {
      float* v = scratch->worker_as<float>(worker);
      float* w = v + width;
      load_line(x, row * width, 1, width, v);
      const double squares = sum_squared_deviations(v, width, 0.0);
      const auto scale = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(width) + eps));
      if (weight) {
        const float* g = float_data(weight->data, weight->elem, width, w);
        for (int64_t i = 0; i < width; ++i) v[i] = v[i] * scale * g[i];
      } else {
        for (int64_t i = 0; i < width; ++i) v[i] *= scale;
      }
      store_line(v, out, row * width, 1, width);
    });
  };
  kernel.shareable_inputs = {0};
  return kernel;
}

// layer_norm (one output) and native_layer_norm (also mean and rstd per row).
std::optional<Kernel> layer_norm(const KernelContext& ctx) {
  if (!floating_io(ctx, ctx.inputs.size()) || ctx.inputs.size() > 3) return std::nullopt;
  const int64_t width = normalized_size(ctx);
  if (width < 0) return std::nullopt;
  const Buffer x = ctx.inputs[0];
  const std::vector<Buffer> outs = ctx.outputs;
  const std::optional<Buffer> weight = ctx.inputs.size() >= 2 ? std::optional(ctx.inputs[1]) : std::nullopt;
  const std::optional<Buffer> bias = ctx.inputs.size() == 3 ? std::optional(ctx.inputs[2]) : std::nullopt;
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  const int64_t rows = width > 0 ? x.numel() / width : 0;
  ctx.scratch.reserve_per_worker(floats_bytes(3 * width));
  Kernel kernel;
  kernel.run = [=, pool = &ctx.pool, scratch = &ctx.scratch] {
    for_lines(*pool, rows, width, [&](int64_t row, int worker) {
      float* v = scratch->worker_as<float>(worker);
      load_line(x, row * width, 1, width, v);
      // Mean and variance in double (independent partial sums, not one chain of additions); the row normalized in
      // fp32.
      const double mean = width > 0 ? sum_in_double(v, width) / static_cast<double>(width) : 0.0;
      const double squares = sum_squared_deviations(v, width, mean);
      const double rstd = 1.0 / std::sqrt((width > 0 ? squares / static_cast<double>(width) : 0.0) + eps);
      const float* g = weight ? float_data(weight->data, weight->elem, width, v + width) : nullptr;
      const float* b = bias ? float_data(bias->data, bias->elem, width, v + 2 * width) : nullptr;
      const auto mean_f = static_cast<float>(mean), rstd_f = static_cast<float>(rstd);
      for (int64_t i = 0; i < width; ++i) v[i] = (v[i] - mean_f) * rstd_f;
      if (g)
        for (int64_t i = 0; i < width; ++i) v[i] *= g[i];
      if (b)
        for (int64_t i = 0; i < width; ++i) v[i] += b[i];
      store_line(v, outs[0], row * width, 1, width);
      if (outs.size() == 3) {
        store_float(outs[1].data, outs[1].elem, row, static_cast<float>(mean));
        store_float(outs[2].data, outs[2].elem, row, static_cast<float>(rstd));
      }
    });
  };
  kernel.shareable_inputs = {0};
  return kernel;
}

// Inference batch_norm: inputs x, [weight, [bias,]] running_mean, running_var; fused_batch_norm applies its
// activation to each chunk as it is normalized.
std::optional<Kernel> batch_norm(const KernelContext& ctx) {
  if (!floating_io(ctx, ctx.inputs.size()) || ctx.inputs.size() < 3 || ctx.inputs[0].meta.shape.size() < 2)
    return std::nullopt;
  if (ctx.node.attrs.get_bool("training", false)) return std::nullopt;
  std::optional<UnaryStep> activation;
  if (ctx.node.op == "fused_batch_norm" && ctx.node.attrs.get_string("activation") != "none") {
    activation = unary_step(ctx.node.attrs.get_string("activation"), ctx.node.attrs);
    if (!activation) return std::nullopt;
  }
  const size_t count = ctx.inputs.size();
  const Buffer x = ctx.inputs[0], out = ctx.outputs[0];
  const std::optional<Buffer> weight = count >= 4 ? std::optional(ctx.inputs[1]) : std::nullopt;
  const std::optional<Buffer> bias = count == 5 ? std::optional(ctx.inputs[2]) : std::nullopt;
  const Buffer mean = ctx.inputs[count - 2], var = ctx.inputs[count - 1];
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  const int64_t channels = x.meta.shape[1];
  const int64_t inner = channels > 0 ? x.numel() / x.meta.shape[0] / channels : 0;
  for (size_t i = 1; i < ctx.outputs.size(); ++i)
    if (ctx.outputs[i].numel() != 0) return std::nullopt;
  const bool both_f32 = x.elem == Elem::F32 && out.elem == Elem::F32;
  Kernel kernel;
  kernel.run = [=, pool = &ctx.pool] {
    for_lines(*pool, x.meta.shape[0] * channels, inner, [&](int64_t plane, int) {
      const int64_t c = plane % channels;
      const double scale_d = (weight ? load_float(weight->data, weight->elem, c) : 1.0) /
                             std::sqrt(static_cast<double>(load_float(var.data, var.elem, c)) + eps);
      const auto scale = static_cast<float>(scale_d);
      const auto shift = static_cast<float>((bias ? load_float(bias->data, bias->elem, c) : 0.0) -
                                            load_float(mean.data, mean.elem, c) * scale_d);
      alignas(64) float block[kChunk];
      for (int64_t i = 0; i < inner; i += kChunk) {
        const int64_t n = std::min(kChunk, inner - i);
        // fp32 in and out: straight from the input into the output, no copy through the block.
        float* values = both_f32 ? out.as<float>() + plane * inner + i : block;
        if (both_f32)
          affine(x.as<const float>() + plane * inner + i, values, n, scale, shift);
        else {
          load_line(x, plane * inner + i, 1, n, block);
          affine(block, block, n, scale, shift);
        }
        if (activation) apply_unary(*activation, values, values, n);
        if (!both_f32) store_line(block, out, plane * inner + i, 1, n);
      }
    });
  };
  kernel.shareable_inputs = {0};
  return kernel;
}

// ---------------------------------------------------------------------------------------------------------------
// embedding: rows of the table picked by int64 indices

std::optional<Kernel> embedding(const KernelContext& ctx) {
  const Buffer table = ctx.inputs[0], indices = ctx.inputs[1], out = ctx.outputs[0];
  if (table.meta.shape.size() != 2 || indices.elem != Elem::I64 || table.elem != out.elem) return std::nullopt;
  const int64_t rows = table.meta.shape[0];
  const size_t row_bytes = static_cast<size_t>(table.meta.shape[1]) * elem_size(table.elem);
  const int64_t count = indices.numel();
  Kernel kernel;
  kernel.run = [=] {
    const int64_t* index = indices.as<const int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      if (index[i] < 0 || index[i] >= rows)
        fail("embedding: index " + std::to_string(index[i]) + " is out of range for a table of " +
             std::to_string(rows) + " rows");
      std::memcpy(out.data + static_cast<size_t>(i) * row_bytes, table.data + static_cast<size_t>(index[i]) * row_bytes,
                  row_bytes);
    }
  };
  return kernel;
}

// ---------------------------------------------------------------------------------------------------------------
// Pooling over the last two dims; output sizes come from the inferred output shape.

struct PoolPlan : ops::PoolWindow {
  int64_t planes = 0;
  std::array<int64_t, 2> in{1, 1}, out{1, 1};
  Buffer x, y;
  std::optional<Buffer> indices;
  bool count_include_pad = true;
  int64_t divisor_override = 0;
};

std::optional<PoolPlan> pool_plan(const KernelContext& ctx, bool with_dilation) {
  if (!is_floating(ctx.inputs[0].meta.dtype)) return std::nullopt;
  PoolPlan p;
  p.x = ctx.inputs[0];
  p.y = ctx.outputs[0];
  const Shape& in = p.x.meta.shape;
  const Shape& out = p.y.meta.shape;
  if (in.size() < 3 || in.size() > 4 || out.size() != in.size()) return std::nullopt;
  const std::optional<ops::PoolWindow> window = ops::pool_window(ctx.node.attrs, with_dilation);
  if (!window) return std::nullopt;
  static_cast<ops::PoolWindow&>(p) = *window;
  p.in = {in[in.size() - 2], in.back()};
  p.out = {out[out.size() - 2], out.back()};
  p.planes = shape_numel(Shape(in.begin(), in.end() - 2));
  return p;
}

// Runs fn(plane values as fp32, plane index, worker) over all planes in parallel.
template <typename Fn>
void for_planes(const PoolPlan& p, ThreadPool& pool, const ScratchSpace& scratch, const Fn& fn) {
  const int64_t in_plane = p.in[0] * p.in[1];
  for_lines(pool, p.planes, in_plane, [&](int64_t plane, int worker) {
    float* buffer = scratch.worker_as<float>(worker);
    const float* x =
        float_data(p.x.data + static_cast<size_t>(plane * in_plane) * elem_size(p.x.elem), p.x.elem, in_plane, buffer);
    fn(x, plane, buffer + in_plane);
  });
}

std::optional<Kernel> max_pool(const KernelContext& ctx) {
  std::optional<PoolPlan> plan = pool_plan(ctx, true);
  if (!plan) return std::nullopt;
  if (ctx.outputs.size() == 2) plan->indices = ctx.outputs[1];
  const int64_t out_plane = plan->out[0] * plan->out[1];
  ctx.scratch.reserve_per_worker(floats_bytes(plan->in[0] * plan->in[1] + out_plane));
  Kernel kernel;
  kernel.run = [p = *plan, out_plane, pool = &ctx.pool, scratch = &ctx.scratch] {
    for_planes(p, *pool, *scratch, [&](const float* x, int64_t plane, float* y) {
      for (int64_t oy = 0; oy < p.out[0]; ++oy)
        for (int64_t ox = 0; ox < p.out[1]; ++ox) {
          float best = kNegativeInfinity;
          int64_t best_index = -1;
          for (int64_t ky = 0; ky < p.kernel[0]; ++ky) {
            const int64_t iy = oy * p.stride[0] - p.pad[0] + ky * p.dilation[0];
            if (iy < 0 || iy >= p.in[0]) continue;
            for (int64_t kx = 0; kx < p.kernel[1]; ++kx) {
              const int64_t ix = ox * p.stride[1] - p.pad[1] + kx * p.dilation[1];
              if (ix < 0 || ix >= p.in[1]) continue;
              const float value = x[iy * p.in[1] + ix];
              if (best_index < 0 || value > best || std::isnan(value)) {
                best = value;
                best_index = iy * p.in[1] + ix;
              }
            }
          }
          y[oy * p.out[1] + ox] = best;
          if (p.indices)
            store_int(p.indices->data, p.indices->elem, plane * out_plane + oy * p.out[1] + ox, best_index);
        }
      store_line(y, p.y, plane * out_plane, 1, out_plane);
    });
  };
  return kernel;
}

// The sum of `rows` runs of `columns` values, `stride` apart, in double; runs that touch (a window of whole rows, as a
// global pool's) are summed as one. Short runs (a small window) are summed here: a call per run of two values cost
// more than the values (DenseNet-121's 2x2 pools 1.4 -> 0.1 ms each).
double rows_sum(const float* x, int64_t stride, int64_t rows, int64_t columns) {
  constexpr int64_t kShortRun = 16;
  if (columns == stride) return sum_in_double(x, rows * columns);
  double sum = 0.0;
  if (columns < kShortRun) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < columns; ++c) sum += x[r * stride + c];
    return sum;
  }
  for (int64_t r = 0; r < rows; ++r) sum += sum_in_double(x + r * stride, columns);
  return sum;
}

std::optional<Kernel> avg_pool(const KernelContext& ctx) {
  std::optional<PoolPlan> plan = pool_plan(ctx, false);
  if (!plan) return std::nullopt;
  plan->count_include_pad = ctx.node.attrs.get_bool("count_include_pad", true);
  plan->divisor_override = ctx.node.attrs.is_none("divisor_override") ? 0 : ctx.node.attrs.get_int("divisor_override");
  const int64_t out_plane = plan->out[0] * plan->out[1];
  ctx.scratch.reserve_per_worker(floats_bytes(plan->in[0] * plan->in[1] + out_plane));
  Kernel kernel;
  kernel.run = [p = *plan, out_plane, pool = &ctx.pool, scratch = &ctx.scratch] {
    // Most windows divide by the whole window: its reciprocal once instead of a division per output.
    const int64_t area = p.kernel[0] * p.kernel[1];
    const double area_inverse = 1.0 / static_cast<double>(area);
    for_planes(p, *pool, *scratch, [&](const float* x, int64_t plane, float* y) {
      for (int64_t oy = 0; oy < p.out[0]; ++oy)
        for (int64_t ox = 0; ox < p.out[1]; ++ox) {
          // The window clipped to the padded input counts for count_include_pad; clipped to the input for the sum.
          int64_t y0 = oy * p.stride[0] - p.pad[0], x0 = ox * p.stride[1] - p.pad[1];
          int64_t y1 = std::min(y0 + p.kernel[0], p.in[0] + p.pad[0]);
          int64_t x1 = std::min(x0 + p.kernel[1], p.in[1] + p.pad[1]);
          const int64_t padded_count = (y1 - y0) * (x1 - x0);
          y0 = std::max<int64_t>(y0, 0), x0 = std::max<int64_t>(x0, 0);
          y1 = std::min(y1, p.in[0]), x1 = std::min(x1, p.in[1]);
          const double sum = rows_sum(x + y0 * p.in[1] + x0, p.in[1], y1 - y0, x1 - x0);
          const int64_t divisor = p.divisor_override != 0 ? p.divisor_override
                                  : p.count_include_pad   ? padded_count
                                                          : (y1 - y0) * (x1 - x0);
          const double mean = divisor == area ? sum * area_inverse : sum / static_cast<double>(divisor);
          y[oy * p.out[1] + ox] = y0 < y1 && x0 < x1 ? static_cast<float>(mean) : 0.0f;
        }
      store_line(y, p.y, plane * out_plane, 1, out_plane);
    });
  };
  return kernel;
}

// Adaptive average pooling: window i covers [floor(i * in / out), ceil((i + 1) * in / out)).
std::optional<Kernel> adaptive_avg_pool(const KernelContext& ctx, size_t dims) {
  if (!is_floating(ctx.inputs[0].meta.dtype)) return std::nullopt;
  PoolPlan p;
  p.x = ctx.inputs[0];
  p.y = ctx.outputs[0];
  const Shape& in = p.x.meta.shape;
  const Shape& out = p.y.meta.shape;
  if (in.size() < dims + 1 || out.size() != in.size()) return std::nullopt;
  p.in = {dims == 2 ? in[in.size() - 2] : 1, in.back()};
  p.out = {dims == 2 ? out[out.size() - 2] : 1, out.back()};
  p.planes = shape_numel(Shape(in.begin(), in.end() - static_cast<int64_t>(dims)));
  const int64_t out_plane = p.out[0] * p.out[1];
  ctx.scratch.reserve_per_worker(floats_bytes(p.in[0] * p.in[1] + out_plane));
  Kernel kernel;
  kernel.run = [p, out_plane, pool = &ctx.pool, scratch = &ctx.scratch] {
    for_planes(p, *pool, *scratch, [&](const float* x, int64_t plane, float* y) {
      for (int64_t oy = 0; oy < p.out[0]; ++oy) {
        const int64_t y0 = oy * p.in[0] / p.out[0], y1 = ((oy + 1) * p.in[0] + p.out[0] - 1) / p.out[0];
        for (int64_t ox = 0; ox < p.out[1]; ++ox) {
          const int64_t x0 = ox * p.in[1] / p.out[1], x1 = ((ox + 1) * p.in[1] + p.out[1] - 1) / p.out[1];
          const double sum = rows_sum(x + y0 * p.in[1] + x0, p.in[1], y1 - y0, x1 - x0);
          y[oy * p.out[1] + ox] = static_cast<float>(sum / static_cast<double>((y1 - y0) * (x1 - x0)));
        }
      }
      store_line(y, p.y, plane * out_plane, 1, out_plane);
    });
  };
  return kernel;
}

std::optional<Kernel> adaptive_avg_pool2d(const KernelContext& ctx) { return adaptive_avg_pool(ctx, 2); }
std::optional<Kernel> adaptive_avg_pool1d(const KernelContext& ctx) { return adaptive_avg_pool(ctx, 1); }

// ---------------------------------------------------------------------------------------------------------------
// Attention: per (batch, head) scores = q · kᵀ, scaled, masked, softmax, · v, one thread per (batch, head).

struct AttentionPlan {
  int64_t length = 0, source = 0, embed = 0, value_embed = 0;
  std::vector<int64_t> q_offsets, k_offsets, v_offsets, mask_offsets;  // per (batch, head), in elements
  Buffer q, k, v, out;
  std::optional<Buffer> mask, cache_position;
  int64_t mask_row = 0, mask_column = 0;
  float scale = 1.0f;
  bool scale_in_gemm = true;  // scaled_dot_product_attention folds the scale into q · kᵀ; the fused op scales after
  bool causal = false;
  bool zero_masked_rows = true;
};

// Scratch floats per worker: fp32 copies of q, k, v, the scores and the fp32 output.
int64_t attention_scratch(const AttentionPlan& p) {
  return p.length * p.embed + p.source * p.embed + p.source * p.value_embed + p.length * p.source +
         p.length * p.value_embed + 5 * 16;
}

const float* operand(const Buffer& b, int64_t offset, int64_t count, float*& cursor) {
  if (b.elem == Elem::F32) return b.as<const float>() + offset;
  float* at = cursor;
  cursor += (count + 15) / 16 * 16;
  to_float(b.data + static_cast<size_t>(offset) * elem_size(b.elem), b.elem, at, count);
  return at;
}

void attend(const AttentionPlan& p, int64_t index, int64_t reads, float* scratch) {
  const int64_t L = p.length, E = p.embed, Ev = p.value_embed;
  float* cursor = scratch;
  const size_t i = static_cast<size_t>(index);
  const float* q = operand(p.q, p.q_offsets[i], L * E, cursor);
  const float* k = operand(p.k, p.k_offsets[i], reads * E, cursor);
  const float* v = operand(p.v, p.v_offsets[i], reads * Ev, cursor);
  float* scores = cursor;
  cursor += (L * reads + 15) / 16 * 16;
  ops::gemm_f32({.m = L,
                 .n = reads,
                 .k = E,
                 .a = q,
                 .lda = E,
                 .b = k,
                 .ldb = E,
                 .b_transposed = true,
                 .c = scores,
                 .ldc = reads,
                 .alpha = p.scale_in_gemm ? p.scale : 1.0f,
                 .max_threads = 1});
  for (int64_t row = 0; row < L; ++row) {
    float* s = scores + row * reads;
    if (!p.scale_in_gemm)
      for (int64_t j = 0; j < reads; ++j) s[j] *= p.scale;
    if (p.causal)
      for (int64_t j = row + 1; j < reads; ++j) s[j] = kNegativeInfinity;
    if (p.mask) {
      const Buffer& m = *p.mask;
      const int64_t base = p.mask_offsets[i] + row * p.mask_row;
      if (m.elem == Elem::Bool) {
        const uint8_t* keep = m.as<const uint8_t>() + base;
        for (int64_t j = 0; j < reads; ++j)
          if (!keep[j * p.mask_column]) s[j] = kNegativeInfinity;
      } else if (m.elem == Elem::F32 && p.mask_column == 1) {
        const float* add = m.as<const float>() + base;
        for (int64_t j = 0; j < reads; ++j) s[j] += add[j];
      } else {
        for (int64_t j = 0; j < reads; ++j) s[j] += load_float(m.data, m.elem, base + j * p.mask_column);
      }
    }
    softmax_line(s, reads, false, p.zero_masked_rows);
  }
  float* out = p.out.elem == Elem::F32 ? p.out.as<float>() + index * L * Ev : cursor;
  ops::gemm_f32({.m = L,
                 .n = Ev,
                 .k = reads,
                 .a = scores,
                 .lda = reads,
                 .b = v,
                 .ldb = Ev,
                 .c = out,
                 .ldc = Ev,
                 .max_threads = 1});
  if (p.out.elem != Elem::F32)
    from_float(out, p.out.data + static_cast<size_t>(index * L * Ev) * elem_size(p.out.elem), p.out.elem, L * Ev);
}

Kernel attention_kernel(const KernelContext& ctx, AttentionPlan plan) {
  ctx.scratch.reserve_per_worker(floats_bytes(attention_scratch(plan)));
  auto shared = std::make_shared<const AttentionPlan>(std::move(plan));
  Kernel kernel;
  kernel.run = [shared, pool = &ctx.pool, scratch = &ctx.scratch] {
    const AttentionPlan& p = *shared;
    int64_t reads = p.source;
    if (p.cache_position && p.cache_position->numel() > 0) {
      const int64_t* positions = p.cache_position->as<const int64_t>();
      reads = std::clamp<int64_t>(*std::max_element(positions, positions + p.cache_position->numel()) + 1, 0, p.source);
    }
    const auto count = static_cast<int64_t>(p.q_offsets.size());
    pool->parallel_for(count, 1, [&](int64_t begin, int64_t end, int worker) {
      for (int64_t index = begin; index < end; ++index) attend(p, index, reads, scratch->worker_as<float>(worker));
    });
  };
  return kernel;
}

// Mask offsets per (batch, head) over the scores [...batch dims, L, S] with the mask broadcast to them.
void plan_mask(AttentionPlan& p, const Shape& scores, size_t batch_dims) {
  const std::vector<int64_t> strides = ops::broadcast_strides(p.mask->meta.shape, scores);
  p.mask_row = strides[batch_dims];
  p.mask_column = strides[batch_dims + 1];
  const Shape batch(scores.begin(), scores.begin() + static_cast<std::ptrdiff_t>(batch_dims));
  const int64_t count = shape_numel(batch);
  for (int64_t b = 0; b < count; ++b) {
    int64_t offset = 0;
    for (size_t d = batch_dims, rest = static_cast<size_t>(b); d-- > 0;) {
      offset += static_cast<int64_t>(rest % static_cast<size_t>(batch[d])) * strides[d];
      rest /= static_cast<size_t>(batch[d]);
    }
    p.mask_offsets.push_back(offset);
  }
}

std::optional<Kernel> scaled_dot_product_attention(const KernelContext& ctx) {
  if (!floating_io(ctx, 3) || ctx.inputs.size() > 4) return std::nullopt;
  const Attrs& attrs = ctx.node.attrs;
  AttentionPlan p;
  p.q = ctx.inputs[0];
  p.k = ctx.inputs[1];
  p.v = ctx.inputs[2];
  p.out = ctx.outputs[0];
  const Shape &q = p.q.meta.shape, &k = p.k.meta.shape, &v = p.v.meta.shape;
  if (q.size() < 2 || k.size() < 2 || v.size() < 2) return std::nullopt;
  p.length = q.end()[-2];
  p.embed = q.back();
  p.source = k.end()[-2];
  p.value_embed = v.back();
  Shape q_batch(q.begin(), q.end() - 2), k_batch(k.begin(), k.end() - 2), v_batch(v.begin(), v.end() - 2);
  int grouped_dim = -1;
  int64_t key_group = 1, value_group = 1;
  if (attrs.get_bool("enable_gqa", false) && !q_batch.empty() && !k_batch.empty() && !v_batch.empty()) {
    key_group = q_batch.back() / k_batch.back();
    value_group = q_batch.back() / v_batch.back();
    k_batch.back() = q_batch.back();
    v_batch.back() = q_batch.back();
  }
  const Shape out_batch = ops::broadcast_shapes(ops::broadcast_shapes(q_batch, k_batch), v_batch);
  if (key_group != 1 || value_group != 1) grouped_dim = static_cast<int>(out_batch.size()) - 1;
  p.q_offsets = ops::batch_offsets(q, out_batch);
  p.k_offsets = ops::batch_offsets(k, out_batch, grouped_dim, key_group);
  p.v_offsets = ops::batch_offsets(v, out_batch, grouped_dim, value_group);
  if (shape_numel(out_batch) * p.length * p.value_embed != p.out.numel()) return std::nullopt;
  p.scale = static_cast<float>(attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(p.embed))
                                                      : attrs.get_float("scale"));
  p.causal = attrs.get_bool("is_causal", false);
  if (ctx.inputs.size() == 4) {
    p.mask = ctx.inputs[3];
    Shape scores = out_batch;
    scores.insert(scores.end(), {p.length, p.source});
    plan_mask(p, scores, out_batch.size());
  }
  return attention_kernel(ctx, std::move(p));
}

// The fused attention op: q [...batch, Hq, L, E], k [...batch, Hk, S, E], v [...batch, Hv, S, Ev].
std::optional<Kernel> fused_attention(const KernelContext& ctx) {
  if (std::optional<Kernel> decode = decode_attention(ctx)) return decode;
  if (!floating_io(ctx, 3)) return std::nullopt;
  const Attrs& attrs = ctx.node.attrs;
  AttentionPlan p;
  p.q = ctx.inputs[0];
  p.k = ctx.inputs[1];
  p.v = ctx.inputs[2];
  p.out = ctx.outputs[0];
  size_t next = 3;
  if (attrs.get_bool("has_mask", false)) p.mask = ctx.inputs.at(next++);
  if (attrs.get_bool("has_cache_position", false)) p.cache_position = ctx.inputs.at(next++);
  if (next != ctx.inputs.size() || (p.cache_position && p.cache_position->elem != Elem::I64)) return std::nullopt;
  const Shape &q = p.q.meta.shape, &k = p.k.meta.shape, &v = p.v.meta.shape;
  const size_t rank = q.size();
  if (rank < 3 || k.size() != rank || v.size() != rank) return std::nullopt;
  const Shape batch(q.begin(), q.end() - 3);
  const int64_t q_heads = q[rank - 3], k_heads = k[rank - 3], v_heads = v[rank - 3];
  if (k_heads == 0 || v_heads == 0 || q_heads % k_heads != 0 || q_heads % v_heads != 0) return std::nullopt;
  p.length = q[rank - 2];
  p.embed = q[rank - 1];
  p.source = k[rank - 2];
  p.value_embed = v[rank - 1];
  const int64_t batches = shape_numel(batch);
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t h = 0; h < q_heads; ++h) {
      p.q_offsets.push_back((b * q_heads + h) * p.length * p.embed);
      p.k_offsets.push_back((b * k_heads + h / (q_heads / k_heads)) * p.source * p.embed);
      p.v_offsets.push_back((b * v_heads + h / (q_heads / v_heads)) * p.source * p.value_embed);
    }
  p.scale = static_cast<float>(attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(p.embed))
                                                      : attrs.get_float("scale"));
  p.scale_in_gemm = false;
  p.causal = attrs.get_bool("is_causal", false);
  p.zero_masked_rows = attrs.get_bool("zero_masked_rows", false);
  if (p.mask) {
    Shape scores = batch;
    scores.insert(scores.end(), {q_heads, p.length, p.source});
    plan_mask(p, scores, batch.size() + 1);
  }
  return attention_kernel(ctx, std::move(p));
}

// ---------------------------------------------------------------------------------------------------------------
// rotary_embedding: cos and sin tables [B, S, 2 * half] of position * inv_freq, computed in fp32 as Hugging Face
// does, times attention_scaling.

std::optional<Kernel> rotary_embedding(const KernelContext& ctx) {
  if (ctx.inputs.size() != 2 || ctx.outputs.size() != 2 || !is_floating(ctx.inputs[0].meta.dtype) ||
      ctx.inputs[1].elem != Elem::I64)
    return std::nullopt;
  const Buffer frequencies = ctx.inputs[0], positions = ctx.inputs[1], cos = ctx.outputs[0], sin = ctx.outputs[1];
  const int64_t half = frequencies.numel();
  if (cos.numel() != positions.numel() * 2 * half) return std::nullopt;
  const auto scaling = static_cast<float>(ctx.node.attrs.get_float("attention_scaling", 1.0));
  ctx.scratch.reserve_shared(floats_bytes(5 * half));
  Kernel kernel;
  kernel.run = [=, scratch = &ctx.scratch] {
    float* inv_freq = scratch->shared_as<float>();
    float* c = inv_freq + half;
    float* s = c + 2 * half;
    to_float(frequencies.data, frequencies.elem, inv_freq, half);
    const int64_t* position = positions.as<const int64_t>();
    for (int64_t row = 0; row < positions.numel(); ++row) {
      const auto p = static_cast<float>(position[row]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = p * inv_freq[i];
        c[i] = c[i + half] = std::cos(angle) * scaling;
        s[i] = s[i + half] = std::sin(angle) * scaling;
      }
      store_line(c, cos, row * 2 * half, 1, 2 * half);
      store_line(s, sin, row * 2 * half, 1, 2 * half);
    }
  };
  return kernel;
}

}  // namespace

void add_nn_kernels(KernelTable& table) {
  table.add("rotary_embedding", rotary_embedding);
  table.add("softmax", softmax);
  table.add("log_softmax", log_softmax);
  table.add("masked_softmax", masked_softmax);
  table.add("rms_norm", rms_norm);
  table.add("layer_norm", layer_norm);
  table.add("native_layer_norm", layer_norm);
  table.add("batch_norm", batch_norm);
  table.add("native_batch_norm", batch_norm);
  table.add("fused_batch_norm", batch_norm);
  table.add("embedding", embedding);
  table.add("max_pool2d_with_indices", max_pool);
  table.add("avg_pool2d", avg_pool);
  table.add("adaptive_avg_pool2d", adaptive_avg_pool2d);
  table.add("adaptive_avg_pool1d", adaptive_avg_pool1d);
  table.add("scaled_dot_product_attention", scaled_dot_product_attention);
  table.add("attention", fused_attention);
}

}  // namespace npusim::cpu
