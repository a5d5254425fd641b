// Matrix products: linear on the GEMV (few rows) or the packed GEMM; matmul, mm, bmm, addmm, baddbmm on the shared
// fp32 GEMM, with fp16/bf16 operands converted to fp32 in scratch reserved at prepare time.
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "backends/cpu/compact_bf16.h"
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/packed_gemm.h"
#include "backends/cpu/strided_loop.h"
#include "core/cpu_features.h"
#include "core/mapped_file.h"
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
// linear: out[M, N] = x[M, K] · W[N, K]^T + b. A few rows (decoding) go to the GEMV, which streams the weight in its
// storage form; more rows go to the packed GEMM, which packs weight panels during the product (an int8 weight is
// widened as it is packed). An int8 weight, or a compact bf16 one, is made once when the kernel is built and shared
// by every program that binds the same weight.

struct LinearShape {
  int64_t m = 0, n = 0, k = 0;
  Buffer x, weight, out;
  std::optional<Buffer> bias;  // [N] or one value
};

GemvWeightType gemv_type(Elem elem) {
  switch (elem) {
    case Elem::F16:
      return GemvWeightType::F16;
    case Elem::BF16:
      return GemvWeightType::BF16;
    default:
      return GemvWeightType::F32;
  }
}

// Weights in another form (int8, compact bf16) by source address and layout; entries expire with the last kernel
// that uses them.
struct FormKey {
  const std::byte* data;
  Elem elem;
  int64_t n, k, group;
  auto operator<=>(const FormKey&) const = default;
};

template <class Form, class Make>
std::shared_ptr<const Form> shared_form(const FormKey& key, const Make& make) {
  static std::mutex mutex;
  static std::map<FormKey, std::weak_ptr<const Form>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<const Form> found = cache[key].lock()) return found;
  std::erase_if(cache, [](const auto& entry) { return entry.second.expired(); });
  std::shared_ptr<const Form> made = make();
  cache[key] = made;
  return made;
}

// A form made from a weight replaces it for the kernel that asked for it: where a mapped file holds the weight, its
// pages are given back (a model's weights would otherwise stay resident twice), and come back only where another
// kernel reads the weight itself.
template <class Form>
std::shared_ptr<const Form> replacing_storage(const LinearShape& s, std::shared_ptr<const Form> form) {
  if (form) MappedFile::release_pages(s.weight.data, static_cast<size_t>(s.n * s.k) * elem_size(s.weight.elem));
  return form;
}

std::shared_ptr<const QuantizedWeight> shared_quantized(const LinearShape& s, int64_t group, ThreadPool& pool) {
  return shared_form<QuantizedWeight>(FormKey{s.weight.data, s.weight.elem, s.n, s.k, group}, [&] {
    return replacing_storage(s, std::make_shared<const QuantizedWeight>(
                                    quantize_int8(s.weight.data, s.weight.elem, s.n, s.k, group, &pool)));
  });
}

// Null when the weight has too many values outside its rows' windows (it is then read as it is).
std::shared_ptr<const CompactBf16Weight> shared_compact(const LinearShape& s, ThreadPool& pool) {
  return shared_form<CompactBf16Weight>(FormKey{s.weight.data, s.weight.elem, s.n, s.k, 0}, [&] {
    return replacing_storage(s, compact_bf16(reinterpret_cast<const uint16_t*>(s.weight.data), s.n, s.k, &pool,
                                             kCompactEscapeShare, compact_interleave(s.k)));
  });
}

// Bytes of bf16 weights held prepacked at once, at most a quarter of the machine's memory: each costs two bytes a value
// besides the weight itself.
std::atomic<int64_t> g_prepacked_bytes{0};

int64_t prepacked_budget() { return static_cast<int64_t>(physical_memory_bytes() / 4); }

// A bf16 weight as the AVX2 tile's B panels, packed once (null past the budget, or where products do not run on the
// AVX2 tile): a product that packs them itself spends about 6% of a prompt's time on it (Qwen2.5-1.5B shape, 128
// tokens, one Zen 4 thread with AVX2).
std::shared_ptr<const PackedMatrix> shared_interleaved(const LinearShape& s, ThreadPool& pool) {
  if (s.weight.elem != Elem::BF16 || gemm_active_kernel() != GemmKernelChoice::Avx2) return nullptr;
  return shared_form<PackedMatrix>(FormKey{s.weight.data, s.weight.elem, s.n, s.k, 0}, [&] {
    const int64_t bytes = (s.n + kGemmTileCols - 1) / kGemmTileCols * kGemmTileCols * s.k * 2;
    if (g_prepacked_bytes.fetch_add(bytes) + bytes > prepacked_budget()) {
      g_prepacked_bytes.fetch_sub(bytes);
      return std::shared_ptr<const PackedMatrix>();
    }
    PackedMatrix packed =
        PackedMatrix::pack_interleaved_bf16(reinterpret_cast<const uint16_t*>(s.weight.data), s.n, s.k, s.k, &pool);
    return replacing_storage(
        s, std::shared_ptr<const PackedMatrix>(new PackedMatrix(std::move(packed)), [bytes](const PackedMatrix* m) {
          g_prepacked_bytes.fetch_sub(bytes);
          delete m;
        }));
  });
}

}  // namespace

int64_t prepacked_weight_bytes() { return g_prepacked_bytes.load(); }

namespace {

// A weight the GEMV reads in another form than its storage: int8 with scales (the GEMM too), or compact bf16 (the
// GEMM reads the bf16 weight itself: a prompt's products are compute-bound, and stay the uncompacted ones bit for
// bit).
struct WeightForm {
  std::shared_ptr<const QuantizedWeight> quantized;
  std::shared_ptr<const CompactBf16Weight> compact;

  explicit operator bool() const { return quantized || compact; }
  GemvWeight view() const {
    if (quantized) return quantized->view();
    return {.type = GemvWeightType::CompactBF16, .n = compact->n, .k = compact->k, .compact = compact.get()};
  }
};

// fp32 rows of x: the buffer itself, or converted into `scratch`.
const float* x_floats(const LinearShape& s, float* scratch) {
  return float_data(s.x.data, s.x.elem, s.m * s.k, scratch);
}

Kernel gemv_linear(const KernelContext& ctx, const LinearShape& s, WeightForm form) {
  const GemvWeight weight =
      form ? form.view() : GemvWeight{.type = gemv_type(s.weight.elem), .values = s.weight.data, .n = s.n, .k = s.k};
  GemvProblem problem{.m = s.m, .ldx = s.k, .weight = weight, .y = s.out.data, .y_elem = s.out.elem, .ldy = s.n};
  if (s.bias) {
    problem.bias = s.bias->data;
    problem.bias_elem = s.bias->elem;
    problem.bias_count = s.bias->numel();
  }
  if (s.x.elem != Elem::F32) ctx.scratch.reserve_shared(floats_bytes(s.m * s.k));
  Kernel kernel;
  kernel.run = [problem, s, form = std::move(form), pool = &ctx.pool, scratch = &ctx.scratch]() mutable {
    problem.x = x_floats(s, scratch->shared_as<float>());
    if (s.x.elem == Elem::BF16) problem.x_bf16 = reinterpret_cast<const uint16_t*>(s.x.data);
    gemv(problem, *pool);
  };
  return kernel;
}

// The bias as fp32 for the GEMM epilogue: in place, or converted into `scratch`.
const float* bias_floats(const std::optional<Buffer>& bias, int64_t n, float* scratch) {
  if (!bias) return nullptr;
  if (bias->numel() == 1) {
    std::fill_n(scratch, n, load_float(bias->data, bias->elem, 0));
    return scratch;
  }
  return float_data(bias->data, bias->elem, n, scratch);
}

int64_t bias_scratch_floats(const LinearShape& s) {
  return s.bias && (s.bias->elem != Elem::F32 || s.bias->numel() == 1) ? (s.n + 15) / 16 * 16 : 0;
}

// The weight as the GEMM's B: prepacked (`packed`, from shared_interleaved), in int8 (`quantized`, widened while it
// is packed during the product), or as it is stored, packed during the product.
Kernel gemm_linear(const KernelContext& ctx, const LinearShape& s, std::shared_ptr<const PackedMatrix> packed,
                   std::shared_ptr<const QuantizedWeight> quantized) {
  ctx.scratch.reserve_shared(floats_bytes(bias_scratch_floats(s)));
  auto gemm = std::make_shared<const PackedGemm>(
      GemmSpec{.m = s.m, .n = s.n, .k = s.k, .b_prepacked = packed != nullptr}, ctx.scratch);
  GemmOperand weight = StridedOperand{.data = s.weight.data, .elem = s.weight.elem, .ld = s.k, .transposed = true};
  if (packed) weight = packed.get();
  if (quantized)
    weight = Int8WeightOperand{.values = reinterpret_cast<const int8_t*>(quantized->values.data()),
                               .scales = reinterpret_cast<const float*>(quantized->scales.data()),
                               .group = quantized->group};
  Kernel kernel;
  // What `weight` points into, kept alive with the kernel.
  std::shared_ptr<const void> form = packed ? std::shared_ptr<const void>(std::move(packed)) : std::move(quantized);
  kernel.run = [gemm, s, weight, form = std::move(form), pool = &ctx.pool, scratch = &ctx.scratch] {
    GemmEpilogue epilogue;
    epilogue.bias = bias_floats(s.bias, s.n, scratch->shared_as<float>());
    epilogue.bias_per_column = true;
    gemm->run(StridedOperand{s.x.data, s.x.elem, s.k}, weight, GemmOutput{s.out.data, s.out.elem, s.n}, epilogue, *pool,
              *scratch);
  };
  return kernel;
}

bool constant_weight(const KernelContext& ctx) { return ctx.constant_inputs.size() > 1 && ctx.constant_inputs[1]; }

WeightForm weight_form(const KernelContext& ctx, const LinearShape& s) {
  if (!ctx.options || !constant_weight(ctx)) return {};
  if (ctx.options->weights == WeightQuantization::Int8)
    return {.quantized = shared_quantized(s, ctx.options->quantization_group, ctx.pool), .compact = nullptr};
  if (ctx.options->compact_bf16 && s.weight.elem == Elem::BF16 && s.m <= kGemvMaxRows)
    return {.quantized = nullptr, .compact = shared_compact(s, ctx.pool)};
  return {};
}

std::optional<Kernel> linear(const KernelContext& ctx) {
  if (!float_node(ctx) || ctx.inputs.size() < 2) return std::nullopt;
  LinearShape s;
  s.x = ctx.inputs[0];
  s.weight = ctx.inputs[1];
  s.out = ctx.outputs[0];
  if (s.weight.meta.shape.size() != 2 || s.x.meta.shape.empty()) return std::nullopt;
  s.n = s.weight.meta.shape[0];
  s.k = s.weight.meta.shape[1];
  s.m = s.n > 0 ? s.out.numel() / s.n : 0;
  if (s.x.numel() != s.m * s.k) return std::nullopt;
  if (ctx.inputs.size() == 3) {
    s.bias = ctx.inputs[2];
    if (s.bias->numel() != s.n && s.bias->numel() != 1) return std::nullopt;
  }
  Kernel kernel;
  if (s.out.numel() == 0) {
    kernel.run = [] {};
    return kernel;
  }
  if (s.k == 0) {
    kernel.run = [s] {
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j)
          store_float(s.out.data, s.out.elem, i * s.n + j,
                      s.bias ? load_float(s.bias->data, s.bias->elem, s.bias->numel() == 1 ? 0 : j) : 0.0f);
    };
    return kernel;
  }
  WeightForm form = weight_form(ctx, s);
  if (s.m <= kGemvMaxRows) return gemv_linear(ctx, s, std::move(form));
  if (form.quantized) return gemm_linear(ctx, s, nullptr, std::move(form.quantized));
  return gemm_linear(ctx, s, constant_weight(ctx) ? shared_interleaved(s, ctx.pool) : nullptr, nullptr);
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
