// Convolution (conv2d, conv1d, convolution, fused_conv2d) on the packed GEMM: per sample and group,
// out[Cout/groups, oh * ow] = W[Cout/groups, Cin/groups * kh * kw] · patches, with the weight packed once at prepare
// time when it is a constant, the patch matrix gathered from the input while the GEMM packs its panels (a pointwise
// convolution reads the input itself), and bias, residual and activations applied by the GEMM's epilogue.
// Convolutions whose groups read few input channels (depthwise, the narrowest grouped ones) are computed directly
// instead of as many tiny GEMMs: depthwise ones eight channels at a time where the CPU has AVX2 (depthwise_conv.h),
// the others plane by plane (direct_conv.h).
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <span>

#include "backends/cpu/conv_winograd.h"
#include "backends/cpu/depthwise_conv.h"
#include "backends/cpu/direct_conv.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/packed_gemm.h"
#include "runtime/weight_transforms.h"

namespace npusim::cpu {

namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

struct ConvGeometry : ConvWindow {
  int64_t batch = 1, in_channels = 0, out_channels = 0, groups = 1;

  int64_t group_in() const { return in_channels / groups; }
  int64_t group_out() const { return out_channels / groups; }
  int64_t pixels() const { return out[0] * out[1]; }
  int64_t in_plane() const { return in[0] * in[1]; }
  int64_t patch() const { return group_in() * kernel[0] * kernel[1]; }
  bool pointwise() const {
    return kernel == std::array<int64_t, 2>{1, 1} && stride == std::array<int64_t, 2>{1, 1} &&
           pad == std::array<int64_t, 2>{0, 0} && out == in;
  }
  // Groups of at most four input channels (depthwise convolutions, ResNeXt's narrowest groups): computed directly.
  // Wider groups and single-group convolutions (an RGB stem included) measured faster on the packed GEMM, which
  // reuses each input value for six output channels at once.
  bool direct() const {
    constexpr int64_t kMaxGroupChannels = 4;
    return groups > 1 && group_in() <= kMaxGroupChannels;
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
    if (before < 0 || g.dilation[at] < 1) return std::nullopt;
    g.pad[at] = before;
    const int64_t extent = g.dilation[at] * (g.kernel[at] - 1) + 1;
    if (g.stride[at] < 1 || extent > g.in[at] + before + after) return std::nullopt;
    g.out[at] = (g.in[at] + before + after - extent) / g.stride[at] + 1;
    expected.push_back(g.out[at]);
  }
  if (expected != out) return std::nullopt;
  return g;
}

// Whether input `index` keeps its contents for the life of the prepared program (a weight): packed once.
bool fixed_input(const KernelContext& ctx, size_t index) {
  return index < ctx.constant_inputs.size() && ctx.constant_inputs[index];
}

struct ConvPlan {
  ConvGeometry g;
  Buffer x, weight, out;
  std::optional<Buffer> bias, residual;
  std::optional<UnaryStep> activation;  // any other activation: the GEMM epilogue's unary step
  GemmActivation gemm_activation = GemmActivation::None;
  float low = 0.0f, high = 0.0f;
  std::vector<PackedMatrix> packed;  // per group, when the weight is constant
  PackedGemm gemm;
  std::optional<WinogradConv> winograd;    // instead of the GEMM, for 3x3 stride-1 convolutions that gain from it
  std::optional<DirectConv> direct;        // for ConvGeometry::direct()
  std::optional<DepthwiseConv> depthwise;  // instead, for its depthwise ones (one input and one output per group)
  Tensor scaled_weight;                    // the direct path's weight with its row scales applied (a folded BatchNorm)
  // Offsets (in floats) into the shared scratch; -1 when not needed.
  int64_t x_scratch = -1, bias_scratch = -1, winograd_scratch = -1;
  int64_t phases_scratch = -1;  // the input split by stride phases, when that packs the patches faster
  // Groups whose products are each too small to split over the pool (ResNeXt's and RegNet's grouped convolutions)
  // run side by side over it instead, one group per piece.
  bool groups_in_parallel = false;
};

// The epilogue's share of an activation: ReLU and clamps run inside the GEMM, anything else afterwards.
void split_activation(ConvPlan& p, std::optional<UnaryStep> activation) {
  if (!activation) return;
  if (activation->kind == UnaryKind::Relu) {
    p.gemm_activation = GemmActivation::Relu;
  } else if (activation->kind == UnaryKind::Clamp && !std::isnan(activation->p0) && !std::isnan(activation->p1)) {
    p.gemm_activation = GemmActivation::Clamp;
    p.low = activation->p0;
    p.high = activation->p1;
  } else {
    p.activation = activation;
  }
}

// The patch matrix of one group of channels starting at `x` (null at prepare time).
Im2colOperand patches_of(const ConvGeometry& g, const float* x) {
  return Im2colOperand{x,           g.group_in(), g.in[0],  g.in[1],       g.kernel[0],   g.kernel[1], g.stride[0],
                       g.stride[1], g.pad[0],     g.pad[1], g.dilation[0], g.dilation[1], g.out[0],    g.out[1]};
}

// One sample's group through the packed GEMM: weight rows of the group times its patch matrix; over the pool, or on
// pool worker `worker` alone when given (a caller spreading the groups over the pool).
void run_group_gemm(const ConvPlan& p, int64_t group, const std::byte* x_bytes, const float* x, const GemmOutput& c,
                    const GemmEpilogue& epilogue, ThreadPool& pool, const ScratchSpace& scratch,
                    std::optional<int> worker = std::nullopt) {
  const ConvGeometry& g = p.g;
  const int64_t pixels = g.pixels(), patch = g.patch(), first_channel = group * g.group_out();
  const size_t x_es = elem_size(p.x.elem), w_es = elem_size(p.weight.elem);
  GemmOperand a =
      StridedOperand{p.weight.data + static_cast<size_t>(first_channel * patch) * w_es, p.weight.elem, patch};
  if (!p.packed.empty()) a = &p.packed[static_cast<size_t>(group)];
  GemmOperand b;
  if (g.pointwise()) {
    b = StridedOperand{x_bytes + static_cast<size_t>(group * g.group_in() * g.in_plane()) * x_es, p.x.elem, pixels};
  } else {
    Im2colOperand patches = patches_of(g, x + group * g.group_in() * g.in_plane());
    if (p.phases_scratch >= 0) {  // never with `worker`: the split phases are one buffer
      float* phases = scratch.shared_as<float>() + p.phases_scratch;
      split_im2col_phases(patches, phases, &pool);
      patches.phases = phases;
    }
    b = patches;
  }
  if (worker)
    p.gemm.run_on_worker(a, b, c, epilogue, *worker, scratch);
  else
    p.gemm.run(a, b, c, epilogue, pool, scratch);
}

void run_gemm_conv(const ConvPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const ConvGeometry& g = p.g;
  float* base = scratch.shared_as<float>();
  const int64_t sample = g.in_channels * g.in_plane(), pixels = g.pixels(), group_out = g.group_out();
  const size_t x_es = elem_size(p.x.elem), out_es = elem_size(p.out.elem);
  const float* bias =
      p.bias ? float_data(p.bias->data, p.bias->elem, g.out_channels, base + std::max<int64_t>(p.bias_scratch, 0))
             : nullptr;
  for (int64_t n = 0; n < g.batch; ++n) {
    const std::byte* x_bytes = p.x.data + static_cast<size_t>(n * sample) * x_es;
    // The im2col gather reads fp32; a pointwise product packs straight from any float type.
    const float* x = nullptr;
    if (!g.pointwise()) x = float_data(x_bytes, p.x.elem, sample, base + std::max<int64_t>(p.x_scratch, 0));
    const auto run_group = [&](int64_t group, std::optional<int> worker) {
      const int64_t first_channel = group * group_out;
      const int64_t at = (n * g.out_channels + first_channel) * pixels;
      GemmEpilogue epilogue;
      epilogue.bias = bias ? bias + first_channel : nullptr;
      if (p.residual) {
        epilogue.residual = p.residual->data + static_cast<size_t>(at) * elem_size(p.residual->elem);
        epilogue.residual_elem = p.residual->elem;
        epilogue.residual_ld = pixels;
      }
      epilogue.activation = p.gemm_activation;
      epilogue.low = p.low;
      epilogue.high = p.high;
      epilogue.unary = p.activation ? &*p.activation : nullptr;
      const GemmOutput c{p.out.data + static_cast<size_t>(at) * out_es, p.out.elem, pixels};
      if (p.winograd) {
        p.winograd->run(x, base + p.winograd_scratch, c, epilogue, pool, scratch);
      } else {
        run_group_gemm(p, group, x_bytes, x, c, epilogue, pool, scratch, worker);
      }
    };
    if (p.groups_in_parallel) {
      pool.parallel_for(g.groups, 1, [&](int64_t begin, int64_t end, int worker) {
        for (int64_t group = begin; group < end; ++group) run_group(group, worker);
      });
    } else {
      for (int64_t group = 0; group < g.groups; ++group) run_group(group, std::nullopt);
    }
  }
}

// ---- direct: groups of few input channels ----

// How the direct paths finish their sums: ReLU and clamps go with the sums into the output, unless a residual must be
// added before them; an fp32 output without a residual is written in place (any other activation applied there
// afterwards), anything else goes through the GEMM's epilogue.
struct DirectFinish {
  bool clamp_in_plane = false, straight_to_output = false;
  float low = -kInfinity, high = kInfinity;

  explicit DirectFinish(const ConvPlan& p)
      : clamp_in_plane(!p.residual && p.gemm_activation != GemmActivation::None),
        straight_to_output(!p.residual && p.out.elem == Elem::F32) {
    if (clamp_in_plane) {
      low = p.gemm_activation == GemmActivation::Relu ? 0.0f : p.low;
      high = p.gemm_activation == GemmActivation::Clamp ? p.high : kInfinity;
    }
  }

  // `count` sums at `sums` (changed in place) into the output from element `at` (in elements of the whole output).
  void store(const ConvPlan& p, float* sums, int64_t at, int64_t count) const {
    GemmEpilogue epilogue;
    if (p.residual) {
      epilogue.residual = p.residual->data + static_cast<size_t>(at) * elem_size(p.residual->elem);
      epilogue.residual_elem = p.residual->elem;
      epilogue.residual_ld = count;
    }
    epilogue.activation = clamp_in_plane ? GemmActivation::None : p.gemm_activation;
    epilogue.low = p.low;
    epilogue.high = p.high;
    epilogue.unary = p.activation ? &*p.activation : nullptr;
    store_through_epilogue(sums, count, 1, count, 0, 0,
                           {p.out.data + static_cast<size_t>(at) * elem_size(p.out.elem), p.out.elem, count}, epilogue);
  }
};

// The weight as fp32 [out_channels, group_in * taps]: folded, as stored, or converted into the shared scratch.
const float* direct_weights(const ConvPlan& p, const ScratchSpace& scratch) {
  if (p.scaled_weight.defined()) return p.scaled_weight.data<float>();
  if (p.weight.elem == Elem::F32) return p.weight.as<const float>();
  to_float(p.weight.data, p.weight.elem, scratch.shared_as<float>(), p.weight.numel());
  return scratch.shared_as<float>();
}

// Per worker: `sums` floats of output planes (for outputs not written in place), the group's input planes converted
// to fp32, the padded inputs.
struct DirectScratch {
  int64_t sums = 0, converted = 0, padded = 0;

  DirectScratch(const ConvPlan& p, int64_t sum_floats)
      : sums((sum_floats + 15) / 16 * 16),
        converted((p.g.group_in() * p.g.in_plane() + 15) / 16 * 16),
        padded(p.direct->scratch_floats()) {}
  int64_t floats() const { return sums + converted + padded; }
};

// Pieces of (sample, group, run of the group's outputs) over the pool: each loads its group's input planes once and
// hands them to compute(n, group, run, padded inputs, sums).
template <class Compute>
void over_group_runs(const ConvPlan& p, const DirectScratch& layout, int64_t runs, ThreadPool& pool,
                     const ScratchSpace& scratch, const Compute& compute) {
  const ConvGeometry& g = p.g;
  const int64_t plane = g.in_plane(), group_in = g.group_in();
  pool.parallel_for(g.batch * g.groups * runs, 1, [&](int64_t begin, int64_t end, int worker) {
    float* sums = scratch.worker_as<float>(worker);
    float* converted = sums + layout.sums;
    float* padded = converted + layout.converted;
    p.direct->clear(padded);
    for (int64_t piece = begin; piece < end; ++piece) {
      const int64_t n = piece / runs / g.groups, group = piece / runs % g.groups, run = piece % runs;
      const int64_t in_at = (n * g.in_channels + group * group_in) * plane;
      p.direct->load_inputs(float_data(p.x.data + static_cast<size_t>(in_at) * elem_size(p.x.elem), p.x.elem,
                                       group_in * plane, converted),
                            padded);
      compute(n, group, run, padded, sums);
    }
  });
}

// One output plane at a time; runs of a group's output channels give every worker pieces even with one group.
DirectScratch plane_scratch(const ConvPlan& p) { return DirectScratch(p, p.g.pixels()); }

void run_direct(const ConvPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const ConvGeometry& g = p.g;
  const int64_t pixels = g.pixels(), group_out = g.group_out();
  const int64_t weights_per_output = g.group_in() * g.kernel[0] * g.kernel[1];
  const DirectFinish finish(p);
  const float* weights = direct_weights(p, scratch);
  const int64_t groups = g.batch * g.groups;
  const int64_t runs = std::clamp<int64_t>((4 * pool.size() + groups - 1) / groups, 1, group_out);
  const int64_t per_run = (group_out + runs - 1) / runs;
  over_group_runs(p, plane_scratch(p), runs, pool, scratch,
                  [&](int64_t n, int64_t group, int64_t run, const float* padded, float* sums) {
                    for (int64_t o = group * group_out + run * per_run;
                         o < group * group_out + std::min(group_out, (run + 1) * per_run); ++o) {
                      const int64_t out_at = (n * g.out_channels + o) * pixels;
                      const float bias = p.bias ? load_float(p.bias->data, p.bias->elem, o) : 0.0f;
                      float* plane_out = finish.straight_to_output ? p.out.as<float>() + out_at : sums;
                      p.direct->compute(padded, weights + o * weights_per_output, bias, finish.low, finish.high,
                                        plane_out);
                      if (!finish.straight_to_output)
                        finish.store(p, sums, out_at, pixels);
                      else if (p.activation)
                        apply_unary(*p.activation, plane_out, plane_out, pixels);
                    }
                  });
}

// Grouped convolutions whose groups read more input channels than direct() takes, but whose products are too
// small for the GEMM's tiles and its im2col packing to pay (ResNeXt's 8 to 32 channels a group, RegNet's 8), and
// stems (one group of at most four input channels, an RGB image): the group's inputs are loaded once and its output
// channels computed six at a time from the packed weight panels (DirectConv::compute_panel), with no patch matrix.
// Measured on Zen 4, one thread: ResNeXt-50's grouped 3x3 convolutions of 8 channels over 28x28 1.07 -> 0.50 ms, of 16
// over 14x14 0.66 -> 0.40 ms, of 32 over 7x7 0.53 -> 0.49 ms (its one stride-2 7x7 one 0.55 -> 0.60 ms);
// RegNetY-400MF 12.9 -> 10.6 ms. Stems: ResNet-50's 7x7 2.82 -> 2.17 ms, MobileNetV2's 3x3 0.42 -> 0.26 ms.
constexpr int64_t kMaxPanelGroupOutputs = 64;

bool panels_pay(const ConvPlan& p) {
  const bool stem = p.g.groups == 1 && p.g.group_in() <= 4 && !p.g.pointwise();
  return ((p.g.groups > 1 && !p.g.direct()) || stem) && p.g.group_out() <= kMaxPanelGroupOutputs && !p.packed.empty() &&
         p.packed[0].elem() == Elem::F32 && DirectConv::panels_supported();
}

DirectConvGeometry direct_geometry(const ConvGeometry& g) { return {ConvWindow(g), g.group_in()}; }

// Six output planes at a time (when the output is not written in place).
DirectScratch panel_scratch(const ConvPlan& p) {
  return DirectScratch(p, DirectFinish(p).straight_to_output ? 0 : kGemmTileRows * p.g.pixels());
}

void run_direct_panels(const ConvPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const ConvGeometry& g = p.g;
  const int64_t pixels = g.pixels(), group_out = g.group_out(), out_h = g.out[0], out_w = g.out[1];
  const DirectFinish finish(p);
  // Bands of a group's output rows, all its panels each, only where there are fewer groups than workers (a stem),
  // each loading the group's inputs for itself: the rows split evenly where the panels would not (ResNet's stem, 11
  // panels, two threads: 0.61-0.64 -> 0.56-0.57 ms).
  const int64_t groups = g.batch * g.groups;
  const int64_t runs = std::clamp<int64_t>((pool.size() + groups - 1) / groups, 1, out_h);
  over_group_runs(
      p, panel_scratch(p), runs, pool, scratch,
      [&](int64_t n, int64_t group, int64_t run, const float* padded, float* sums) {
        const PackedMatrix& weights = p.packed[static_cast<size_t>(group)];
        const int64_t row0 = out_h * run / runs, row1 = out_h * (run + 1) / runs;
        const int64_t band_at = row0 * out_w, band = (row1 - row0) * out_w;
        for (int64_t first = 0; first < group_out; first += kGemmTileRows) {
          const int64_t outs = std::min(kGemmTileRows, group_out - first);
          const int64_t channel = group * group_out + first, out_at = (n * g.out_channels + channel) * pixels;
          float bias[kGemmTileRows] = {};
          for (int64_t o = 0; o < outs && p.bias; ++o) bias[o] = load_float(p.bias->data, p.bias->elem, channel + o);
          const auto* panel = reinterpret_cast<const float*>(weights.panel(first / kGemmTileRows));
          float* planes = finish.straight_to_output ? p.out.as<float>() + out_at : sums;
          p.direct->compute_panel(padded, panel, outs, bias, finish.low, finish.high, planes, pixels, row0, row1);
          for (int64_t o = 0; o < outs; ++o) {
            float* rows = planes + o * pixels + band_at;
            if (!finish.straight_to_output)
              finish.store(p, rows, out_at + o * pixels + band_at, band);
            else if (p.activation)
              apply_unary(*p.activation, rows, rows, band);
          }
        }
      });
}

// Depthwise: pieces of (sample, eight channels, band of output rows).
int64_t depthwise_band_floats(const ConvPlan& p) { return p.depthwise->band_rows() * p.g.out[1]; }

void run_depthwise(const ConvPlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const ConvGeometry& g = p.g;
  const DepthwiseConv& conv = *p.depthwise;
  constexpr int64_t kLanes = DepthwiseConv::kChannels;
  const int64_t channels = g.out_channels, pixels = g.pixels(), plane = g.in_plane(), out_w = g.out[1];
  const int64_t taps = g.kernel[0] * g.kernel[1], lane_groups = (channels + kLanes - 1) / kLanes;
  const int64_t bands = conv.bands(), band_floats = depthwise_band_floats(p);
  const DirectFinish finish(p);
  const float* weights = direct_weights(p, scratch);
  pool.parallel_for(g.batch * lane_groups * bands, 1, [&](int64_t begin, int64_t end, int worker) {
    float* work = scratch.worker_as<float>(worker);
    float* sums = work + conv.scratch_floats();  // [8][band] when the output is not written in place
    for (int64_t piece = begin; piece < end; ++piece) {
      const int64_t n = piece / bands / lane_groups, first = piece / bands % lane_groups * kLanes, band = piece % bands;
      const int64_t count = std::min(kLanes, channels - first);
      const int64_t row0 = band * conv.band_rows(), band_pixels = std::min(conv.band_rows(), g.out[0] - row0) * out_w;
      float bias[kLanes] = {};
      for (int64_t c = 0; c < count && p.bias; ++c) bias[c] = load_float(p.bias->data, p.bias->elem, first + c);
      const int64_t out_at = (n * channels + first) * pixels + row0 * out_w;  // channel `first`'s band
      const float* in = p.x.as<const float>() + (n * channels + first) * plane;
      if (finish.straight_to_output) {
        float* out = p.out.as<float>() + out_at;
        conv.run_band(in, weights + first * taps, bias, count, band, finish.low, finish.high, out, pixels, work);
        if (p.activation && bands == 1)  // the channels' whole planes, one after the other
          apply_unary(*p.activation, out, out, count * pixels);
        else
          for (int64_t c = 0; c < count && p.activation; ++c)
            apply_unary(*p.activation, out + c * pixels, out + c * pixels, band_pixels);
        continue;
      }
      conv.run_band(in, weights + first * taps, bias, count, band, finish.low, finish.high, sums, band_floats, work);
      for (int64_t c = 0; c < count; ++c) finish.store(p, sums + c * band_floats, out_at + c * pixels, band_pixels);
    }
  });
}

std::optional<Kernel> conv_kernel(const KernelContext& ctx, std::optional<size_t> bias, std::optional<size_t> residual,
                                  std::optional<UnaryStep> activation) {
  if (ctx.outputs.size() != 1 || ctx.inputs.size() < 2) return std::nullopt;
  for (const Buffer& in : ctx.inputs)
    if (!is_floating(in.meta.dtype) || !is_float_elem(in.elem)) return std::nullopt;
  if (!is_float_elem(ctx.outputs[0].elem)) return std::nullopt;
  auto plan = std::make_shared<ConvPlan>();
  ConvPlan& p = *plan;
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
  split_activation(p, activation);
  Kernel kernel;
  if (p.out.numel() == 0) {
    kernel.run = [] {};
    return kernel;
  }
  // Each residual element is read right before the output element at the same position is written.
  if (residual) kernel.shareable_inputs = {*residual};
  int64_t floats = 0;
  auto reserve = [&floats](int64_t count) {
    const int64_t at = floats;
    floats += (count + 15) / 16 * 16;
    return at;
  };

  if (p.g.direct()) {
    // A weight kept as its source with per-output-channel factors is folded once here (scale_rows).
    if (const double* scales = ctx.row_scales_of(1)) {
      if (!fixed_input(ctx, 1) || p.weight.elem != Elem::F32) return std::nullopt;
      p.scaled_weight = scale_rows(Tensor::borrow(DType::Float32, p.weight.meta.shape, p.weight.data, nullptr),
                                   std::span(scales, static_cast<size_t>(p.g.out_channels)), ctx.pool.size());
      kernel.applies_row_scales = true;
    }
    if (p.weight.elem != Elem::F32 && !p.scaled_weight.defined()) reserve(p.weight.numel());
    ctx.scratch.reserve_shared(floats_bytes(floats));
    const ConvWindow& depthwise = p.g;
    if (p.g.group_in() == 1 && p.g.group_out() == 1 && p.x.elem == Elem::F32 && DepthwiseConv::suitable(depthwise)) {
      p.depthwise.emplace(depthwise);
      const int64_t sums = DirectFinish(p).straight_to_output ? 0 : DepthwiseConv::kChannels * depthwise_band_floats(p);
      ctx.scratch.reserve_per_worker(floats_bytes(p.depthwise->scratch_floats() + sums));
      kernel.run = [plan, pool = &ctx.pool, scratch = &ctx.scratch] { run_depthwise(*plan, *pool, *scratch); };
      return kernel;
    }
    p.direct.emplace(direct_geometry(p.g));
    ctx.scratch.reserve_per_worker(floats_bytes(plane_scratch(p).floats()));
    kernel.run = [plan, pool = &ctx.pool, scratch = &ctx.scratch] { run_direct(*plan, *pool, *scratch); };
    return kernel;
  }

  const ConvGeometry& geo = p.g;
  const WinogradConv::Geometry winograd{geo.in_channels, geo.out_channels, geo.in[0],  geo.in[1],
                                        geo.pad[0],      geo.pad[1],       geo.out[0], geo.out[1]};
  const bool three_by_three = geo.kernel == std::array<int64_t, 2>{3, 3} &&
                              geo.stride == std::array<int64_t, 2>{1, 1} &&
                              geo.dilation == std::array<int64_t, 2>{1, 1} && geo.groups == 1;
  // A weight kept as its source with per-output-channel factors (a folded BatchNorm) is scaled while it is packed.
  const double* scales = ctx.row_scales_of(1);
  if (scales && (!fixed_input(ctx, 1) || p.weight.elem != Elem::F32)) return std::nullopt;
  if (three_by_three && fixed_input(ctx, 1) && WinogradConv::suitable(winograd)) {
    p.winograd.emplace(winograd, p.weight.data, p.weight.elem, ctx.scratch, &ctx.pool, scales);
    p.winograd_scratch = reserve(p.winograd->workspace_floats());
  } else if (fixed_input(ctx, 1)) {
    const size_t w_es = elem_size(p.weight.elem);
    for (int64_t group = 0; group < geo.groups; ++group) {
      const int64_t first_channel = group * geo.group_out();
      p.packed.push_back(PackedMatrix::pack(
          GemmSide::A, p.weight.data + static_cast<size_t>(first_channel * geo.patch()) * w_es, p.weight.elem,
          geo.group_out(), geo.patch(), 0, false, &ctx.pool, scales ? scales + first_channel : nullptr));
    }
  }
  kernel.applies_row_scales = scales != nullptr;
  if (panels_pay(p)) {
    p.direct.emplace(direct_geometry(geo));
    ctx.scratch.reserve_shared(floats_bytes(floats));
    ctx.scratch.reserve_per_worker(floats_bytes(panel_scratch(p).floats()));
    kernel.run = [plan, pool = &ctx.pool, scratch = &ctx.scratch] { run_direct_panels(*plan, *pool, *scratch); };
    return kernel;
  }
  if (!p.winograd)
    p.gemm = PackedGemm({.m = geo.group_out(), .n = geo.pixels(), .k = geo.patch(), .a_prepacked = !p.packed.empty()},
                        ctx.scratch);
  if (p.bias && p.bias->elem != Elem::F32) p.bias_scratch = reserve(geo.out_channels);
  if (!geo.pointwise() && p.x.elem != Elem::F32) p.x_scratch = reserve(geo.in_channels * geo.in_plane());
  if (!p.winograd && !geo.pointwise() && im2col_phases_pay(patches_of(geo, nullptr)))
    p.phases_scratch = reserve(im2col_phase_floats(patches_of(geo, nullptr)));
  p.groups_in_parallel = geo.groups > 1 && !p.winograd && p.phases_scratch < 0 && ctx.pool.size() > 1 &&
                         p.gemm.single_worker(ctx.pool.size());
  ctx.scratch.reserve_shared(floats_bytes(floats));
  kernel.run = [plan, pool = &ctx.pool, scratch = &ctx.scratch] { run_gemm_conv(*plan, *pool, *scratch); };
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
