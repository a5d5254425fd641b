// Convolution (conv2d, conv1d, convolution, fused_conv2d) as im2col + GEMM per sample and group: the patch matrix
// [Cin/groups * kh * kw, oh * ow] is written into scratch (a pointwise convolution multiplies by the input itself),
// the GEMM produces [Cout/groups, oh * ow] in fp32, and one epilogue pass adds the bias and the residual, applies
// the activation and stores in the output's storage type.
#include <array>
#include <memory>

#include "backends/cpu/elementwise.h"
#include "ops/gemm.h"

namespace npusim::cpu {

namespace {

struct ConvGeometry {
  int64_t batch = 1, in_channels = 0, out_channels = 0, groups = 1;
  std::array<int64_t, 2> in{1, 1}, kernel{1, 1}, stride{1, 1}, dilation{1, 1}, pad{0, 0}, out{1, 1};

  int64_t group_in() const { return in_channels / groups; }
  int64_t group_out() const { return out_channels / groups; }
  int64_t pixels() const { return out[0] * out[1]; }
  int64_t in_plane() const { return in[0] * in[1]; }
  int64_t patch() const { return group_in() * kernel[0] * kernel[1]; }
  bool pointwise() const {
    return kernel == std::array<int64_t, 2>{1, 1} && stride == std::array<int64_t, 2>{1, 1} &&
           pad == std::array<int64_t, 2>{0, 0} && out == in;
  }
};

std::optional<std::vector<int64_t>> per_dim(const Attrs& attrs, const std::string& name, size_t dims,
                                            int64_t fallback) {
  std::vector<int64_t> values = attrs.get_ints(name, {fallback});
  if (values.size() == 1) values.assign(dims, values[0]);
  if (values.size() != dims) return std::nullopt;
  return values;
}

// The geometry PyTorch uses, or nothing when the shapes do not describe a supported convolution.
std::optional<ConvGeometry> conv_geometry(const Attrs& attrs, const Shape& x, const Shape& w, const Shape& out) {
  if (w.size() != 3 && w.size() != 4) return std::nullopt;
  const size_t dims = w.size() - 2;
  if (x.size() != dims + 1 && x.size() != dims + 2) return std::nullopt;
  if (attrs.get_bool("transposed", false)) return std::nullopt;
  ConvGeometry g;
  const bool batched = x.size() == dims + 2;
  g.batch = batched ? x[0] : 1;
  g.in_channels = x[batched ? 1 : 0];
  g.out_channels = w[0];
  g.groups = attrs.get_int("groups", 1);
  if (g.groups < 1 || w[1] * g.groups != g.in_channels || g.out_channels % g.groups != 0) return std::nullopt;
  const auto stride = per_dim(attrs, "stride", dims, 1);
  const auto dilation = per_dim(attrs, "dilation", dims, 1);
  if (!stride || !dilation) return std::nullopt;
  const std::string mode = attrs.is_none("padding_mode") ? "" : attrs.get_string("padding_mode");
  std::optional<std::vector<int64_t>> padding =
      mode.empty() ? per_dim(attrs, "padding", dims, 0) : std::optional(std::vector<int64_t>(dims, 0));
  if (!padding || (!mode.empty() && mode != "same" && mode != "valid")) return std::nullopt;
  Shape expected = batched ? Shape{g.batch, g.out_channels} : Shape{g.out_channels};
  const size_t first = 2 - dims;  // a 1-D convolution fills only the width
  for (size_t d = 0; d < dims; ++d) {
    const size_t at = first + d;
    g.in[at] = x[x.size() - dims + d];
    g.kernel[at] = w[2 + d];
    g.stride[at] = (*stride)[d];
    g.dilation[at] = (*dilation)[d];
    int64_t before = (*padding)[d], after = before;
    if (mode == "same") {
      const int64_t total = g.dilation[at] * (g.kernel[at] - 1);
      before = total / 2;
      after = total - before;
    }
    g.pad[at] = before;
    const int64_t extent = g.dilation[at] * (g.kernel[at] - 1) + 1;
    if (g.stride[at] < 1 || extent > g.in[at] + before + after) return std::nullopt;
    g.out[at] = (g.in[at] + before + after - extent) / g.stride[at] + 1;
    expected.push_back(g.out[at]);
  }
  if (expected != out) return std::nullopt;
  return g;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Row p = (channel, ky, kx) of one group's patch matrix over all output pixels: the input values under that kernel
// tap, zero where the tap reads padding.
void patch_row(const float* input, const ConvGeometry& g, int64_t p, float* out) {
  const int64_t height = g.in[0], width = g.in[1], out_h = g.out[0], out_w = g.out[1];
  const int64_t kx = p % g.kernel[1], ky = p / g.kernel[1] % g.kernel[0], channel = p / (g.kernel[0] * g.kernel[1]);
  const float* plane = input + channel * height * width;
  const int64_t x_shift = kx * g.dilation[1] - g.pad[1];
  // Output columns whose input column ox * stride + x_shift falls inside [0, width).
  const int64_t ox_begin = std::min(out_w, x_shift >= 0 ? 0 : ceil_div(-x_shift, g.stride[1]));
  const int64_t ox_end = std::clamp(x_shift < width ? (width - 1 - x_shift) / g.stride[1] + 1 : 0, ox_begin, out_w);
  for (int64_t oy = 0; oy < out_h; ++oy, out += out_w) {
    const int64_t iy = oy * g.stride[0] - g.pad[0] + ky * g.dilation[0];
    if (iy < 0 || iy >= height) {
      std::fill(out, out + out_w, 0.0f);
      continue;
    }
    const float* src = plane + iy * width;
    std::fill(out, out + ox_begin, 0.0f);
    if (g.stride[1] == 1) {
      std::copy(src + ox_begin + x_shift, src + ox_end + x_shift, out + ox_begin);
    } else {
      for (int64_t ox = ox_begin; ox < ox_end; ++ox) out[ox] = src[ox * g.stride[1] + x_shift];
    }
    std::fill(out + ox_end, out + out_w, 0.0f);
  }
}

struct ConvPlan {
  ConvGeometry g;
  Buffer x, weight, out;
  std::optional<Buffer> bias, residual;
  std::optional<UnaryStep> activation;
  // Offsets (in floats) into the shared scratch; -1 when not needed.
  int64_t x_scratch = -1, weight_scratch = -1, patches_scratch = -1, c_scratch = -1;
};

// Bias, residual and activation on one output channel's row of fp32 sums, stored in the output's type.
void epilogue(const ConvPlan& p, int64_t sample, int64_t channel, float* row) {
  const int64_t pixels = p.g.pixels();
  const int64_t at = (sample * p.g.out_channels + channel) * pixels;
  if (p.bias) {
    const float b = load_float(p.bias->data, p.bias->elem, channel);
    for (int64_t j = 0; j < pixels; ++j) row[j] += b;
  }
  if (p.residual) {
    const Buffer& r = *p.residual;
    if (r.elem == Elem::F32) {
      const float* add = r.as<const float>() + at;
      for (int64_t j = 0; j < pixels; ++j) row[j] += add[j];
    } else {
      alignas(64) float block[kChunk];
      for (int64_t j = 0; j < pixels; j += kChunk) {
        const int64_t n = std::min(kChunk, pixels - j);
        to_float(r.data + static_cast<size_t>(at + j) * elem_size(r.elem), r.elem, block, n);
        for (int64_t i = 0; i < n; ++i) row[j + i] += block[i];
      }
    }
  }
  if (p.activation) apply_unary(*p.activation, row, row, pixels);
  store_floats(row, p.out.data + static_cast<size_t>(at) * elem_size(p.out.elem), p.out.elem, pixels);
}

void run_conv(const ConvPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const ConvGeometry& g = p.g;
  float* base = scratch.shared_as<float>();
  const int64_t sample_size = g.in_channels * g.in_plane();
  const int64_t pixels = g.pixels(), patch = g.patch(), group_out = g.group_out();
  const float* weights = p.weight_scratch < 0
                             ? p.weight.as<const float>()
                             : float_data(p.weight.data, p.weight.elem, p.weight.numel(), base + p.weight_scratch);
  float* patches = p.patches_scratch < 0 ? nullptr : base + p.patches_scratch;
  for (int64_t n = 0; n < g.batch; ++n) {
    const float* x = p.x_scratch < 0 ? p.x.as<const float>() + n * sample_size
                                     : float_data(p.x.data + static_cast<size_t>(n * sample_size) * elem_size(p.x.elem),
                                                  p.x.elem, sample_size, base + p.x_scratch);
    for (int64_t group = 0; group < g.groups; ++group) {
      const float* input = x + group * g.group_in() * g.in_plane();
      const float* b = input;
      if (patches) {
        pool.parallel_for(patch, 8, [&](int64_t begin, int64_t end, int) {
          for (int64_t row = begin; row < end; ++row) patch_row(input, g, row, patches + row * pixels);
        });
        b = patches;
      }
      const int64_t first_channel = group * group_out;
      float* c =
          p.c_scratch < 0 ? p.out.as<float>() + (n * g.out_channels + first_channel) * pixels : base + p.c_scratch;
      ops::gemm_f32({.m = group_out,
                     .n = pixels,
                     .k = patch,
                     .a = weights + first_channel * patch,
                     .lda = patch,
                     .b = b,
                     .ldb = pixels,
                     .c = c,
                     .ldc = pixels});
      const bool needs_epilogue = p.bias || p.residual || p.activation || p.c_scratch >= 0;
      if (!needs_epilogue) continue;
      pool.parallel_for(group_out, 4, [&](int64_t begin, int64_t end, int) {
        for (int64_t o = begin; o < end; ++o) epilogue(p, n, first_channel + o, c + o * pixels);
      });
    }
  }
}

std::optional<Kernel> conv_kernel(const KernelContext& ctx, std::optional<size_t> bias, std::optional<size_t> residual,
                                  std::optional<UnaryStep> activation) {
  if (ctx.outputs.size() != 1 || ctx.inputs.size() < 2) return std::nullopt;
  for (const Buffer& in : ctx.inputs)
    if (!is_floating(in.meta.dtype)) return std::nullopt;
  ConvPlan p;
  p.x = ctx.inputs[0];
  p.weight = ctx.inputs[1];
  p.out = ctx.outputs[0];
  const std::optional<ConvGeometry> g =
      conv_geometry(ctx.node.attrs, p.x.meta.shape, p.weight.meta.shape, p.out.meta.shape);
  if (!g) return std::nullopt;
  p.g = *g;
  if (bias) {
    p.bias = ctx.inputs[*bias];
    if (p.bias->numel() != p.g.out_channels) return std::nullopt;
  }
  if (residual) {
    p.residual = ctx.inputs[*residual];
    if (p.residual->meta.shape != p.out.meta.shape) return std::nullopt;
  }
  p.activation = activation;
  Kernel kernel;
  if (p.out.numel() == 0) {
    kernel.run = [] {};
    return kernel;
  }
  int64_t floats = 0;
  auto reserve = [&floats](int64_t count) {
    const int64_t at = floats;
    floats += (count + 15) / 16 * 16;
    return at;
  };
  if (p.x.elem != Elem::F32) p.x_scratch = reserve(p.g.in_channels * p.g.in_plane());
  if (p.weight.elem != Elem::F32) p.weight_scratch = reserve(p.weight.numel());
  if (!p.g.pointwise()) p.patches_scratch = reserve(p.g.patch() * p.g.pixels());
  // An output written over its residual needs the sums elsewhere until the epilogue has read the residual.
  const bool over_residual = p.residual && p.residual->data == p.out.data;
  if (p.out.elem != Elem::F32 || over_residual) p.c_scratch = reserve(p.g.group_out() * p.g.pixels());
  ctx.scratch.reserve_shared(floats_bytes(floats));
  auto plan = std::make_shared<const ConvPlan>(std::move(p));
  kernel.run = [plan, pool = &ctx.pool, scratch = &ctx.scratch] { run_conv(*plan, *pool, *scratch); };
  // Each residual row is read right before the same output row is written.
  if (residual) kernel.shareable_inputs = {*residual};
  return kernel;
}

std::optional<Kernel> conv(const KernelContext& ctx) {
  return conv_kernel(ctx, ctx.inputs.size() == 3 ? std::optional<size_t>(2) : std::nullopt, std::nullopt, std::nullopt);
}

std::optional<Kernel> fused_conv(const KernelContext& ctx) {
  const Attrs& attrs = ctx.node.attrs;
  size_t next = 2;
  std::optional<size_t> bias, residual;
  if (attrs.get_bool("has_bias", false)) bias = next++;
  if (attrs.get_bool("has_residual", false)) residual = next++;
  if (ctx.inputs.size() != next) return std::nullopt;
  std::optional<UnaryStep> activation;
  const std::string& name = attrs.get_string("activation");
  if (name != "none") {
    activation = unary_step(name, attrs);
    if (!activation) return std::nullopt;
  }
  return conv_kernel(ctx, bias, residual, activation);
}

}  // namespace

void add_conv_kernels(KernelTable& table) {
  for (const char* op : {"conv2d", "conv1d", "convolution"}) table.add(op, conv);
  table.add("fused_conv2d", fused_conv);
}

}  // namespace npusim::cpu
