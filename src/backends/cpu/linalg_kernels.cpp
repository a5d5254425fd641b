// Matrix products on the shared fp32 GEMM: linear, matmul, mm, bmm, addmm, baddbmm. fp32 buffers are used in
// place; fp16/bf16 operands are converted to fp32 in scratch reserved at prepare time (linear's weight one panel
// of output columns at a time, per thread, so that a large weight never exists in fp32 whole).
#include <cstring>
#include <memory>

#include "backends/cpu/kernels.h"
#include "backends/cpu/strided_loop.h"
#include "ops/gemm.h"
#include "ops/op_util.h"

namespace npusim::cpu {

namespace {

// Work (multiply-adds) below which one GEMM is not worth splitting further.
constexpr int64_t kSmallGemm = int64_t{1} << 20;

bool float_node(const KernelContext& ctx) {
  if (ctx.outputs.size() != 1 || !is_floating(ctx.outputs[0].meta.dtype)) return false;
  for (const Buffer& in : ctx.inputs)
    if (!is_floating(in.meta.dtype)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// linear: out[M, N] = x[M, K] · W[N, K]^T + b

struct LinearPlan {
  int64_t m = 0, n = 0, k = 0;
  Buffer x, weight, out;
  std::optional<Buffer> bias;  // [N] or one value
  int64_t panel = 0;           // output columns per converted weight panel (fp16/bf16 weights)
};

// Writes bias[j] (or its single value) into every row of the fp32 matrix c.
void fill_bias(const Buffer& bias, int64_t rows, int64_t cols, int64_t first_col, float* c, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = c + i * ldc;
    if (bias.numel() == 1) {
      std::fill(row, row + cols, load_float(bias.data, bias.elem, 0));
    } else if (bias.elem == Elem::F32) {
      std::copy(bias.as<const float>() + first_col, bias.as<const float>() + first_col + cols, row);
    } else {
      to_float(bias.data + static_cast<size_t>(first_col) * elem_size(bias.elem), bias.elem, row, cols);
    }
  }
}

void linear_f32(const LinearPlan& p) {
  float* c = p.out.as<float>();
  if (p.bias) fill_bias(*p.bias, p.m, p.n, 0, c, p.n);
  ops::gemm_f32({.m = p.m,
                 .n = p.n,
                 .k = p.k,
                 .a = p.x.as<const float>(),
                 .lda = p.k,
                 .b = p.weight.as<const float>(),
                 .ldb = p.k,
                 .b_transposed = true,
                 .c = c,
                 .ldc = p.n,
                 .beta = p.bias ? 1.0f : 0.0f});
}

// Each thread converts a panel of weight rows (output columns) to fp32 and multiplies the fp32 input by it.
void linear_panels(const LinearPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const float* x = float_data(p.x.data, p.x.elem, p.m * p.k, scratch.shared_as<float>());
  const int64_t panels = (p.n + p.panel - 1) / p.panel;
  pool.parallel_for(panels, 1, [&](int64_t begin, int64_t end, int worker) {
    float* weights = scratch.worker_as<float>(worker);
    float* c = weights + p.panel * p.k;
    for (int64_t panel = begin; panel < end; ++panel) {
      const int64_t first = panel * p.panel, cols = std::min(p.panel, p.n - first);
      const float* w = float_data(p.weight.data + static_cast<size_t>(first * p.k) * elem_size(p.weight.elem),
                                  p.weight.elem, cols * p.k, weights);
      if (p.bias) fill_bias(*p.bias, p.m, cols, first, c, cols);
      ops::gemm_f32({.m = p.m,
                     .n = cols,
                     .k = p.k,
                     .a = x,
                     .lda = p.k,
                     .b = w,
                     .ldb = p.k,
                     .b_transposed = true,
                     .c = c,
                     .ldc = cols,
                     .beta = p.bias ? 1.0f : 0.0f,
                     .max_threads = 1});
      for (int64_t i = 0; i < p.m; ++i)
        from_float(c + i * cols, p.out.data + static_cast<size_t>(i * p.n + first) * elem_size(p.out.elem), p.out.elem,
                   cols);
    }
  });
}

std::optional<Kernel> linear(const KernelContext& ctx) {
  if (!float_node(ctx) || ctx.inputs.size() < 2) return std::nullopt;
  LinearPlan p;
  p.x = ctx.inputs[0];
  p.weight = ctx.inputs[1];
  p.out = ctx.outputs[0];
  if (p.weight.meta.shape.size() != 2 || p.x.meta.shape.empty()) return std::nullopt;
  p.n = p.weight.meta.shape[0];
  p.k = p.weight.meta.shape[1];
  p.m = p.n > 0 ? p.out.numel() / p.n : 0;
  if (ctx.inputs.size() == 3) {
    p.bias = ctx.inputs[2];
    if (p.bias->numel() != p.n && p.bias->numel() != 1) return std::nullopt;
  }
  Kernel kernel;
  if (p.out.numel() == 0) {
    kernel.run = [] {};
    return kernel;
  }
  const bool all_f32 = p.x.elem == Elem::F32 && p.weight.elem == Elem::F32 && p.out.elem == Elem::F32;
  if (all_f32) {
    kernel.run = [p] { linear_f32(p); };
    return kernel;
  }
  // Panels of about 256 KiB of fp32 weights, a multiple of 16 columns.
  p.panel = std::clamp<int64_t>((int64_t{1} << 16) / std::max<int64_t>(p.k, 1) / 16 * 16, 16, 512);
  p.panel = std::min(p.panel, p.n);
  ctx.scratch.reserve_shared(floats_bytes(p.m * p.k));
  ctx.scratch.reserve_per_worker(floats_bytes(p.panel * p.k + p.m * p.panel));
  kernel.run = [p, pool = &ctx.pool, scratch = &ctx.scratch] { linear_panels(p, *pool, *scratch); };
  return kernel;
}

// ---------------------------------------------------------------------------------------------------------------
// matmul family: out[batch] = alpha · a[batch] · b[batch] + beta · self (broadcast), batches broadcasting like
// torch.matmul.

struct MatmulPlan {
  int64_t n = 0, k = 0, m = 0;  // a is [n, k], b is [k, m] per batch
  std::vector<int64_t> a_offsets, b_offsets;
  bool folded = false;  // one shared b: all batches as the rows of one product
  Buffer a, b, out;
  std::optional<Buffer> self;  // addmm / baddbmm
  StridedLoop self_loop;       // self broadcast over the output
  float alpha = 1.0f, beta = 0.0f;
  // fp32 scratch (in floats from the shared region) for operands not stored as fp32; -1 when used in place
  int64_t a_scratch = -1, b_scratch = -1, c_scratch = -1;
};

void run_matmul(const MatmulPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  float* base = scratch.shared_as<float>();
  const float* a =
      p.a_scratch < 0 ? p.a.as<const float>() : float_data(p.a.data, p.a.elem, p.a.numel(), base + p.a_scratch);
  const float* b =
      p.b_scratch < 0 ? p.b.as<const float>() : float_data(p.b.data, p.b.elem, p.b.numel(), base + p.b_scratch);
  float* c = p.c_scratch < 0 ? p.out.as<float>() : base + p.c_scratch;
  const int64_t batches = static_cast<int64_t>(p.a_offsets.size());
  float beta = 0.0f;
  if (p.self && p.beta != 0.0f) {
    const Buffer& self = *p.self;
    walk(p.self_loop, 0, p.out.numel(), [&](int64_t position, int64_t count, const int64_t* offsets) {
      const int64_t stride = p.self_loop.inner_stride(0);
      for (int64_t i = 0; i < count; ++i) c[position + i] = load_float(self.data, self.elem, offsets[0] + i * stride);
    });
    beta = p.beta;
  }
  ops::GemmArgs args{.m = p.n, .n = p.m, .k = p.k, .lda = p.k, .ldb = p.m, .ldc = p.m, .alpha = p.alpha, .beta = beta};
  if (p.folded) {
    args.m = p.n * batches;
    args.a = a;
    args.b = b;
    args.c = c;
    ops::gemm_f32(args);
  } else {
    auto product = [&](int64_t begin, int64_t end, int threads) {
      ops::GemmArgs part = args;
      part.max_threads = threads;
      for (int64_t i = begin; i < end; ++i) {
        part.a = a + p.a_offsets[static_cast<size_t>(i)];
        part.b = b + p.b_offsets[static_cast<size_t>(i)];
        part.c = c + i * p.n * p.m;
        ops::gemm_f32(part);
      }
    };
    // Many small products: one thread each; few large ones: the GEMM splits itself.
    if (batches > 1 && p.n * p.m * p.k < kSmallGemm)
      pool.parallel_for(batches, 1, [&](int64_t begin, int64_t end, int) { product(begin, end, 1); });
    else
      product(0, batches, 0);
  }
  if (p.c_scratch >= 0) from_float(c, p.out.data, p.out.elem, p.out.numel());
}

std::optional<Kernel> matmul_kernel(const KernelContext& ctx, size_t a_index, std::optional<size_t> self_index) {
  if (!float_node(ctx) || ctx.inputs.size() < a_index + 2) return std::nullopt;
  MatmulPlan p;
  p.a = ctx.inputs[a_index];
  p.b = ctx.inputs[a_index + 1];
  p.out = ctx.outputs[0];
  const Shape& a = p.a.meta.shape;
  const Shape& b = p.b.meta.shape;
  if (a.empty() || b.empty()) return std::nullopt;
  const Shape a_shape = a.size() == 1 ? Shape{1, a[0]} : a;
  const Shape b_shape = b.size() == 1 ? Shape{b[0], 1} : b;
  p.n = a_shape[a_shape.size() - 2];
  p.k = a_shape.back();
  p.m = b_shape.back();
  if (b_shape[b_shape.size() - 2] != p.k) return std::nullopt;
  const Shape a_batch(a_shape.begin(), a_shape.end() - 2), b_batch(b_shape.begin(), b_shape.end() - 2);
  const Shape out_batch = ops::broadcast_shapes(a_batch, b_batch);
  if (shape_numel(out_batch) * p.n * p.m != p.out.numel()) return std::nullopt;
  p.a_offsets = ops::batch_offsets(a_shape, out_batch);
  p.b_offsets = ops::batch_offsets(b_shape, out_batch);
  p.folded = shape_numel(b_batch) == 1 && shape_numel(a_batch) == shape_numel(out_batch);
  if (self_index) {
    p.self = ctx.inputs[*self_index];
    const std::vector<std::vector<int64_t>> strides{ops::broadcast_strides(p.self->meta.shape, p.out.meta.shape)};
    std::optional<StridedLoop> loop = make_loop(p.out.meta.shape, strides);
    if (!loop) return std::nullopt;
    p.self_loop = *loop;
    p.alpha = static_cast<float>(ctx.node.attrs.get_float("alpha", 1.0));
    p.beta = static_cast<float>(ctx.node.attrs.get_float("beta", 1.0));
  }
  int64_t floats = 0;
  auto place = [&floats](const Buffer& buffer, int64_t& at) {
    if (buffer.elem == Elem::F32) return;
    at = floats;
    floats += (buffer.numel() + 15) / 16 * 16;
  };
  place(p.a, p.a_scratch);
  place(p.b, p.b_scratch);
  place(p.out, p.c_scratch);
  ctx.scratch.reserve_shared(floats_bytes(floats));
  Kernel kernel;
  if (p.out.numel() == 0) {
    kernel.run = [] {};
    return kernel;
  }
  auto plan = std::make_shared<const MatmulPlan>(std::move(p));
  kernel.run = [plan, pool = &ctx.pool, scratch = &ctx.scratch] { run_matmul(*plan, *pool, *scratch); };
  return kernel;
}

std::optional<Kernel> matmul(const KernelContext& ctx) { return matmul_kernel(ctx, 0, std::nullopt); }
std::optional<Kernel> addmm(const KernelContext& ctx) { return matmul_kernel(ctx, 1, 0); }

}  // namespace

void add_linalg_kernels(KernelTable& table) {
  table.add("linear", linear);
  for (const char* op : {"matmul", "mm", "bmm"}) table.add(op, matmul);
  for (const char* op : {"addmm", "baddbmm"}) table.add(op, addmm);
}

}  // namespace npusim::cpu
