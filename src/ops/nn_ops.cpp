// Neural-network ops: convolution, normalization, pooling, embedding and scaled dot-product attention.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/gemm.h"
#include "ops/op_util.h"
#include "ops/pool_window.h"

namespace npusim {

namespace {

using namespace ops;

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

AtenSpelling spelling(std::string op_type, std::map<std::string, std::string> rename = {}) {
  return AtenSpelling{std::move(op_type), std::move(rename), {}};
}

std::string str(int64_t value) { return std::to_string(value); }

// Geometry arithmetic on attribute values, which a model file may set to anything: overflow is an error.
int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) fail(what + " is out of range (" + str(a) + " + " + str(b) + ")");
  return result;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) fail(what + " is out of range (" + str(a) + " * " + str(b) + ")");
  return result;
}

void expect_floating(const TensorMeta& meta, const std::string& what) {
  if (!is_floating(meta.dtype))
    fail(what + " must be a floating-point tensor, got " + std::string(dtype_name(meta.dtype)));
}

// An int-list attribute with one value per spatial dim; a single value applies to every dim.
std::vector<int64_t> spatial_ints(const Attrs& attrs, const std::string& name, size_t dims,
                                  std::vector<int64_t> fallback, const std::string& op) {
  std::vector<int64_t> values = attrs.get_ints(name, std::move(fallback));
  if (values.size() == 1) values.assign(dims, values[0]);
  if (values.size() != dims)
    fail(op + ": '" + name + "' needs 1 or " + str(static_cast<int64_t>(dims)) + " values, got " +
         str(static_cast<int64_t>(values.size())));
  return values;
}

void expect_all(const std::vector<int64_t>& values, int64_t minimum, const std::string& what, const std::string& op) {
  for (int64_t v : values)
    if (v < minimum)
      fail(op + ": " + what + " must be " + (minimum == 0 ? "non-negative" : "positive") + ", got " + str(v));
}

// Per-channel parameter vectors ([C]) of a normalization.
void expect_vector(const TensorMeta& meta, int64_t size, const std::string& what) {
  if (meta.shape != Shape{size}) fail(what + " must have shape [" + str(size) + "], got " + shape_string(meta.shape));
}

// ====================================================================================================================
// Convolution: per sample and group one GEMM [Cout/groups, Cin/groups*kh*kw] x [Cin/groups*kh*kw, oh*ow] whose
// right operand (im2col) is produced row by row while the GEMM packs it. A 1-D convolution runs as a 2-D one of
// height 1.

struct ConvGeometry {
  bool batched = true;
  int64_t batch = 1, in_channels = 0, out_channels = 0, groups = 1;
  std::array<int64_t, 2> in{1, 1}, kernel{1, 1}, stride{1, 1}, dilation{1, 1}, pad_before{0, 0}, out{1, 1};
  Shape out_shape;

  int64_t in_group_channels() const { return in_channels / groups; }
  int64_t out_group_channels() const { return out_channels / groups; }
  int64_t pixels() const { return out[0] * out[1]; }
  int64_t patch() const { return in_group_channels() * kernel[0] * kernel[1]; }
  bool pointwise() const {
    return kernel == std::array<int64_t, 2>{1, 1} && stride == std::array<int64_t, 2>{1, 1} &&
           pad_before == std::array<int64_t, 2>{0, 0} && out == in;
  }
};

// Explicit padding per side, from `padding` ints or the `padding_mode` strings "same" / "valid".
void conv_padding(const Attrs& attrs, size_t dims, const std::vector<int64_t>& kernel,
                  const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation,
                  std::vector<int64_t>& before, std::vector<int64_t>& after, const std::string& op) {
  const std::string mode = attrs.is_none("padding_mode") ? "" : attrs.get_string("padding_mode");
  if (mode.empty()) {
    before = spatial_ints(attrs, "padding", dims, {0}, op);
    expect_all(before, 0, "padding", op);
    after = before;
  } else if (mode == "valid") {
    before.assign(dims, 0);
    after.assign(dims, 0);
  } else if (mode == "same") {
    for (int64_t s : stride)
      if (s != 1) fail(op + ": padding='same' is not supported for strided convolutions");
    before.resize(dims);
    after.resize(dims);
    for (size_t d = 0; d < dims; ++d) {
      const int64_t total = checked_mul(dilation[d], kernel[d] - 1, op + ": the kernel extent");
      before[d] = total / 2;  // PyTorch puts the odd element on the far side
      after[d] = total - before[d];
    }
  } else {
    fail(op + ": padding must be a list of integers, \"same\" or \"valid\", got \"" + mode + "\"");
  }
}

ConvGeometry conv_geometry(const Attrs& attrs, std::span<const TensorMeta> inputs, size_t dims, const std::string& op) {
  const Shape& x = inputs[0].shape;
  const Shape& weight = inputs[1].shape;
  expect_floating(inputs[0], op + ": input");
  expect_floating(inputs[1], op + ": weight");
  if (weight.size() != dims + 2)
    fail(op + ": weight must have rank " + str(static_cast<int64_t>(dims + 2)) + ", got shape " + shape_string(weight));
  if (x.size() != dims + 2 && x.size() != dims + 1)
    fail(op + ": input must have rank " + str(static_cast<int64_t>(dims + 1)) + " or " +
         str(static_cast<int64_t>(dims + 2)) + ", got shape " + shape_string(x));

  ConvGeometry g;
  g.batched = x.size() == dims + 2;
  g.batch = g.batched ? x[0] : 1;
  g.in_channels = x[g.batched ? 1 : 0];
  g.out_channels = weight[0];
  g.groups = attrs.get_int("groups", 1);
  if (g.groups < 1) fail(op + ": groups must be positive, got " + str(g.groups));
  const int64_t expected_channels = checked_mul(weight[1], g.groups, op + ": groups=" + str(g.groups));
  if (expected_channels != g.in_channels)
    fail(op + ": input has " + str(g.in_channels) + " channels but weight " + shape_string(weight) +
         " with groups=" + str(g.groups) + " expects " + str(expected_channels));
  if (g.out_channels % g.groups != 0)
    fail(op + ": " + str(g.out_channels) + " output channels are not divisible by groups=" + str(g.groups));
  if (inputs.size() == 3) expect_vector(inputs[2], g.out_channels, op + ": bias");

  const std::vector<int64_t> stride = spatial_ints(attrs, "stride", dims, {1}, op);
  const std::vector<int64_t> dilation = spatial_ints(attrs, "dilation", dims, {1}, op);
  expect_all(stride, 1, "stride", op);
  expect_all(dilation, 1, "dilation", op);
  const std::vector<int64_t> kernel(weight.end() - static_cast<int64_t>(dims), weight.end());
  expect_all(kernel, 1, "kernel size", op);
  std::vector<int64_t> before, after;
  conv_padding(attrs, dims, kernel, stride, dilation, before, after, op);

  g.out_shape = g.batched ? Shape{g.batch, g.out_channels} : Shape{g.out_channels};
  const size_t first = 2 - dims;  // a 1-D convolution fills only the width
  for (size_t d = 0; d < dims; ++d) {
    const int64_t in = x[x.size() - dims + d];
    const int64_t padded = checked_add(checked_add(in, before[d], op + ": padding"), after[d], op + ": padding");
    const int64_t extent = checked_mul(dilation[d], kernel[d] - 1, op + ": the kernel extent") + 1;
    if (extent > padded)
      fail(op + ": kernel extent " + str(extent) + " is larger than the padded input size " + str(padded) + " (input " +
           shape_string(x) + ", weight " + shape_string(weight) + ")");
    const int64_t out = (padded - extent) / stride[d] + 1;
    g.in[first + d] = in;
    g.kernel[first + d] = kernel[d];
    g.stride[first + d] = stride[d];
    g.dilation[first + d] = dilation[d];
    g.pad_before[first + d] = before[d];
    g.out[first + d] = out;
    g.out_shape.push_back(out);
  }
  return g;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Row p = (channel, ky, kx) of the im2col matrix of one group, columns [col, col + count) = output pixels in
// row-major (oy, ox) order: the input values under that kernel tap, zero where the tap reads padding.
void patch_row(const float* input, const ConvGeometry& g, int64_t p, int64_t col, int64_t count, float* out) {
  const int64_t height = g.in[0], width = g.in[1], out_w = g.out[1];
  const int64_t kx = p % g.kernel[1], ky = p / g.kernel[1] % g.kernel[0], channel = p / (g.kernel[0] * g.kernel[1]);
  const float* plane = input + channel * height * width;
  // Output columns whose input column ox * stride + x_shift falls inside [0, width).
  const int64_t x_shift = kx * g.dilation[1] - g.pad_before[1];
  const int64_t ox_begin = std::min(out_w, x_shift >= 0 ? 0 : ceil_div(-x_shift, g.stride[1]));
  const int64_t ox_end = std::clamp(x_shift < width ? (width - 1 - x_shift) / g.stride[1] + 1 : 0, ox_begin, out_w);
  int64_t oy = col / out_w, ox = col % out_w;
  while (count > 0) {
    const int64_t n = std::min(count, out_w - ox);  // the rest of this output row
    const int64_t iy = oy * g.stride[0] - g.pad_before[0] + ky * g.dilation[0];
    if (iy < 0 || iy >= height) {
      std::fill(out, out + n, 0.0f);
    } else {
      const float* src = plane + iy * width;
      const int64_t valid_begin = std::clamp(ox_begin, ox, ox + n), valid_end = std::clamp(ox_end, valid_begin, ox + n);
      std::fill(out, out + (valid_begin - ox), 0.0f);
      if (g.stride[1] == 1) {
        std::copy(src + valid_begin + x_shift, src + valid_end + x_shift, out + (valid_begin - ox));
      } else {
        for (int64_t x = valid_begin; x < valid_end; ++x) out[x - ox] = src[x * g.stride[1] + x_shift];
      }
      std::fill(out + (valid_end - ox), out + n, 0.0f);
    }
    out += n;
    count -= n;
    ox = 0;
    ++oy;
  }
}

std::vector<Tensor> run_conv(const ConvGeometry& g, std::span<const Tensor> inputs, const TensorMeta& out_meta) {
  Tensor out = make_output(out_meta);
  const float* x = inputs[0].data<float>();
  const float* weight = inputs[1].data<float>();
  const float* bias = inputs.size() == 3 ? inputs[2].data<float>() : nullptr;
  float* y = out.mutable_data<float>();
  const int64_t in_plane = g.in[0] * g.in[1];
  const int64_t pixels = g.pixels();
  const int64_t group_in = g.in_group_channels(), group_out = g.out_group_channels();
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t group = 0; group < g.groups; ++group) {
      const float* input = x + (n * g.in_channels + group * group_in) * in_plane;
      float* output = y + (n * g.out_channels + group * group_out) * pixels;
      if (bias)
        for (int64_t o = 0; o < group_out; ++o)
          std::fill(output + o * pixels, output + (o + 1) * pixels, bias[group * group_out + o]);
      // A pointwise convolution multiplies by the input itself; otherwise the GEMM builds im2col rows as it packs.
      const GemmRowSource patches = [input, &g](int64_t p, int64_t col, int64_t count, float* row) {
        patch_row(input, g, p, col, count, row);
      };
      gemm_f32({.m = group_out,
                .n = pixels,
                .k = g.patch(),
                .a = weight + group * group_out * g.patch(),
                .lda = g.patch(),
                .b = input,
                .ldb = pixels,
                .b_rows = g.pointwise() ? nullptr : &patches,
                .c = output,
                .ldc = pixels,
                .beta = bias ? 1.0f : 0.0f});
    }
  }
  return {out};
}

size_t conv_dims(const Shape& weight) { return weight.size() == 3 ? 1 : 2; }

std::vector<TensorMeta> infer_convolution(const Attrs& attrs, std::span<const TensorMeta> inputs, size_t dims,
                                          const std::string& op) {
  if (attrs.get_bool("transposed", false)) fail(op + ": transposed convolution is not supported");
  const DType dtype = inputs.size() == 3
                          ? promote_types(promote_types(inputs[0].dtype, inputs[1].dtype), inputs[2].dtype)
                          : promote_types(inputs[0].dtype, inputs[1].dtype);
  return {{conv_geometry(attrs, inputs, dims, op).out_shape, dtype}};
}

ShapeFn conv_infer(size_t dims, std::string op) {
  return [dims, op](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    return infer_convolution(attrs, inputs, dims == 0 ? conv_dims(inputs[1].shape) : dims, op);
  };
}

std::vector<TensorMeta> metas_of(std::span<const Tensor> inputs) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : inputs) metas.push_back({t.shape(), t.dtype()});
  return metas;
}

ReferenceFn conv_reference(size_t dims, std::string op) {
  return [dims, op](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
    const std::vector<TensorMeta> metas = metas_of(inputs);
    const ConvGeometry g = conv_geometry(attrs, metas, dims == 0 ? conv_dims(inputs[1].shape()) : dims, op);
    return run_conv(g, inputs, outputs[0]);
  };
}

const std::vector<AttrSpec> kConvAttrs = {
    {"stride", AttrType::Ints, AttrValue{std::vector<int64_t>{1}}},
    {"padding", AttrType::Ints, AttrValue{std::vector<int64_t>{0}}},
    {"dilation", AttrType::Ints, AttrValue{std::vector<int64_t>{1}}},
    {"groups", AttrType::Int, AttrValue{int64_t{1}}},
    // The string form of `padding` ("same" or "valid") from the aten.convNd.padding overloads.
    {"padding_mode", AttrType::String, std::nullopt},
};

std::vector<AttrSpec> convolution_attrs() {
  std::vector<AttrSpec> attrs = kConvAttrs;
  attrs.push_back({"transposed", AttrType::Bool, AttrValue{false}});
  attrs.push_back({"output_padding", AttrType::Ints, AttrValue{std::vector<int64_t>{0}}});
  return attrs;
}

// ====================================================================================================================
// Normalization. Optional weight/bias are dropped from the inputs when None; when only one of them is present it is
// taken to be the weight.

struct Affine {
  const float* weight = nullptr;
  const float* bias = nullptr;
};

Affine optional_affine(std::span<const Tensor> params) {
  Affine affine;
  if (params.size() >= 1) affine.weight = params[0].data<float>();
  if (params.size() >= 2) affine.bias = params[1].data<float>();
  return affine;
}

// Mean and 1/sqrt(var + eps) of n values, accumulated in double.
std::pair<double, double> mean_rstd(const float* x, int64_t n, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
  double squares = 0.0;
  for (int64_t i = 0; i < n; ++i) squares += (x[i] - mean) * (x[i] - mean);
  const double variance = n > 0 ? squares / static_cast<double>(n) : 0.0;
  return {mean, 1.0 / std::sqrt(variance + eps)};
}

// ---- batch_norm (inference): inputs x, [weight, [bias,]] running_mean, running_var ----

std::vector<TensorMeta> infer_batch_norm(const Attrs& attrs, std::span<const TensorMeta> inputs, size_t outputs) {
  if (attrs.get_bool("training", false))
    fail("batch_norm: training mode (batch statistics) is not supported; export the model in eval mode");
  const TensorMeta& x = inputs[0];
  expect_floating(x, "batch_norm: input");
  if (x.shape.size() < 2) fail("batch_norm: input must have at least 2 dimensions, got " + shape_string(x.shape));
  const int64_t channels = x.shape[1];
  for (size_t i = 1; i < inputs.size(); ++i)
    expect_vector(inputs[i], channels, "batch_norm: parameter " + str(static_cast<int64_t>(i)));
  std::vector<TensorMeta> metas = {x};
  // _native_batch_norm_legit_no_training also returns empty save_mean / save_invstd.
  for (size_t i = 1; i < outputs; ++i) metas.push_back({{0}, x.dtype});
  return metas;
}

std::vector<Tensor> reference_batch_norm(const Attrs& attrs, std::span<const Tensor> inputs,
                                         std::span<const TensorMeta> outputs) {
  const Tensor& x = inputs[0];
  const size_t count = inputs.size();
  const Affine affine = optional_affine(inputs.subspan(1, count - 3));
  const float* mean = inputs[count - 2].data<float>();
  const float* var = inputs[count - 1].data<float>();
  const double eps = attrs.get_float("eps", 1e-5);
  const int64_t channels = x.dim(1);
  const int64_t inner = shape_numel(Shape(x.shape().begin() + 2, x.shape().end()));
  Tensor out = make_output(outputs[0]);
  const float* src = x.data<float>();
  float* dst = out.mutable_data<float>();
  for (int64_t c = 0; c < channels; ++c) {
    const double scale_d = (affine.weight ? affine.weight[c] : 1.0) / std::sqrt(static_cast<double>(var[c]) + eps);
    const auto scale = static_cast<float>(scale_d);
    const auto shift = static_cast<float>((affine.bias ? affine.bias[c] : 0.0) - mean[c] * scale_d);
    for (int64_t n = 0; n < x.dim(0); ++n) {
      const int64_t base = (n * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[base + i] = src[base + i] * scale + shift;
    }
  }
  std::vector<Tensor> results = {out};
  for (size_t i = 1; i < outputs.size(); ++i) results.push_back(make_output(outputs[i]));
  return results;
}

// ---- layer_norm over the trailing normalized_shape dims ----

struct LayerNormShape {
  int64_t rows = 0, row_size = 1;
  Shape stats_shape;  // leading dims, then 1 per normalized dim
};

LayerNormShape layer_norm_shape(const Attrs& attrs, std::span<const TensorMeta> inputs, const std::string& op) {
  const Shape normalized = attrs.get_ints("normalized_shape");
  const Shape& x = inputs[0].shape;
  expect_floating(inputs[0], op + ": input");
  if (normalized.size() > x.size() ||
      !std::equal(normalized.begin(), normalized.end(), x.end() - static_cast<int64_t>(normalized.size())))
    fail(op + ": normalized_shape " + shape_string(normalized) + " does not match the trailing dims of input " +
         shape_string(x));
  for (size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i].shape != normalized)
      fail(op + ": weight/bias shape " + shape_string(inputs[i].shape) + " differs from normalized_shape " +
           shape_string(normalized));
  LayerNormShape shape;
  shape.row_size = shape_numel(normalized);
  shape.stats_shape.assign(x.begin(), x.end() - static_cast<int64_t>(normalized.size()));
  shape.rows = shape_numel(shape.stats_shape);
  shape.stats_shape.resize(x.size(), 1);
  return shape;
}

std::vector<TensorMeta> infer_layer_norm(const Attrs& attrs, std::span<const TensorMeta> inputs, bool with_stats) {
  const LayerNormShape shape = layer_norm_shape(attrs, inputs, with_stats ? "native_layer_norm" : "layer_norm");
  if (!with_stats) return {inputs[0]};
  return {inputs[0], {shape.stats_shape, inputs[0].dtype}, {shape.stats_shape, inputs[0].dtype}};
}

std::vector<Tensor> reference_layer_norm(const Attrs& attrs, std::span<const Tensor> inputs,
                                         std::span<const TensorMeta> outputs) {
  const std::vector<TensorMeta> metas = metas_of(inputs);
  const LayerNormShape shape = layer_norm_shape(attrs, metas, "layer_norm");
  const Affine affine = optional_affine(inputs.subspan(1));
  const double eps = attrs.get_float("eps", 1e-5);
  std::vector<Tensor> results;
  for (const TensorMeta& meta : outputs) results.push_back(make_output(meta));
  const float* x = inputs[0].data<float>();
  float* y = results[0].mutable_data<float>();
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* row = x + r * shape.row_size;
    const auto [mean, rstd] = mean_rstd(row, shape.row_size, eps);
    for (int64_t i = 0; i < shape.row_size; ++i) {
      double value = (row[i] - mean) * rstd;
      if (affine.weight) value *= affine.weight[i];
      if (affine.bias) value += affine.bias[i];
      y[r * shape.row_size + i] = static_cast<float>(value);
    }
    if (results.size() == 3) {
      results[1].mutable_data<float>()[r] = static_cast<float>(mean);
      results[2].mutable_data<float>()[r] = static_cast<float>(rstd);
    }
  }
  return results;
}

// ---- group_norm: statistics over (C / groups) channels x spatial per sample ----

struct GroupNormShape {
  int64_t batch = 0, channels = 0, groups = 1, inner = 1;
};

GroupNormShape group_norm_shape(std::span<const TensorMeta> inputs, int64_t groups, const std::string& op) {
  const Shape& x = inputs[0].shape;
  expect_floating(inputs[0], op + ": input");
  if (x.size() < 2) fail(op + ": input must have at least 2 dimensions, got " + shape_string(x));
  GroupNormShape shape{x[0], x[1], groups, 1};
  if (groups < 1) fail(op + ": num_groups must be positive, got " + str(groups));
  if (shape.channels % groups != 0)
    fail(op + ": " + str(shape.channels) + " channels are not divisible by num_groups=" + str(groups));
  for (size_t d = 2; d < x.size(); ++d) shape.inner *= x[d];
  for (size_t i = 1; i < inputs.size(); ++i) expect_vector(inputs[i], shape.channels, op + ": weight/bias");
  return shape;
}

int64_t group_count(const Attrs& attrs) {
  return attrs.has("num_groups") ? attrs.get_int("num_groups") : attrs.get_int("group");
}

std::vector<Tensor> run_group_norm(const GroupNormShape& shape, std::span<const Tensor> inputs, double eps,
                                   std::span<const TensorMeta> outputs) {
  std::vector<Tensor> results;
  for (const TensorMeta& meta : outputs) results.push_back(make_output(meta));
  const Affine affine = optional_affine(inputs.subspan(1));
  const int64_t group_channels = shape.channels / shape.groups;
  const int64_t group_size = group_channels * shape.inner;
  const float* x = inputs[0].data<float>();
  float* y = results[0].mutable_data<float>();
  for (int64_t n = 0; n < shape.batch; ++n) {
    for (int64_t g = 0; g < shape.groups; ++g) {
      const int64_t base = (n * shape.groups + g) * group_size;
      const auto [mean, rstd] = mean_rstd(x + base, group_size, eps);
      for (int64_t c = 0; c < group_channels; ++c) {
        const int64_t channel = g * group_channels + c;
        const double scale = rstd * (affine.weight ? affine.weight[channel] : 1.0);
        const double shift = (affine.bias ? affine.bias[channel] : 0.0) - mean * scale;
        for (int64_t i = 0; i < shape.inner; ++i) {
          const int64_t at = base + c * shape.inner + i;
          y[at] = static_cast<float>(x[at] * scale + shift);
        }
      }
      if (results.size() == 3) {
        results[1].mutable_data<float>()[n * shape.groups + g] = static_cast<float>(mean);
        results[2].mutable_data<float>()[n * shape.groups + g] = static_cast<float>(rstd);
      }
    }
  }
  return results;
}

std::vector<TensorMeta> infer_group_norm(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  group_norm_shape(inputs, attrs.get_int("num_groups"), "group_norm");
  return {inputs[0]};
}

std::vector<TensorMeta> infer_native_group_norm(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const GroupNormShape shape = group_norm_shape(inputs, attrs.get_int("group"), "native_group_norm");
  const Shape stats{shape.batch, shape.groups};
  return {inputs[0], {stats, inputs[0].dtype}, {stats, inputs[0].dtype}};
}

std::vector<Tensor> reference_group_norm(const Attrs& attrs, std::span<const Tensor> inputs,
                                         std::span<const TensorMeta> outputs) {
  const std::vector<TensorMeta> metas = metas_of(inputs);
  return run_group_norm(group_norm_shape(metas, group_count(attrs), "group_norm"), inputs, attrs.get_float("eps", 1e-5),
                        outputs);
}

// ---- rms_norm: x / sqrt(mean(x^2) + eps) * weight; eps defaults to the dtype's machine epsilon ----

double machine_epsilon(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return std::numeric_limits<double>::epsilon();
    case DType::Float16:
      return 0.0009765625;  // 2^-10
    case DType::BFloat16:
      return 0.0078125;  // 2^-7
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

std::vector<TensorMeta> infer_rms_norm(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  layer_norm_shape(attrs, inputs, "rms_norm");
  return {inputs[0]};
}

std::vector<Tensor> reference_rms_norm(const Attrs& attrs, std::span<const Tensor> inputs,
                                       std::span<const TensorMeta> outputs) {
  const std::vector<TensorMeta> metas = metas_of(inputs);
  const LayerNormShape shape = layer_norm_shape(attrs, metas, "rms_norm");
  const double eps = attrs.is_none("eps") ? machine_epsilon(outputs[0].dtype) : attrs.get_float("eps");
  const float* weight = inputs.size() == 2 ? inputs[1].data<float>() : nullptr;
  Tensor out = make_output(outputs[0]);
  const float* x = inputs[0].data<float>();
  float* y = out.mutable_data<float>();
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* row = x + r * shape.row_size;
    double squares = 0.0;
    for (int64_t i = 0; i < shape.row_size; ++i) squares += static_cast<double>(row[i]) * row[i];
    const double rms = shape.row_size > 0 ? squares / static_cast<double>(shape.row_size) : 0.0;
    const double scale = 1.0 / std::sqrt(rms + eps);
    for (int64_t i = 0; i < shape.row_size; ++i)
      y[r * shape.row_size + i] = static_cast<float>(row[i] * scale * (weight ? weight[i] : 1.0));
  }
  return {out};
}

const std::vector<AttrSpec> kBatchNormAttrs = {
    {"training", AttrType::Bool, AttrValue{false}},
    {"momentum", AttrType::Float, AttrValue{0.1}},
    {"eps", AttrType::Float, AttrValue{1e-5}},
    {"cudnn_enabled", AttrType::Bool, AttrValue{true}},
};

// ====================================================================================================================
// Pooling over the last two dims of [N, C, H, W] or [C, H, W]; adaptive 1-D pooling runs as height 1.

struct PoolGeometry {
  int64_t planes = 0;
  std::array<int64_t, 2> in{1, 1}, kernel{1, 1}, stride{1, 1}, pad{0, 0}, dilation{1, 1}, out{1, 1};
  Shape out_shape;
};

// PyTorch's pooling_output_shape: floor or ceil division, and no window may start inside the right padding.
int64_t pooled_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode,
                    const std::string& op) {
  // pad <= kernel / 2 is checked first, so only the window extent and the sums can overflow.
  const int64_t extent = checked_mul(dilation, kernel - 1, op + ": the kernel extent");
  const int64_t padded = checked_add(in, checked_mul(2, pad, op + ": padding"), op + ": padding");
  const int64_t numerator =
      checked_add(padded - extent - 1, ceil_mode ? stride - 1 : 0, op + ": the window arithmetic");
  if (numerator < 0) return 0;  // no window fits (and ceil_div could overflow for a huge stride)
  int64_t out = numerator / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

void expect_pool_input(const TensorMeta& x, size_t dims, const std::string& op) {
  expect_floating(x, op + ": input");
  if (x.shape.size() != dims + 1 && x.shape.size() != dims + 2)
    fail(op + ": input must have rank " + str(static_cast<int64_t>(dims + 1)) + " or " +
         str(static_cast<int64_t>(dims + 2)) + ", got shape " + shape_string(x.shape));
  for (size_t d = x.shape.size() - dims; d < x.shape.size(); ++d)
    if (x.shape[d] == 0) fail(op + ": input " + shape_string(x.shape) + " has an empty spatial dim");
}

PoolGeometry pool_geometry(const Attrs& attrs, const TensorMeta& x, bool with_dilation, const std::string& op) {
  expect_pool_input(x, 2, op);
  const ops::PoolWindowReading reading = ops::read_pool_window(attrs, with_dilation);
  if (!reading.window) fail(op + ": " + reading.reason);
  const auto& [kernel, stride, pad, dilation] = *reading.window;
  const bool ceil_mode = attrs.get_bool("ceil_mode", false);

  PoolGeometry g;
  const Shape& shape = x.shape;
  g.out_shape.assign(shape.begin(), shape.end() - 2);
  g.planes = shape_numel(g.out_shape);
  for (size_t d = 0; d < 2; ++d) {
    if (pad[d] > kernel[d] / 2)
      fail(op + ": padding " + str(pad[d]) + " must be at most half the kernel size " + str(kernel[d]));
    g.in[d] = shape[shape.size() - 2 + d];
    g.kernel[d] = kernel[d];
    g.stride[d] = stride[d];
    g.pad[d] = pad[d];
    g.dilation[d] = dilation[d];
    g.out[d] = pooled_size(g.in[d], kernel[d], pad[d], stride[d], dilation[d], ceil_mode, op);
    if (g.out[d] < 1)
      fail(op + ": input " + shape_string(shape) + " is too small for kernel " +
           shape_string(Shape(kernel.begin(), kernel.end())) + " (output size " + str(g.out[d]) + ")");
    g.out_shape.push_back(g.out[d]);
  }
  return g;
}

std::vector<TensorMeta> infer_max_pool(const Attrs& attrs, std::span<const TensorMeta> inputs, bool with_indices) {
  const PoolGeometry g = pool_geometry(attrs, inputs[0], true, "max_pool2d");
  std::vector<TensorMeta> metas = {{g.out_shape, inputs[0].dtype}};
  if (with_indices) metas.push_back({g.out_shape, DType::Int64});
  return metas;
}

std::vector<Tensor> reference_max_pool(const Attrs& attrs, std::span<const Tensor> inputs,
                                       std::span<const TensorMeta> outputs) {
  const PoolGeometry g = pool_geometry(attrs, {inputs[0].shape(), inputs[0].dtype()}, true, "max_pool2d");
  std::vector<Tensor> results;
  for (const TensorMeta& meta : outputs) results.push_back(make_output(meta));
  const bool with_indices = results.size() == 2;
  const float* x = inputs[0].data<float>();
  float* y = results[0].mutable_data<float>();
  int64_t* indices = with_indices ? results[1].mutable_data<int64_t>() : nullptr;
  const int64_t in_plane = g.in[0] * g.in[1], out_plane = g.out[0] * g.out[1];
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* plane = x + p * in_plane;
    for (int64_t oy = 0; oy < g.out[0]; ++oy) {
      for (int64_t ox = 0; ox < g.out[1]; ++ox) {
        float best = kNegativeInfinity;
        int64_t best_index = -1;
        for (int64_t ky = 0; ky < g.kernel[0]; ++ky) {
          const int64_t iy = oy * g.stride[0] - g.pad[0] + ky * g.dilation[0];
          if (iy < 0 || iy >= g.in[0]) continue;
          for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
            const int64_t ix = ox * g.stride[1] - g.pad[1] + kx * g.dilation[1];
            if (ix < 0 || ix >= g.in[1]) continue;
            const float value = plane[iy * g.in[1] + ix];
            if (best_index < 0 || value > best || std::isnan(value)) {  // NaN propagates, like PyTorch
              best = value;
              best_index = iy * g.in[1] + ix;
            }
          }
        }
        const int64_t at = p * out_plane + oy * g.out[1] + ox;
        y[at] = best;
        if (indices) indices[at] = best_index;
      }
    }
  }
  return results;
}

std::vector<TensorMeta> infer_avg_pool(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  if (!attrs.is_none("divisor_override") && attrs.get_int("divisor_override") == 0)
    fail("avg_pool2d: divisor_override must not be zero");
  return {{pool_geometry(attrs, inputs[0], false, "avg_pool2d").out_shape, inputs[0].dtype}};
}

std::vector<Tensor> reference_avg_pool(const Attrs& attrs, std::span<const Tensor> inputs,
                                       std::span<const TensorMeta> outputs) {
  const PoolGeometry g = pool_geometry(attrs, {inputs[0].shape(), inputs[0].dtype()}, false, "avg_pool2d");
  const bool count_include_pad = attrs.get_bool("count_include_pad", true);
  const int64_t divisor_override = attrs.is_none("divisor_override") ? 0 : attrs.get_int("divisor_override");
  Tensor out = make_output(outputs[0]);
  const float* x = inputs[0].data<float>();
  float* y = out.mutable_data<float>();
  const int64_t in_plane = g.in[0] * g.in[1], out_plane = g.out[0] * g.out[1];
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* plane = x + p * in_plane;
    for (int64_t oy = 0; oy < g.out[0]; ++oy) {
      for (int64_t ox = 0; ox < g.out[1]; ++ox) {
        // The window clipped to the padded input counts for count_include_pad; clipped to the input for the sum.
        int64_t y0 = oy * g.stride[0] - g.pad[0], x0 = ox * g.stride[1] - g.pad[1];
        int64_t y1 = std::min(y0 + g.kernel[0], g.in[0] + g.pad[0]);
        int64_t x1 = std::min(x0 + g.kernel[1], g.in[1] + g.pad[1]);
        const int64_t padded_count = (y1 - y0) * (x1 - x0);
        y0 = std::max<int64_t>(y0, 0), x0 = std::max<int64_t>(x0, 0);
        y1 = std::min(y1, g.in[0]), x1 = std::min(x1, g.in[1]);
        double sum = 0.0;
        for (int64_t iy = y0; iy < y1; ++iy)
          for (int64_t ix = x0; ix < x1; ++ix) sum += plane[iy * g.in[1] + ix];
        const int64_t divisor = divisor_override != 0 ? divisor_override
                                : count_include_pad   ? padded_count
                                                      : (y1 - y0) * (x1 - x0);
        y[p * out_plane + oy * g.out[1] + ox] = y0 < y1 && x0 < x1 ? static_cast<float>(sum / divisor) : 0.0f;
      }
    }
  }
  return {out};
}

const std::vector<AttrSpec> kMaxPoolAttrs = {
    {"kernel_size", AttrType::Ints, std::nullopt, true},
    {"stride", AttrType::Ints, AttrValue{std::vector<int64_t>{}}},
    {"padding", AttrType::Ints, AttrValue{std::vector<int64_t>{0}}},
    {"dilation", AttrType::Ints, AttrValue{std::vector<int64_t>{1}}},
    {"ceil_mode", AttrType::Bool, AttrValue{false}},
};

const std::vector<AttrSpec> kAvgPoolAttrs = {
    {"kernel_size", AttrType::Ints, std::nullopt, true},
    {"stride", AttrType::Ints, AttrValue{std::vector<int64_t>{}}},
    {"padding", AttrType::Ints, AttrValue{std::vector<int64_t>{0}}},
    {"ceil_mode", AttrType::Bool, AttrValue{false}},
    {"count_include_pad", AttrType::Bool, AttrValue{true}},
    {"divisor_override", AttrType::Int, std::nullopt},
};

// ---- adaptive average pooling: window i covers [floor(i * in / out), ceil((i + 1) * in / out)) ----

std::vector<TensorMeta> infer_adaptive_avg_pool(const Attrs& attrs, std::span<const TensorMeta> inputs, size_t dims,
                                                const std::string& op) {
  expect_pool_input(inputs[0], dims, op);
  const std::vector<int64_t> size = spatial_ints(attrs, "output_size", dims, {}, op);
  expect_all(size, 0, "output_size", op);
  Shape out(inputs[0].shape.begin(), inputs[0].shape.end() - static_cast<int64_t>(dims));
  out.insert(out.end(), size.begin(), size.end());
  return {{out, inputs[0].dtype}};
}

std::vector<Tensor> run_adaptive_avg_pool(std::span<const Tensor> inputs, const TensorMeta& out_meta, size_t dims) {
  const Shape& in_shape = inputs[0].shape();
  const Shape& out_shape = out_meta.shape;
  const int64_t in_h = dims == 2 ? in_shape[in_shape.size() - 2] : 1, in_w = in_shape.back();
  const int64_t out_h = dims == 2 ? out_shape[out_shape.size() - 2] : 1, out_w = out_shape.back();
  const int64_t planes = shape_numel(Shape(in_shape.begin(), in_shape.end() - static_cast<int64_t>(dims)));
  Tensor out = make_output(out_meta);
  const float* x = inputs[0].data<float>();
  float* y = out.mutable_data<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float* plane = x + p * in_h * in_w;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const int64_t y0 = oy * in_h / out_h, y1 = ceil_div((oy + 1) * in_h, out_h);
      for (int64_t ox = 0; ox < out_w; ++ox) {
        const int64_t x0 = ox * in_w / out_w, x1 = ceil_div((ox + 1) * in_w, out_w);
        double sum = 0.0;
        for (int64_t iy = y0; iy < y1; ++iy)
          for (int64_t ix = x0; ix < x1; ++ix) sum += plane[iy * in_w + ix];
        y[(p * out_h + oy) * out_w + ox] = static_cast<float>(sum / static_cast<double>((y1 - y0) * (x1 - x0)));
      }
    }
  }
  return {out};
}

// ====================================================================================================================
// embedding: rows of weight [V, D] gathered by integer indices of any shape.

std::vector<TensorMeta> infer_embedding(const Attrs&, std::span<const TensorMeta> inputs) {
  const TensorMeta& weight = inputs[0];
  const TensorMeta& indices = inputs[1];
  expect_rank(weight, 2, "embedding: weight");
  if (!is_integral(indices.dtype))
    fail("embedding: indices must be an integer tensor, got " + std::string(dtype_name(indices.dtype)));
  Shape out = indices.shape;
  out.push_back(weight.shape[1]);
  return {{out, weight.dtype}};
}

std::vector<Tensor> reference_embedding(const Attrs&, std::span<const Tensor> inputs,
                                        std::span<const TensorMeta> outputs) {
  const Tensor& weight = inputs[0];
  const Tensor indices = inputs[1].to(DType::Int64);
  Tensor out(weight.dtype(), outputs[0].shape);
  const int64_t rows = weight.dim(0);
  const size_t row_bytes = static_cast<size_t>(weight.dim(1)) * dtype_size(weight.dtype());
  for (int64_t i = 0; i < indices.numel(); ++i) {
    const int64_t index = indices.data<int64_t>()[i];
    if (index < 0 || index >= rows)
      fail("embedding: index " + str(index) + " is out of range for a table of " + str(rows) + " rows");
    std::memcpy(out.mutable_bytes() + static_cast<size_t>(i) * row_bytes,
                weight.bytes() + static_cast<size_t>(index) * row_bytes, row_bytes);
  }
  return {out};
}

// ====================================================================================================================
// scaled_dot_product_attention: softmax(q · k^T * scale + mask) · v over q [..., Hq, L, E], k [..., Hkv, S, E],
// v [..., Hkv, S, Ev]. A row whose every key is masked out yields zeros (PyTorch's math kernel since 2.5).

struct AttentionPlan {
  int64_t length = 0, source = 0, embed = 0, value_embed = 0;
  Shape out_batch;
  int64_t key_group = 1, value_group = 1;  // query heads served by each key / value head
  bool grouped = false;
  Shape out_shape;
};

AttentionPlan attention_plan(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const std::string op = "scaled_dot_product_attention";
  const TensorMeta &q = inputs[0], &k = inputs[1], &v = inputs[2];
  for (const TensorMeta* t : {&q, &k, &v}) {
    expect_floating(*t, op + ": query, key and value");
    if (t->shape.size() < 2) fail(op + ": query, key and value need at least 2 dims, got " + shape_string(t->shape));
  }
  AttentionPlan plan;
  plan.length = q.shape.end()[-2];
  plan.embed = q.shape.back();
  plan.source = k.shape.end()[-2];
  plan.value_embed = v.shape.back();
  if (k.shape.back() != plan.embed)
    fail(op + ": query " + shape_string(q.shape) + " and key " + shape_string(k.shape) + " differ in embedding size");
  if (v.shape.end()[-2] != plan.source)
    fail(op + ": key " + shape_string(k.shape) + " and value " + shape_string(v.shape) + " differ in sequence length");

  Shape q_batch(q.shape.begin(), q.shape.end() - 2);
  Shape k_batch(k.shape.begin(), k.shape.end() - 2);
  Shape v_batch(v.shape.begin(), v.shape.end() - 2);
  if (!q_batch.empty() && !k_batch.empty() && !v_batch.empty()) {
    const int64_t q_heads = q_batch.back(), k_heads = k_batch.back(), v_heads = v_batch.back();
    if (attrs.get_bool("enable_gqa", false)) {
      for (int64_t heads : {k_heads, v_heads})
        if (heads == 0 || q_heads % heads != 0)
          fail(op + ": " + str(q_heads) + " query heads are not a multiple of " + str(heads) + " key/value heads");
      plan.grouped = true;
      plan.key_group = q_heads / k_heads;
      plan.value_group = q_heads / v_heads;
      k_batch.back() = q_heads;
      v_batch.back() = q_heads;
    } else if (q_heads != 1 && ((k_heads != 1 && k_heads != q_heads) || (v_heads != 1 && v_heads != q_heads))) {
      fail(op + ": query has " + str(q_heads) + " heads but key/value have " + str(k_heads) + "/" + str(v_heads) +
           "; grouped-query attention needs enable_gqa=True");
    }
  }
  plan.out_batch = broadcast_shapes(broadcast_shapes(q_batch, k_batch), v_batch);
  plan.out_shape = plan.out_batch;
  plan.out_shape.push_back(plan.length);
  plan.out_shape.push_back(plan.value_embed);

  if (inputs.size() == 4) {
    const TensorMeta& mask = inputs[3];
    if (attrs.get_bool("is_causal", false)) fail(op + ": an explicit attn_mask cannot be combined with is_causal");
    if (mask.dtype != DType::Bool && !is_floating(mask.dtype))
      fail(op + ": attn_mask must be bool or floating-point, got " + std::string(dtype_name(mask.dtype)));
    Shape scores = plan.out_batch;
    scores.push_back(plan.length);
    scores.push_back(plan.source);
    if (broadcast_shapes(mask.shape, scores) != scores)
      fail(op + ": attn_mask " + shape_string(mask.shape) + " does not broadcast to the scores " +
           shape_string(scores));
  }
  return plan;
}

std::vector<TensorMeta> infer_attention(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  return {{attention_plan(attrs, inputs).out_shape, inputs[0].dtype}};
}

// Softmax of one row in place; an all -inf row becomes zeros.
void softmax_row(float* row, int64_t n) {
  float peak = kNegativeInfinity;
  for (int64_t j = 0; j < n; ++j) peak = std::max(peak, row[j]);
  if (peak == kNegativeInfinity) {
    std::fill(row, row + n, 0.0f);
    return;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - peak);
    sum += row[j];
  }
  const auto inverse = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) row[j] *= inverse;
}

std::vector<Tensor> reference_attention(const Attrs& attrs, std::span<const Tensor> inputs,
                                        std::span<const TensorMeta> outputs) {
  const std::vector<TensorMeta> metas = metas_of(inputs);
  const AttentionPlan plan = attention_plan(attrs, metas);
  const int64_t L = plan.length, S = plan.source, E = plan.embed, Ev = plan.value_embed;
  const auto scale =
      static_cast<float>(attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(E)) : attrs.get_float("scale"));
  const bool causal = attrs.get_bool("is_causal", false);
  const int heads_dim = plan.grouped ? static_cast<int>(plan.out_batch.size()) - 1 : -1;
  const std::vector<int64_t> q_offsets = batch_offsets(inputs[0].shape(), plan.out_batch);
  const std::vector<int64_t> k_offsets = batch_offsets(inputs[1].shape(), plan.out_batch, heads_dim, plan.key_group);
  const std::vector<int64_t> v_offsets = batch_offsets(inputs[2].shape(), plan.out_batch, heads_dim, plan.value_group);

  // The mask indexed through broadcast strides over [...out_batch, L, S].
  const Tensor* mask = inputs.size() == 4 ? &inputs[3] : nullptr;
  Shape scores_shape = plan.out_batch;
  scores_shape.push_back(L);
  scores_shape.push_back(S);
  const std::vector<int64_t> mask_strides =
      mask ? broadcast_strides(mask->shape(), scores_shape) : std::vector<int64_t>(scores_shape.size(), 0);
  const int64_t mask_row_stride = mask_strides.end()[-2], mask_col_stride = mask_strides.back();

  Tensor out = make_output(outputs[0]);
  std::vector<float> scores(static_cast<size_t>(L * S));
  std::vector<int64_t> index(plan.out_batch.size(), 0);
  for (size_t batch = 0; batch < q_offsets.size(); ++batch) {
    gemm_f32({.m = L,
              .n = S,
              .k = E,
              .a = inputs[0].data<float>() + q_offsets[batch],
              .lda = E,
              .b = inputs[1].data<float>() + k_offsets[batch],
              .ldb = E,
              .b_transposed = true,
              .c = scores.data(),
              .ldc = S,
              .alpha = scale});
    int64_t mask_offset = 0;
    for (size_t d = 0; d < index.size(); ++d) mask_offset += index[d] * mask_strides[d];
    for (int64_t i = 0; i < L; ++i) {
      float* row = scores.data() + i * S;
      if (causal)
        for (int64_t j = i + 1; j < S; ++j) row[j] = kNegativeInfinity;
      if (mask) {
        const int64_t base = mask_offset + i * mask_row_stride;
        if (mask->dtype() == DType::Bool) {
          const uint8_t* keep = mask->data<uint8_t>() + base;
          for (int64_t j = 0; j < S; ++j)
            if (!keep[j * mask_col_stride]) row[j] = kNegativeInfinity;
        } else {
          const float* add = mask->data<float>() + base;
          for (int64_t j = 0; j < S; ++j) row[j] += add[j * mask_col_stride];
        }
      }
      softmax_row(row, S);
    }
    gemm_f32({.m = L,
              .n = Ev,
              .k = S,
              .a = scores.data(),
              .lda = S,
              .b = inputs[2].data<float>() + v_offsets[batch],
              .ldb = Ev,
              .c = out.mutable_data<float>() + static_cast<int64_t>(batch) * L * Ev,
              .ldc = Ev});
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < plan.out_batch[d]) break;
      index[d] = 0;
    }
  }
  return {out};
}

}  // namespace

void register_nn_ops(OpRegistry& r) {
  r.add(OpDef{"conv2d",
              {spelling("aten.conv2d.default"), spelling("aten.conv2d.padding", {{"padding", "padding_mode"}})},
              kConvAttrs,
              2,
              3,
              conv_infer(2, "conv2d"),
              conv_reference(2, "conv2d")});
  r.add(OpDef{"conv1d",
              {spelling("aten.conv1d.default"), spelling("aten.conv1d.padding", {{"padding", "padding_mode"}})},
              kConvAttrs,
              2,
              3,
              conv_infer(1, "conv1d"),
              conv_reference(1, "conv1d")});
  // The generic form: 1-D or 2-D by the weight's rank; only transposed=false.
  r.add(OpDef{"convolution",
              {spelling("aten.convolution.default"), spelling("aten._convolution.default")},
              convolution_attrs(),
              2,
              3,
              conv_infer(0, "convolution"),
              conv_reference(0, "convolution")});

  r.add(OpDef{"batch_norm",
              {spelling("aten.batch_norm.default")},
              kBatchNormAttrs,
              3,
              5,
              [](const Attrs& attrs, std::span<const TensorMeta> inputs) { return infer_batch_norm(attrs, inputs, 1); },
              reference_batch_norm});
  r.add(OpDef{"native_batch_norm",
              {spelling("aten._native_batch_norm_legit_no_training.default")},
              {{"momentum", AttrType::Float, AttrValue{0.1}}, {"eps", AttrType::Float, AttrValue{1e-5}}},
              3,
              5,
              [](const Attrs& attrs, std::span<const TensorMeta> inputs) { return infer_batch_norm(attrs, inputs, 3); },
              reference_batch_norm});
  const std::vector<AttrSpec> layer_norm_attrs = {{"normalized_shape", AttrType::Ints, std::nullopt, true},
                                                  {"eps", AttrType::Float, AttrValue{1e-5}},
                                                  {"cudnn_enable", AttrType::Bool, AttrValue{true}}};
  r.add(OpDef{
      "layer_norm",
      {spelling("aten.layer_norm.default")},
      layer_norm_attrs,
      1,
      3,
      [](const Attrs& attrs, std::span<const TensorMeta> inputs) { return infer_layer_norm(attrs, inputs, false); },
      reference_layer_norm});
  r.add(OpDef{
      "native_layer_norm",
      {spelling("aten.native_layer_norm.default")},
      layer_norm_attrs,
      1,
      3,
      [](const Attrs& attrs, std::span<const TensorMeta> inputs) { return infer_layer_norm(attrs, inputs, true); },
      reference_layer_norm});
  r.add(OpDef{"group_norm",
              {spelling("aten.group_norm.default")},
              {{"num_groups", AttrType::Int, std::nullopt, true},
               {"eps", AttrType::Float, AttrValue{1e-5}},
               {"cudnn_enabled", AttrType::Bool, AttrValue{true}}},
              1,
              3,
              infer_group_norm,
              reference_group_norm});
  r.add(OpDef{"native_group_norm",
              {spelling("aten.native_group_norm.default")},
              {{"N", AttrType::Int, std::nullopt},
               {"C", AttrType::Int, std::nullopt},
               {"HxW", AttrType::Int, std::nullopt},
               {"group", AttrType::Int, std::nullopt, true},
               {"eps", AttrType::Float, AttrValue{1e-5}}},
              1,
              3,
              infer_native_group_norm,
              reference_group_norm});
  r.add(OpDef{"rms_norm",
              {spelling("aten.rms_norm.default")},
              {{"normalized_shape", AttrType::Ints, std::nullopt, true}, {"eps", AttrType::Float, std::nullopt}},
              1,
              2,
              infer_rms_norm,
              reference_rms_norm});

  r.add(
      OpDef{"max_pool2d",
            {spelling("aten.max_pool2d.default")},
            kMaxPoolAttrs,
            1,
            1,
            [](const Attrs& attrs, std::span<const TensorMeta> inputs) { return infer_max_pool(attrs, inputs, false); },
            reference_max_pool});
  r.add(
      OpDef{"max_pool2d_with_indices",
            {spelling("aten.max_pool2d_with_indices.default")},
            kMaxPoolAttrs,
            1,
            1,
            [](const Attrs& attrs, std::span<const TensorMeta> inputs) { return infer_max_pool(attrs, inputs, true); },
            reference_max_pool});
  r.add(OpDef{
      "avg_pool2d", {spelling("aten.avg_pool2d.default")}, kAvgPoolAttrs, 1, 1, infer_avg_pool, reference_avg_pool});
  r.add(OpDef{"adaptive_avg_pool2d",
              {spelling("aten.adaptive_avg_pool2d.default"), spelling("aten._adaptive_avg_pool2d.default")},
              {{"output_size", AttrType::Ints, std::nullopt, true}},
              1,
              1,
              [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
                return infer_adaptive_avg_pool(attrs, inputs, 2, "adaptive_avg_pool2d");
              },
              [](const Attrs&, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
                return run_adaptive_avg_pool(inputs, outputs[0], 2);
              }});
  r.add(OpDef{"adaptive_avg_pool1d",
              {spelling("aten.adaptive_avg_pool1d.default")},
              {{"output_size", AttrType::Ints, std::nullopt, true}},
              1,
              1,
              [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
                return infer_adaptive_avg_pool(attrs, inputs, 1, "adaptive_avg_pool1d");
              },
              [](const Attrs&, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
                return run_adaptive_avg_pool(inputs, outputs[0], 1);
              }});

  r.add(OpDef{"embedding",
              {spelling("aten.embedding.default")},
              {{"padding_idx", AttrType::Int, AttrValue{int64_t{-1}}},
               {"scale_grad_by_freq", AttrType::Bool, AttrValue{false}},
               {"sparse", AttrType::Bool, AttrValue{false}}},
              2,
              2,
              infer_embedding,
              reference_embedding});

  r.add(OpDef{"scaled_dot_product_attention",
              {spelling("aten.scaled_dot_product_attention.default")},
              {{"dropout_p", AttrType::Float, AttrValue{0.0}},
               {"is_causal", AttrType::Bool, AttrValue{false}},
               {"scale", AttrType::Float, std::nullopt},
               {"enable_gqa", AttrType::Bool, AttrValue{false}}},
              3,
              4,
              infer_attention,
              reference_attention});
}

}  // namespace npusim
