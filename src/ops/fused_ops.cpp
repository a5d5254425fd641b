// Ops that only the compiler's fusion passes create. Each stands for a chain of registered ops, and its reference
// computes exactly that chain (mostly by running the chain's own reference implementations one after the other),
// so a fused graph gives the same numbers as the unfused one.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/elementwise_util.h"
#include "ops/gemm.h"
#include "ops/op_util.h"

namespace npusim {

namespace {

using namespace ops;

std::string str(int64_t value) { return std::to_string(value); }

const OpDef& registered(const std::string& op) {
  const OpDef* def = OpRegistry::instance().find(op);
  if (!def) fail("internal: op '" + op + "' is not registered");
  return *def;
}

std::vector<TensorMeta> metas_of(std::span<const Tensor> tensors) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : tensors) metas.push_back({t.shape(), t.dtype()});
  return metas;
}

// Shape inference of one registered op of the chain, with its attribute defaults filled in.
TensorMeta infer_step(const std::string& op, Attrs attrs, std::span<const TensorMeta> inputs) {
  const OpDef& def = registered(op);
  OpRegistry::instance().normalize_attrs(def, nullptr, attrs, op);
  return def.infer(attrs, inputs).at(0);
}

// One registered op's reference on reference-domain tensors.
Tensor run_step(const std::string& op, Attrs attrs, std::vector<Tensor> inputs) {
  const OpDef& def = registered(op);
  OpRegistry::instance().normalize_attrs(def, nullptr, attrs, op);
  const std::vector<TensorMeta> out = def.infer(attrs, metas_of(inputs));
  return def.reference(attrs, inputs, out).at(0);
}

// The chain's result as the fused node's output (same shape; the reference dtype of the declared dtype).
std::vector<Tensor> as_output(const Tensor& result, const TensorMeta& meta) {
  if (result.shape() != meta.shape)
    fail("internal: fused result has shape " + shape_string(result.shape()) + ", expected " + shape_string(meta.shape));
  return {result.to(reference_dtype(meta.dtype))};
}

void expect_count(std::span<const TensorMeta> inputs, size_t count, const std::string& op) {
  if (inputs.size() != count)
    fail(op + " expects " + str(static_cast<int64_t>(count)) + " inputs, got " +
         str(static_cast<int64_t>(inputs.size())));
}

// ====================================================================================================================
// fused_conv2d: conv2d(x, w, b?) [+ residual] [-> activation]. Inputs x, w, then b when has_bias, then the
// residual (same shape as the convolution's output) when has_residual.
// fused_batch_norm: batch_norm(x, ...) -> activation, batch_norm's inputs and attributes.

// Activations a fused conv or batch norm may end with: registered unary ops, with the attributes they take.
struct Activation {
  const char* op;
  std::vector<const char*> params;
};

const std::vector<Activation>& conv_activations() {
  static const std::vector<Activation> table = {
      {"relu", {}},      {"hardtanh", {"min_val", "max_val"}},
      {"silu", {}},      {"sigmoid", {}},
      {"tanh", {}},      {"gelu", {"approximate"}},
      {"hardswish", {}}, {"leaky_relu", {"negative_slope"}},
  };
  return table;
}

// The activation's own attributes, or nullopt for "none"; `op` names the fused op in errors.
std::optional<std::pair<std::string, Attrs>> fused_activation(const Attrs& attrs, const std::string& op) {
  const std::string& name = attrs.get_string("activation");
  if (name == "none") return std::nullopt;
  for (const Activation& activation : conv_activations()) {
    if (name != activation.op) continue;
    Attrs params;
    for (const char* param : activation.params)
      if (!attrs.is_none(param)) params.set(param, attrs.get(param));
    return std::make_pair(name, params);
  }
  std::string known = "none";
  for (const Activation& activation : conv_activations()) known += std::string(", ") + activation.op;
  fail(op + ": unknown activation '" + name + "' (known: " + known + ")");
}

// What the fused op `op` writes after its activation (none: `pre` itself): the output's meta, or its values.
TensorMeta activated(const Attrs& attrs, const std::string& op, const TensorMeta& pre) {
  const auto activation = fused_activation(attrs, op);
  if (!activation) return pre;
  const std::vector<TensorMeta> inputs{pre};
  return infer_step(activation->first, activation->second, inputs);
}

Tensor activated(const Attrs& attrs, const std::string& op, const Tensor& pre) {
  const auto activation = fused_activation(attrs, op);
  return activation ? run_step(activation->first, activation->second, {pre}) : pre;
}

struct FusedConvInputs {
  size_t conv = 2;  // x, w, and b when present
  std::optional<size_t> residual;
};

FusedConvInputs fused_conv_inputs(const Attrs& attrs, size_t count) {
  FusedConvInputs parts;
  if (attrs.get_bool("has_bias", false)) parts.conv = 3;
  if (attrs.get_bool("has_residual", false)) parts.residual = parts.conv;
  const size_t expected = parts.conv + (parts.residual ? 1 : 0);
  if (count != expected)
    fail("fused_conv2d expects " + str(static_cast<int64_t>(expected)) + " inputs (x, weight" +
         (parts.conv == 3 ? ", bias" : "") + (parts.residual ? ", residual" : "") +
         ") for has_bias=" + (parts.conv == 3 ? "true" : "false") +
         " has_residual=" + (parts.residual ? "true" : "false") + ", got " + str(static_cast<int64_t>(count)));
  return parts;
}

std::vector<TensorMeta> infer_fused_conv(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const FusedConvInputs parts = fused_conv_inputs(attrs, inputs.size());
  TensorMeta out = infer_step("conv2d", attrs, inputs.first(parts.conv));
  if (parts.residual) {
    const TensorMeta& residual = inputs[*parts.residual];
    if (residual.shape != out.shape)
      fail("fused_conv2d: the residual " + shape_string(residual.shape) + " must have the convolution's shape " +
           shape_string(out.shape));
    out.dtype = promote_types(out.dtype, residual.dtype);
  }
  return {activated(attrs, "fused_conv2d", out)};
}

std::vector<Tensor> reference_fused_conv(const Attrs& attrs, std::span<const Tensor> inputs,
                                         std::span<const TensorMeta> outputs) {
  const FusedConvInputs parts = fused_conv_inputs(attrs, inputs.size());
  Tensor y = run_step("conv2d", attrs, {inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(parts.conv)});
  if (parts.residual) y = run_step("add", {}, {y, inputs[*parts.residual]});
  return as_output(activated(attrs, "fused_conv2d", y), outputs[0]);
}

std::vector<TensorMeta> infer_fused_batch_norm(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  return {activated(attrs, "fused_batch_norm", infer_step("batch_norm", attrs, inputs))};
}

std::vector<Tensor> reference_fused_batch_norm(const Attrs& attrs, std::span<const Tensor> inputs,
                                               std::span<const TensorMeta> outputs) {
  const Tensor y = run_step("batch_norm", attrs, {inputs.begin(), inputs.end()});
  return as_output(activated(attrs, "fused_batch_norm", y), outputs[0]);
}

// The activation and its parameters, as fused_conv2d and fused_batch_norm take them.
const std::vector<AttrSpec> kActivationAttrs = {
    // "none" or a registered activation; its parameters keep the activation's attribute names
    {"activation", AttrType::String, AttrValue{std::string("none")}},
    {"min_val", AttrType::Float, std::nullopt},
    {"max_val", AttrType::Float, std::nullopt},
    {"negative_slope", AttrType::Float, std::nullopt},
    {"approximate", AttrType::String, std::nullopt},
};

std::vector<AttrSpec> with_activation(std::vector<AttrSpec> attrs) {
  attrs.insert(attrs.end(), kActivationAttrs.begin(), kActivationAttrs.end());
  return attrs;
}

const std::vector<AttrSpec> kFusedConvAttrs = with_activation({
    // conv2d's own
    {"stride", AttrType::Ints, AttrValue{std::vector<int64_t>{1}}},
    {"padding", AttrType::Ints, AttrValue{std::vector<int64_t>{0}}},
    {"dilation", AttrType::Ints, AttrValue{std::vector<int64_t>{1}}},
    {"groups", AttrType::Int, AttrValue{int64_t{1}}},
    {"padding_mode", AttrType::String, std::nullopt},
    {"has_bias", AttrType::Bool, AttrValue{false}},
    {"has_residual", AttrType::Bool, AttrValue{false}},
});

// batch_norm's own (nn_ops.cpp) and the activation's.
const std::vector<AttrSpec> kFusedBatchNormAttrs = with_activation({
    {"training", AttrType::Bool, AttrValue{false}},
    {"momentum", AttrType::Float, AttrValue{0.1}},
    {"eps", AttrType::Float, AttrValue{1e-5}},
    {"cudnn_enabled", AttrType::Bool, AttrValue{true}},
});

// ====================================================================================================================
// add_relu(a, b) = relu(a + b), broadcasting; silu_mul(gate, up) = silu(gate) * up, broadcasting.

std::vector<TensorMeta> infer_add_relu(const Attrs&, std::span<const TensorMeta> inputs) {
  expect_count(inputs, 2, "add_relu");
  const std::vector<TensorMeta> sum{infer_step("add", {}, inputs)};
  return {infer_step("relu", {}, sum)};
}

std::vector<Tensor> reference_add_relu(const Attrs&, std::span<const Tensor> inputs,
                                       std::span<const TensorMeta> outputs) {
  return as_output(run_step("relu", {}, {run_step("add", {}, {inputs[0], inputs[1]})}), outputs[0]);
}

std::vector<TensorMeta> infer_silu_mul(const Attrs&, std::span<const TensorMeta> inputs) {
  expect_count(inputs, 2, "silu_mul");
  const std::vector<TensorMeta> operands{infer_step("silu", {}, inputs.first(1)), inputs[1]};
  return {infer_step("mul", {}, operands)};
}

std::vector<Tensor> reference_silu_mul(const Attrs&, std::span<const Tensor> inputs,
                                       std::span<const TensorMeta> outputs) {
  return as_output(run_step("mul", {}, {run_step("silu", {}, {inputs[0]}), inputs[1]}), outputs[0]);
}

// ====================================================================================================================
// rope(x, cos, sin) = x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x2, x1) over the halves x1, x2
// of x's last dim (Hugging Face apply_rotary_pos_emb). cos and sin broadcast to x's shape.

std::vector<TensorMeta> infer_rope(const Attrs&, std::span<const TensorMeta> inputs) {
  expect_count(inputs, 3, "rope");
  const TensorMeta& x = inputs[0];
  if (!is_floating(x.dtype)) fail("rope: x must be a floating-point tensor, got " + std::string(dtype_name(x.dtype)));
  if (x.shape.empty() || x.shape.back() % 2 != 0)
    fail("rope: x needs a last dim of even size, got shape " + shape_string(x.shape));
  DType dtype = x.dtype;
  for (size_t i = 1; i < 3; ++i) {
    const char* what = i == 1 ? "cos" : "sin";
    if (broadcast_shapes(x.shape, inputs[i].shape) != x.shape)
      fail(std::string("rope: ") + what + " " + shape_string(inputs[i].shape) + " does not broadcast to x " +
           shape_string(x.shape));
    dtype = promote_types(dtype, inputs[i].dtype);
  }
  return {{x.shape, dtype}};
}

// Each product and the sum are rounded to fp32, as the unfused muls and add round them.
std::vector<Tensor> reference_rope(const Attrs&, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
  const Shape& shape = outputs[0].shape;
  const int64_t width = shape.back(), half = width / 2;
  const float* x = inputs[0].data<float>();
  const float* cos = inputs[1].data<float>();
  const float* sin = inputs[2].data<float>();
  Tensor out = make_output(outputs[0]);
  float* y = out.mutable_data<float>();
  const std::vector<Shape> shapes{inputs[0].shape(), inputs[1].shape(), inputs[2].shape()};
  for_each_broadcast(shape, shapes, [&](int64_t i, std::span<const int64_t> at) {
    const int64_t column = i % width;
    const float rotated = column < half ? -x[i + half] : x[i - half];
    const auto direct = static_cast<float>(static_cast<double>(x[i]) * cos[at[1]]);
    const auto turned = static_cast<float>(static_cast<double>(rotated) * sin[at[2]]);
    y[i] = static_cast<float>(static_cast<double>(direct) + turned);
  });
  return {out};
}

// ====================================================================================================================
// attention(q, k, v, mask?, cache_position?) = softmax(q · kᵀ · scale + mask) · v over q [...batch, Hq, L, E],
// k [...batch, Hk, S, E], v [...batch, Hv, S, Ev]; Hq is a multiple of Hk and Hv and query head h reads key head
// h / (Hq / Hk) (grouped-query attention). The mask (additive float, or bool: false = masked out) broadcasts to
// the scores [...batch, Hq, L, S]. With cache_position (decode against a static cache) only key positions
// 0..max(cache_position) are read: later ones must be masked out anyway, and kernels may skip them.
// A row whose every score is -inf gives NaN like the softmax it replaces, or zeros with zero_masked_rows
// (scaled_dot_product_attention's rule).

struct AttentionShape {
  Shape batch;
  int64_t q_heads = 0, k_heads = 0, v_heads = 0, length = 0, source = 0, embed = 0, value_embed = 0;
  std::optional<size_t> mask, position;  // input indices
  Shape scores() const {
    Shape s = batch;
    s.insert(s.end(), {q_heads, length, source});
    return s;
  }
};

AttentionShape attention_shape(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  AttentionShape a;
  size_t next = 3;
  if (attrs.get_bool("has_mask", false)) a.mask = next++;
  if (attrs.get_bool("has_cache_position", false)) a.position = next++;
  if (inputs.size() != next)
    fail("attention expects " + str(static_cast<int64_t>(next)) + " inputs (q, k, v" + (a.mask ? ", mask" : "") +
         (a.position ? ", cache_position" : "") + "), got " + str(static_cast<int64_t>(inputs.size())));
  const TensorMeta &q = inputs[0], &k = inputs[1], &v = inputs[2];
  for (const TensorMeta* t : {&q, &k, &v}) {
    if (!is_floating(t->dtype))
      fail("attention: q, k and v must be floating-point, got " + std::string(dtype_name(t->dtype)));
    if (t->shape.size() < 3 || t->shape.size() != q.shape.size())
      fail("attention: q, k and v need the same rank (at least 3: heads, positions, features), got " +
           shape_string(q.shape) + ", " + shape_string(k.shape) + ", " + shape_string(v.shape));
  }
  const size_t rank = q.shape.size();
  a.batch.assign(q.shape.begin(), q.shape.end() - 3);
  if (!std::equal(a.batch.begin(), a.batch.end(), k.shape.begin()) ||
      !std::equal(a.batch.begin(), a.batch.end(), v.shape.begin()))
    fail("attention: q " + shape_string(q.shape) + ", k " + shape_string(k.shape) + " and v " + shape_string(v.shape) +
         " differ in their batch dims");
  a.q_heads = q.shape[rank - 3];
  a.k_heads = k.shape[rank - 3];
  a.v_heads = v.shape[rank - 3];
  for (int64_t heads : {a.k_heads, a.v_heads})
    if (heads == 0 || a.q_heads % heads != 0)
      fail("attention: " + str(a.q_heads) + " query heads are not a multiple of " + str(heads) + " key/value heads");
  a.length = q.shape[rank - 2];
  a.embed = q.shape[rank - 1];
  a.source = k.shape[rank - 2];
  a.value_embed = v.shape[rank - 1];
  if (k.shape[rank - 1] != a.embed)
    fail("attention: q " + shape_string(q.shape) + " and k " + shape_string(k.shape) + " differ in feature size");
  if (v.shape[rank - 2] != a.source)
    fail("attention: k " + shape_string(k.shape) + " and v " + shape_string(v.shape) + " differ in positions");
  if (a.mask) {
    const TensorMeta& mask = inputs[*a.mask];
    if (attrs.get_bool("is_causal", false)) fail("attention: a mask cannot be combined with is_causal");
    if (mask.dtype != DType::Bool && !is_floating(mask.dtype))
      fail("attention: the mask must be bool or floating-point, got " + std::string(dtype_name(mask.dtype)));
    if (mask.shape.size() > rank || broadcast_shapes(mask.shape, a.scores()) != a.scores())
      fail("attention: the mask " + shape_string(mask.shape) + " does not broadcast to the scores " +
           shape_string(a.scores()));
  }
  if (a.position) {
    const TensorMeta& position = inputs[*a.position];
    if (!is_integral(position.dtype) || position.shape.size() > 1)
      fail("attention: cache_position must be a 0-d or 1-d integer tensor, got " + shape_string(position.shape) + " " +
           std::string(dtype_name(position.dtype)));
  }
  return a;
}

std::vector<TensorMeta> infer_fused_attention(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const AttentionShape a = attention_shape(attrs, inputs);
  Shape out = a.batch;
  out.insert(out.end(), {a.q_heads, a.length, a.value_embed});
  return {{out, inputs[0].dtype}};
}

// Key positions read: all of them, or 0..max(cache_position).
int64_t attended_positions(const AttentionShape& a, std::span<const Tensor> inputs) {
  if (!a.position || inputs[*a.position].numel() == 0) return a.source;
  const Tensor& position = inputs[*a.position];
  const int64_t* p = position.data<int64_t>();
  const int64_t last = *std::max_element(p, p + position.numel());
  return std::clamp<int64_t>(last + 1, 0, a.source);
}

// softmax_line of the reduction family, in place on one row of fp32 scores.
void softmax_row(float* row, int64_t n, bool zero_masked_rows) {
  double peak = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) peak = std::max(peak, static_cast<double>(row[j]));
  if (zero_masked_rows && peak == -std::numeric_limits<double>::infinity()) {
    std::fill(row, row + n, 0.0f);
    return;
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - peak);
  for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(std::exp(row[j] - peak) / sum);
}

std::vector<Tensor> reference_fused_attention(const Attrs& attrs, std::span<const Tensor> inputs,
                                              std::span<const TensorMeta> outputs) {
  const AttentionShape a = attention_shape(attrs, metas_of(inputs));
  const int64_t L = a.length, E = a.embed, Ev = a.value_embed, S = a.source;
  const int64_t reads = attended_positions(a, inputs);
  const auto scale =
      static_cast<float>(attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(E)) : attrs.get_float("scale"));
  const bool causal = attrs.get_bool("is_causal", false);
  const bool zero_masked_rows = attrs.get_bool("zero_masked_rows", false);
  const Tensor* mask = a.mask ? &inputs[*a.mask] : nullptr;
  const Shape scores_shape = a.scores();
  const std::vector<int64_t> mask_strides =
      mask ? broadcast_strides(mask->shape(), scores_shape) : std::vector<int64_t>(scores_shape.size(), 0);
  const size_t batch_dims = a.batch.size();
  const int64_t mask_row = mask_strides[batch_dims + 1], mask_column = mask_strides[batch_dims + 2];

  Tensor out = make_output(outputs[0]);
  std::vector<float> scores(static_cast<size_t>(L * reads));
  const int64_t batches = shape_numel(a.batch);
  for (int64_t b = 0; b < batches; ++b) {
    int64_t mask_batch = 0;
    for (size_t d = batch_dims, rest = static_cast<size_t>(b); d-- > 0;) {
      const auto size = static_cast<size_t>(a.batch[d]);
      mask_batch += static_cast<int64_t>(rest % size) * mask_strides[d];
      rest /= size;
    }
    for (int64_t h = 0; h < a.q_heads; ++h) {
      const float* q = inputs[0].data<float>() + (b * a.q_heads + h) * L * E;
      const float* k = inputs[1].data<float>() + (b * a.k_heads + h / (a.q_heads / a.k_heads)) * S * E;
      const float* v = inputs[2].data<float>() + (b * a.v_heads + h / (a.q_heads / a.v_heads)) * S * Ev;
      gemm_f32({.m = L,
                .n = reads,
                .k = E,
                .a = q,
                .lda = E,
                .b = k,
                .ldb = E,
                .b_transposed = true,
                .c = scores.data(),
                .ldc = reads});
      for (int64_t i = 0; i < L; ++i) {
        float* row = scores.data() + i * reads;
        // The scalar mul and the mask add of the unfused chain, each rounded to fp32.
        for (int64_t j = 0; j < reads; ++j) row[j] = static_cast<float>(static_cast<double>(row[j]) * scale);
        if (causal)
          for (int64_t j = i + 1; j < reads; ++j) row[j] = -std::numeric_limits<float>::infinity();
        if (mask) {
          const int64_t base = mask_batch + h * mask_strides[batch_dims] + i * mask_row;
          if (mask->dtype() == DType::Bool) {
            const uint8_t* keep = mask->data<uint8_t>() + base;
            for (int64_t j = 0; j < reads; ++j)
              if (!keep[j * mask_column]) row[j] = -std::numeric_limits<float>::infinity();
          } else {
            const float* add = mask->data<float>() + base;
            for (int64_t j = 0; j < reads; ++j)
              row[j] = static_cast<float>(static_cast<double>(row[j]) + add[j * mask_column]);
          }
        }
        softmax_row(row, reads, zero_masked_rows);
      }
      gemm_f32({.m = L,
                .n = Ev,
                .k = reads,
                .a = scores.data(),
                .lda = reads,
                .b = v,
                .ldb = Ev,
                .c = out.mutable_data<float>() + (b * a.q_heads + h) * L * Ev,
                .ldc = Ev});
    }
  }
  return {out};
}

// ====================================================================================================================
// masked_softmax(scores, mask) = softmax(scores + mask) over the last dim, broadcasting; `dtype` as softmax's.

Attrs softmax_attrs(const Attrs& attrs) {
  Attrs softmax;
  softmax.set("dim", int64_t{-1});
  if (!attrs.is_none("dtype")) softmax.set("dtype", attrs.get("dtype"));
  return softmax;
}

std::vector<TensorMeta> infer_masked_softmax(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  expect_count(inputs, 2, "masked_softmax");
  const std::vector<TensorMeta> sum{infer_step("add", {}, inputs)};
  return {infer_step("softmax", softmax_attrs(attrs), sum)};
}

std::vector<Tensor> reference_masked_softmax(const Attrs& attrs, std::span<const Tensor> inputs,
                                             std::span<const TensorMeta> outputs) {
  return as_output(run_step("softmax", softmax_attrs(attrs), {run_step("add", {}, {inputs[0], inputs[1]})}),
                   outputs[0]);
}

// ====================================================================================================================
// elementwise_chain(x): the ops named in `ops` (comma-separated) applied in order. Steps that take a number read
// it from `scalars` (one entry per step; ignored by the others).

struct ChainStep {
  const char* op;
  const char* scalar;  // the step's attribute that receives its number, or null
};

constexpr ChainStep kChainSteps[] = {
    {"neg", nullptr},
    {"abs", nullptr},
    {"exp", nullptr},
    {"log", nullptr},
    {"sqrt", nullptr},
    {"rsqrt", nullptr},
    {"reciprocal", nullptr},
    {"sin", nullptr},
    {"cos", nullptr},
    {"tanh", nullptr},
    {"sigmoid", nullptr},
    {"erf", nullptr},
    {"relu", nullptr},
    {"silu", nullptr},
    {"gelu", nullptr},
    {"hardswish", nullptr},
    {"hardsigmoid", nullptr},
    {"add", "other"},
    {"sub", "other"},
    {"mul", "other"},
    {"div", "other"},
    {"pow", "exponent"},
    {"leaky_relu", "negative_slope"},
};

struct Chain {
  std::vector<std::string> ops;
  std::vector<Attrs> attrs;  // per step
};

Chain parse_chain(const Attrs& attrs) {
  Chain chain;
  const std::string& text = attrs.get_string("ops");
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    chain.ops.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  const std::vector<double> scalars = attrs.get_floats("scalars");
  if (scalars.size() != chain.ops.size())
    fail("elementwise_chain: " + str(static_cast<int64_t>(chain.ops.size())) + " ops (\"" + text +
         "\") need as many scalars, got " + str(static_cast<int64_t>(scalars.size())));
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const ChainStep* step = nullptr;
    for (const ChainStep& known : kChainSteps)
      if (chain.ops[i] == known.op) step = &known;
    if (!step) {
      std::string names;
      for (const ChainStep& known : kChainSteps) names += std::string(names.empty() ? "" : ", ") + known.op;
      fail("elementwise_chain: unknown step '" + chain.ops[i] + "' (steps: " + names + ")");
    }
    Attrs step_attrs;
    if (step->scalar) step_attrs.set(step->scalar, scalars[i]);
    chain.attrs.push_back(std::move(step_attrs));
  }
  return chain;
}

std::vector<TensorMeta> infer_elementwise_chain(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  expect_count(inputs, 1, "elementwise_chain");
  const Chain chain = parse_chain(attrs);
  std::vector<TensorMeta> value{inputs[0]};
  for (size_t i = 0; i < chain.ops.size(); ++i) value = {infer_step(chain.ops[i], chain.attrs[i], value)};
  return value;
}

std::vector<Tensor> reference_elementwise_chain(const Attrs& attrs, std::span<const Tensor> inputs,
                                                std::span<const TensorMeta> outputs) {
  const Chain chain = parse_chain(attrs);
  Tensor value = inputs[0];
  for (size_t i = 0; i < chain.ops.size(); ++i) value = run_step(chain.ops[i], chain.attrs[i], {value});
  return as_output(value, outputs[0]);
}

}  // namespace

void register_fused_ops(OpRegistry& r) {
  r.add(OpDef{"fused_conv2d", {}, kFusedConvAttrs, 2, 4, infer_fused_conv, reference_fused_conv});
  r.add(OpDef{"fused_batch_norm", {}, kFusedBatchNormAttrs, 3, 5, infer_fused_batch_norm, reference_fused_batch_norm});
  r.add(OpDef{"add_relu", {}, {}, 2, 2, infer_add_relu, reference_add_relu});
  r.add(OpDef{"silu_mul", {}, {}, 2, 2, infer_silu_mul, reference_silu_mul});
  r.add(OpDef{"rope", {}, {}, 3, 3, infer_rope, reference_rope});
  r.add(OpDef{"attention",
              {},
              {{"scale", AttrType::Float, std::nullopt},
               {"is_causal", AttrType::Bool, AttrValue{false}},
               {"has_mask", AttrType::Bool, AttrValue{false}},
               {"has_cache_position", AttrType::Bool, AttrValue{false}},
               {"zero_masked_rows", AttrType::Bool, AttrValue{false}}},
              3,
              5,
              infer_fused_attention,
              reference_fused_attention});
  r.add(OpDef{"masked_softmax",
              {},
              {{"dtype", AttrType::DTypeName, AttrValue{NoneValue{}}}},
              2,
              2,
              infer_masked_softmax,
              reference_masked_softmax});
  r.add(OpDef{"elementwise_chain",
              {},
              {{"ops", AttrType::String, std::nullopt, true}, {"scalars", AttrType::Floats, std::nullopt, true}},
              1,
              1,
              infer_elementwise_chain,
              reference_elementwise_chain});
}

}  // namespace npusim
