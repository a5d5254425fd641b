// Elementwise kernels: unary math and activations, binary arithmetic and comparisons with broadcasting and scalar
// operands, where, masked_fill, clamp, dtype conversion, and the fused add_relu, silu_mul, elementwise_chain and
// rope. Floats compute in fp32, integers and bools exactly in int64, as the reference does.
#include <cmath>
#include <limits>
#include <numbers>
#include <set>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/vector_math.h"
#include "ops/elementwise_util.h"

namespace npusim::cpu {

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Float math

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float relu6(float x) { return std::min(std::max(x, 0.0f), 6.0f); }

float clamp_float(float x, float low, float high) {
  if (std::isnan(x)) return x;
  x = std::isnan(low) ? low : (x < low ? low : x);
  return std::isnan(high) ? high : (x > high ? high : x);
}

float pow_scalar(float x, float exponent) {
  if (exponent == 2.0f) return x * x;
  if (exponent == 1.0f) return x;
  if (exponent == 0.5f) return std::sqrt(x);
  return std::pow(x, exponent);
}

template <typename F>
void map(const float* in, float* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]);
}

}  // namespace

void apply_unary(const UnaryStep& s, const float* in, float* out, int64_t n) {
  if (vector_unary(s, in, out, n)) return;
  const float p0 = s.p0, p1 = s.p1, p2 = s.p2;
  switch (s.kind) {
    case UnaryKind::Identity:
      if (in != out) std::copy(in, in + n, out);
      return;
    case UnaryKind::Neg:
      return map(in, out, n, [](float x) { return -x; });
    case UnaryKind::Abs:
      return map(in, out, n, [](float x) { return std::fabs(x); });
    case UnaryKind::Sign:
      return map(in, out, n, [](float x) { return static_cast<float>((0 < x) - (x < 0)); });
    case UnaryKind::Floor:
      return map(in, out, n, [](float x) { return std::floor(x); });
    case UnaryKind::Ceil:
      return map(in, out, n, [](float x) { return std::ceil(x); });
    case UnaryKind::Trunc:
      return map(in, out, n, [](float x) { return std::trunc(x); });
    case UnaryKind::Round:
      return map(in, out, n, [](float x) { return std::nearbyint(x); });
    case UnaryKind::Exp:
      return map(in, out, n, [](float x) { return std::exp(x); });
    case UnaryKind::Log:
      return map(in, out, n, [](float x) { return std::log(x); });
    case UnaryKind::Log2:
      return map(in, out, n, [](float x) { return std::log2(x); });
    case UnaryKind::Log10:
      return map(in, out, n, [](float x) { return std::log10(x); });
    case UnaryKind::Log1p:
      return map(in, out, n, [](float x) { return std::log1p(x); });
    case UnaryKind::Expm1:
      return map(in, out, n, [](float x) { return std::expm1(x); });
    case UnaryKind::Sqrt:
      return map(in, out, n, [](float x) { return std::sqrt(x); });
    case UnaryKind::Rsqrt:
      return map(in, out, n, [](float x) { return 1.0f / std::sqrt(x); });
    case UnaryKind::Reciprocal:
      return map(in, out, n, [](float x) { return 1.0f / x; });
    case UnaryKind::Sin:
      return map(in, out, n, [](float x) { return std::sin(x); });
    case UnaryKind::Cos:
      return map(in, out, n, [](float x) { return std::cos(x); });
    case UnaryKind::Tan:
      return map(in, out, n, [](float x) { return std::tan(x); });
    case UnaryKind::Atan:
      return map(in, out, n, [](float x) { return std::atan(x); });
    case UnaryKind::Tanh:
      return map(in, out, n, [](float x) { return std::tanh(x); });
    case UnaryKind::Sigmoid:
      return map(in, out, n, sigmoid);
    case UnaryKind::Erf:
      return map(in, out, n, [](float x) { return std::erf(x); });
    case UnaryKind::Relu:
      return map(in, out, n, [](float x) { return x < 0.0f ? 0.0f : x; });
    case UnaryKind::Clamp:
      return map(in, out, n, [=](float x) { return clamp_float(x, p0, p1); });
    case UnaryKind::GeluErf:
      return map(in, out, n,
                 [](float x) { return 0.5f * x * (1.0f + std::erf(x * (1.0f / std::numbers::sqrt2_v<float>))); });
    case UnaryKind::GeluTanh:
      return map(in, out, n, [](float x) {
        const float inner = std::sqrt(2.0f / std::numbers::pi_v<float>) * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + std::tanh(inner));
      });
    case UnaryKind::Silu:
      return map(in, out, n, [](float x) { return x * sigmoid(x); });
    case UnaryKind::Hardswish:
      return map(in, out, n, [](float x) { return x * relu6(x + 3.0f) / 6.0f; });
    case UnaryKind::Hardsigmoid:
      return map(in, out, n, [](float x) { return relu6(x + 3.0f) / 6.0f; });
    case UnaryKind::LeakyRelu:
      return map(in, out, n, [=](float x) { return x > 0.0f ? x : x * p0; });
    case UnaryKind::Elu:
      return map(in, out, n, [=](float x) { return x > 0.0f ? x * p1 : std::expm1(x * p2) * p0 * p1; });
    case UnaryKind::Softplus:
      return map(in, out, n, [=](float x) { return x * p0 > p1 ? x : std::log1p(std::exp(x * p0)) / p0; });
    case UnaryKind::Mish:
      return map(in, out, n, [](float x) { return x * std::tanh(std::log1p(std::exp(x))); });
    case UnaryKind::LogicalNot:
      return map(in, out, n, [](float x) { return x == 0.0f ? 1.0f : 0.0f; });
    case UnaryKind::AddScalar:
      return map(in, out, n, [=](float x) { return x + p0; });
    case UnaryKind::MulScalar:
      return map(in, out, n, [=](float x) { return x * p0; });
    case UnaryKind::DivScalar:
      return map(in, out, n, [=](float x) { return x / p0; });
    case UnaryKind::PowScalar:
      return map(in, out, n, [=](float x) { return pow_scalar(x, p0); });
  }
}

std::optional<UnaryStep> unary_step(const std::string& op, const Attrs& attrs) {
  static const std::map<std::string, UnaryKind> kPlain = {
      {"neg", UnaryKind::Neg},
      {"abs", UnaryKind::Abs},
      {"sign", UnaryKind::Sign},
      {"floor", UnaryKind::Floor},
      {"ceil", UnaryKind::Ceil},
      {"trunc", UnaryKind::Trunc},
      {"exp", UnaryKind::Exp},
      {"log", UnaryKind::Log},
      {"log2", UnaryKind::Log2},
      {"log10", UnaryKind::Log10},
      {"log1p", UnaryKind::Log1p},
      {"expm1", UnaryKind::Expm1},
      {"sqrt", UnaryKind::Sqrt},
      {"rsqrt", UnaryKind::Rsqrt},
      {"reciprocal", UnaryKind::Reciprocal},
      {"sin", UnaryKind::Sin},
      {"cos", UnaryKind::Cos},
      {"tan", UnaryKind::Tan},
      {"atan", UnaryKind::Atan},
      {"tanh", UnaryKind::Tanh},
      {"sigmoid", UnaryKind::Sigmoid},
      {"erf", UnaryKind::Erf},
      {"relu", UnaryKind::Relu},
      {"silu", UnaryKind::Silu},
      {"hardswish", UnaryKind::Hardswish},
      {"hardsigmoid", UnaryKind::Hardsigmoid},
      {"mish", UnaryKind::Mish},
      {"logical_not", UnaryKind::LogicalNot},
  };
  if (auto it = kPlain.find(op); it != kPlain.end()) return UnaryStep{it->second};
  if (op == "round") {
    if (attrs.get_int("decimals", 0) != 0) return std::nullopt;
    return UnaryStep{UnaryKind::Round};
  }
  if (op == "hardtanh")
    return UnaryStep{UnaryKind::Clamp, static_cast<float>(attrs.get_float("min_val", -1.0)),
                     static_cast<float>(attrs.get_float("max_val", 1.0))};
  if (op == "gelu") {
    const std::string approximate = attrs.is_none("approximate") ? "none" : attrs.get_string("approximate");
    if (approximate == "none") return UnaryStep{UnaryKind::GeluErf};
    if (approximate == "tanh") return UnaryStep{UnaryKind::GeluTanh};
    return std::nullopt;
  }
  if (op == "leaky_relu")
    return UnaryStep{UnaryKind::LeakyRelu, static_cast<float>(attrs.get_float("negative_slope", 0.01))};
  if (op == "elu")
    return UnaryStep{UnaryKind::Elu, static_cast<float>(attrs.get_float("alpha", 1.0)),
                     static_cast<float>(attrs.get_float("scale", 1.0)),
                     static_cast<float>(attrs.get_float("input_scale", 1.0))};
  if (op == "softplus")
    return UnaryStep{UnaryKind::Softplus, static_cast<float>(attrs.get_float("beta", 1.0)),
                     static_cast<float>(attrs.get_float("threshold", 20.0))};
  return std::nullopt;
}

std::optional<UnaryStep> clamp_step(const Attrs& attrs) {
  const bool has_low = !attrs.is_none("min"), has_high = !attrs.is_none("max");
  if (!has_low && !has_high) return std::nullopt;
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  return UnaryStep{UnaryKind::Clamp, has_low ? static_cast<float>(attrs.get_float("min")) : -kInfinity,
                   has_high ? static_cast<float>(attrs.get_float("max")) : kInfinity};
}

std::optional<std::vector<UnaryStep>> chain_steps(const Attrs& attrs) {
  const std::string& text = attrs.get_string("ops");
  const std::vector<double> scalars = attrs.get_floats("scalars");
  std::vector<UnaryStep> steps;
  size_t index = 0;
  for (size_t begin = 0; begin <= text.size(); ++index) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string op = text.substr(begin, end - begin);
    begin = end + 1;
    if (index >= scalars.size()) return std::nullopt;
    const auto scalar = static_cast<float>(scalars[index]);
    if (op == "add") {
      steps.push_back({UnaryKind::AddScalar, scalar});
    } else if (op == "sub") {
      steps.push_back({UnaryKind::AddScalar, -scalar});
    } else if (op == "mul") {
      steps.push_back({UnaryKind::MulScalar, scalar});
    } else if (op == "div") {
      steps.push_back({UnaryKind::DivScalar, scalar});
    } else if (op == "pow") {
      steps.push_back({UnaryKind::PowScalar, scalar});
    } else if (op == "leaky_relu") {
      steps.push_back({UnaryKind::LeakyRelu, scalar});
    } else {
      std::optional<UnaryStep> step = unary_step(op, Attrs());
      if (!step) return std::nullopt;
      steps.push_back(*step);
    }
  }
  return steps;
}

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Binary math

enum class BinaryKind {
  Add,  // a + alpha * b
  Mul,
  Div,
  DivTrunc,
  DivFloor,
  Remainder,
  Fmod,
  Pow,
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
  LogicalXor,
  BitAnd,
  BitOr,
  BitXor,
};

// PyTorch's floor division of floats: exact quotient of (a - fmod(a, b)), corrected to the floor.
float div_floor(float a, float b) {
  if (b == 0) return a / b;
  const float mod = std::fmod(a, b);
  float div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0f;
  if (div == 0) return std::copysign(0.0f, a / b);
  float floored = std::floor(div);
  if (div - floored > 0.5f) floored += 1.0f;
  return floored;
}

float remainder(float a, float b) {
  const float mod = std::fmod(a, b);
  return (mod != 0 && ((b < 0) != (mod < 0))) ? mod + b : mod;
}

float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
float nan_min(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

template <typename T, typename F>
void zip(const T* a, const T* b, T* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

struct FloatBinary {
  BinaryKind kind;
  float alpha = 1.0f;
  bool reversed = false;  // rsub: the operands swap roles

  void operator()(const float* const* in, float* out, int64_t n) const {
    const float* a = reversed ? in[1] : in[0];
    const float* b = reversed ? in[0] : in[1];
    const float s = alpha;
    switch (kind) {
      case BinaryKind::Add:
        if (s == 1.0f) return zip(a, b, out, n, [](float x, float y) { return x + y; });
        return zip(a, b, out, n, [s](float x, float y) { return x + s * y; });
      case BinaryKind::Mul:
        return zip(a, b, out, n, [](float x, float y) { return x * y; });
      case BinaryKind::Div:
        return zip(a, b, out, n, [](float x, float y) { return x / y; });
      case BinaryKind::DivTrunc:
        return zip(a, b, out, n, [](float x, float y) { return std::trunc(x / y); });
      case BinaryKind::DivFloor:
        return zip(a, b, out, n, div_floor);
      case BinaryKind::Remainder:
        return zip(a, b, out, n, remainder);
      case BinaryKind::Fmod:
        return zip(a, b, out, n, [](float x, float y) { return std::fmod(x, y); });
      case BinaryKind::Pow:
        return zip(a, b, out, n, pow_scalar);
      case BinaryKind::Maximum:
        return zip(a, b, out, n, nan_max);
      case BinaryKind::Minimum:
        return zip(a, b, out, n, nan_min);
      case BinaryKind::Eq:
        return zip(a, b, out, n, [](float x, float y) { return x == y ? 1.0f : 0.0f; });
      case BinaryKind::Ne:
        return zip(a, b, out, n, [](float x, float y) { return x != y ? 1.0f : 0.0f; });
      case BinaryKind::Lt:
        return zip(a, b, out, n, [](float x, float y) { return x < y ? 1.0f : 0.0f; });
      case BinaryKind::Le:
        return zip(a, b, out, n, [](float x, float y) { return x <= y ? 1.0f : 0.0f; });
      case BinaryKind::Gt:
        return zip(a, b, out, n, [](float x, float y) { return x > y ? 1.0f : 0.0f; });
      case BinaryKind::Ge:
        return zip(a, b, out, n, [](float x, float y) { return x >= y ? 1.0f : 0.0f; });
      case BinaryKind::LogicalAnd:
        return zip(a, b, out, n, [](float x, float y) { return x != 0.0f && y != 0.0f ? 1.0f : 0.0f; });
      case BinaryKind::LogicalOr:
        return zip(a, b, out, n, [](float x, float y) { return x != 0.0f || y != 0.0f ? 1.0f : 0.0f; });
      case BinaryKind::LogicalXor:
        return zip(a, b, out, n, [](float x, float y) { return (x != 0.0f) != (y != 0.0f) ? 1.0f : 0.0f; });
      case BinaryKind::BitAnd:
      case BinaryKind::BitOr:
      case BinaryKind::BitXor:
        return;  // never planned for floats
    }
  }
};

int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

bool has_int_kernel(BinaryKind kind) {
  switch (kind) {
    case BinaryKind::Div:
    case BinaryKind::DivTrunc:
    case BinaryKind::DivFloor:
    case BinaryKind::Remainder:
    case BinaryKind::Fmod:
    case BinaryKind::Pow:
      return false;
    default:
      return true;
  }
}

struct IntBinary {
  BinaryKind kind;
  int64_t alpha = 1;
  bool reversed = false;

  void operator()(const int64_t* const* in, int64_t* out, int64_t n) const {
    const int64_t* a = reversed ? in[1] : in[0];
    const int64_t* b = reversed ? in[0] : in[1];
    const int64_t s = alpha;
    switch (kind) {
      case BinaryKind::Add:
        return zip(a, b, out, n, [s](int64_t x, int64_t y) { return wrap_add(x, wrap_mul(s, y)); });
      case BinaryKind::Mul:
        return zip(a, b, out, n, wrap_mul);
      case BinaryKind::Maximum:
        return zip(a, b, out, n, [](int64_t x, int64_t y) { return std::max(x, y); });
      case BinaryKind::Minimum:
        return zip(a, b, out, n, [](int64_t x, int64_t y) { return std::min(x, y); });
      case BinaryKind::Eq:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x == y; });
      case BinaryKind::Ne:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x != y; });
      case BinaryKind::Lt:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x < y; });
      case BinaryKind::Le:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x <= y; });
      case BinaryKind::Gt:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x > y; });
      case BinaryKind::Ge:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x >= y; });
      case BinaryKind::LogicalAnd:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x != 0 && y != 0; });
      case BinaryKind::LogicalOr:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return x != 0 || y != 0; });
      case BinaryKind::LogicalXor:
        return zip(a, b, out, n, [](int64_t x, int64_t y) -> int64_t { return (x != 0) != (y != 0); });
      case BinaryKind::BitAnd:
        return zip(a, b, out, n, [](int64_t x, int64_t y) { return x & y; });
      case BinaryKind::BitOr:
        return zip(a, b, out, n, [](int64_t x, int64_t y) { return x | y; });
      case BinaryKind::BitXor:
        return zip(a, b, out, n, [](int64_t x, int64_t y) { return x ^ y; });
      default:
        return;  // never planned for integers
    }
  }
};

enum class IntUnaryKind { Identity, Neg, Abs, Sign, Relu, LogicalNot, BitNot, Clamp };

struct IntUnary {
  IntUnaryKind kind;
  int64_t low = std::numeric_limits<int64_t>::min();
  int64_t high = std::numeric_limits<int64_t>::max();

  void operator()(const int64_t* const* in, int64_t* out, int64_t n) const {
    const int64_t* x = in[0];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = x[i];
      switch (kind) {
        case IntUnaryKind::Identity:
          out[i] = v;
          break;
        case IntUnaryKind::Neg:
          out[i] = wrap_mul(v, -1);
          break;
        case IntUnaryKind::Abs:
          out[i] = v < 0 ? wrap_mul(v, -1) : v;
          break;
        case IntUnaryKind::Sign:
          out[i] = (0 < v) - (v < 0);
          break;
        case IntUnaryKind::Relu:
          out[i] = std::max<int64_t>(v, 0);
          break;
        case IntUnaryKind::LogicalNot:
          out[i] = v == 0;
          break;
        case IntUnaryKind::BitNot:
          out[i] = ~v;
          break;
        case IntUnaryKind::Clamp:
          out[i] = std::min(std::max(v, low), high);
          break;
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Operands from the node: inputs and scalar attributes in slot order, and the dtype the reference computes in.

struct Slots {
  std::vector<OperandSpec> operands;
  DType common = DType::Float32;
  std::vector<int> inputs;  // input index per slot, -1 for scalars
};

OperandSpec scalar_spec(const AttrValue& value) {
  OperandSpec spec;
  spec.scalar = ops::scalar_as_double(value);
  if (auto* i = std::get_if<int64_t>(&value))
    spec.int_scalar = *i;
  else if (auto* b = std::get_if<bool>(&value))
    spec.int_scalar = *b ? 1 : 0;
  else
    spec.int_scalar = float_to_int64(spec.scalar);
  return spec;
}

std::vector<TensorMeta> input_metas(const KernelContext& ctx) {
  std::vector<TensorMeta> metas;
  for (const Buffer& b : ctx.inputs) metas.push_back(b.meta);
  return metas;
}

// Slots `names`; promotion over the slots from `promote_from` on. Nothing when a slot is missing.
std::optional<Slots> resolve(const KernelContext& ctx, const std::vector<std::string>& names, size_t promote_from = 0) {
  const std::vector<ops::SlotSource> sources = ops::resolve_slots(ctx.node.attrs, ctx.inputs.size(), names);
  Slots slots;
  for (const ops::SlotSource& source : sources) {
    if (source.input >= 0) {
      slots.operands.push_back(OperandSpec{&ctx.inputs[static_cast<size_t>(source.input)]});
      slots.inputs.push_back(source.input);
    } else if (source.scalar) {
      slots.operands.push_back(scalar_spec(*source.scalar));
      slots.inputs.push_back(-1);
    } else {
      return std::nullopt;
    }
  }
  const std::vector<TensorMeta> metas = input_metas(ctx);
  slots.common = ops::result_type(ops::slot_operands(std::span(sources).subspan(promote_from), metas));
  return slots;
}

template <typename C, typename Op>
std::optional<Kernel> planned(const KernelContext& ctx, const std::vector<OperandSpec>& operands, Op op) {
  if (ctx.outputs.size() != 1) return std::nullopt;
  std::optional<ElementwisePlan<C>> plan = plan_elementwise<C>(ctx.outputs[0], operands);
  if (!plan) return std::nullopt;
  Kernel kernel = elementwise_kernel(std::move(*plan), std::move(op), ctx.pool);
  share_all_inputs(kernel, ctx);
  return kernel;
}

// ---------------------------------------------------------------------------------------------------------------
// Factories

const std::vector<std::string> kSelfOther = {"self", "other"};

// add/sub/rsub: alpha scales `other`; sub and rsub negate it.
KernelFactory binary(BinaryKind kind, std::vector<std::string> slot_names = kSelfOther, bool negate_alpha = false,
                     bool reversed = false) {
  return [=](const KernelContext& ctx) -> std::optional<Kernel> {
    const std::optional<Slots> slots = resolve(ctx, slot_names);
    if (!slots) return std::nullopt;
    const Attrs& attrs = ctx.node.attrs;
    const double sign = negate_alpha ? -1.0 : 1.0;
    if (is_floating(slots->common) || kind == BinaryKind::Div) {
      const auto alpha = static_cast<float>(sign * static_cast<float>(attrs.get_float("alpha", 1.0)));
      return planned<float>(ctx, slots->operands, FloatBinary{kind, alpha, reversed});
    }
    if (!has_int_kernel(kind)) return std::nullopt;
    const int64_t alpha = attrs.is_integer("alpha") ? attrs.get_int("alpha") : 1;
    return planned<int64_t>(ctx, slots->operands, IntBinary{kind, wrap_mul(negate_alpha ? -1 : 1, alpha), reversed});
  };
}

KernelFactory division() {
  return [](const KernelContext& ctx) -> std::optional<Kernel> {
    const std::string mode = ctx.node.attrs.is_none("rounding_mode") ? "" : ctx.node.attrs.get_string("rounding_mode");
    if (mode.empty()) return binary(BinaryKind::Div)(ctx);
    if (mode == "trunc") return binary(BinaryKind::DivTrunc)(ctx);
    if (mode == "floor") return binary(BinaryKind::DivFloor)(ctx);
    return std::nullopt;
  };
}

// Ops whose reference has an integer form (the others compute integer inputs in float).
bool has_int_reference(const std::string& op) {
  static const std::set<std::string> kOps = {"neg",   "abs",         "sign",        "floor", "ceil",    "trunc",
                                             "round", "logical_not", "bitwise_not", "relu",  "hardtanh"};
  return kOps.count(op) != 0;
}

std::optional<IntUnaryKind> int_unary(const std::string& op, DType input) {
  if (op == "neg") return IntUnaryKind::Neg;
  if (op == "abs") return IntUnaryKind::Abs;
  if (op == "sign") return IntUnaryKind::Sign;
  if (op == "relu") return IntUnaryKind::Relu;
  if (op == "logical_not") return IntUnaryKind::LogicalNot;
  if (op == "bitwise_not") return input == DType::Bool ? IntUnaryKind::LogicalNot : IntUnaryKind::BitNot;
  if (op == "floor" || op == "ceil" || op == "trunc" || op == "round") return IntUnaryKind::Identity;
  return std::nullopt;
}

KernelFactory unary(const std::string& op) {
  return [op](const KernelContext& ctx) -> std::optional<Kernel> {
    if (ctx.inputs.size() != 1) return std::nullopt;
    const Buffer& in = ctx.inputs[0];
    const bool in_float =
        is_floating(in.meta.dtype) || is_floating(ctx.outputs[0].meta.dtype) || !has_int_reference(op);
    if (in_float) {
      const std::optional<UnaryStep> step = unary_step(op, ctx.node.attrs);
      if (!step) return std::nullopt;
      return planned<float>(ctx, {OperandSpec{&in}}, [s = *step](const float* const* x, float* out, int64_t n) {
        apply_unary(s, x[0], out, n);
      });
    }
    const std::optional<IntUnaryKind> kind = int_unary(op, in.meta.dtype);
    if (!kind) return std::nullopt;
    return planned<int64_t>(ctx, {OperandSpec{&in}}, IntUnary{*kind});
  };
}

template <typename C>
void copy_values(const C* const* in, C* out, int64_t n) {
  if (in[0] != out) std::copy(in[0], in[0] + n, out);
}

// to: input 0 converted to the output's storage; nothing to do when the output already is the input.
std::optional<Kernel> conversion(const KernelContext& ctx) {
  const Buffer& in = ctx.inputs[0];
  const Buffer& out = ctx.outputs[0];
  if (in.elem == out.elem && in.data == out.data) {
    Kernel kernel;
    kernel.run = [] {};
    kernel.writes_nothing = true;
    return kernel;
  }
  if (is_float_elem(in.elem)) return planned<float>(ctx, {OperandSpec{&in}}, copy_values<float>);
  return planned<int64_t>(ctx, {OperandSpec{&in}}, copy_values<int64_t>);
}

std::optional<Kernel> where(const KernelContext& ctx) {
  const std::optional<Slots> slots = resolve(ctx, {"condition", "self", "other"}, 1);
  if (!slots || slots->inputs[0] != 0) return std::nullopt;
  auto select = [](const auto* const* in, auto* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[0][i] != 0 ? in[1][i] : in[2][i];
  };
  if (is_floating(slots->common)) return planned<float>(ctx, slots->operands, select);
  return planned<int64_t>(ctx, slots->operands, select);
}

std::optional<Kernel> masked_fill(const KernelContext& ctx) {
  if (ctx.inputs.size() < 2) return std::nullopt;
  const std::optional<Slots> slots = resolve(ctx, {"self", "mask", "value"});
  if (!slots) return std::nullopt;
  const DType dtype = ctx.inputs[0].meta.dtype;
  if (dtype == DType::Bool && slots->inputs[2] < 0) return std::nullopt;  // a number's truth, not its integer part
  auto fill = [](const auto* const* in, auto* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[1][i] != 0 ? in[2][i] : in[0][i];
  };
  if (is_floating(dtype)) return planned<float>(ctx, slots->operands, fill);
  return planned<int64_t>(ctx, slots->operands, fill);
}

// clamp with number bounds; tensor bounds run on the fallback.
std::optional<Kernel> clamp(const KernelContext& ctx) {
  if (ctx.inputs.size() != 1) return std::nullopt;
  const Attrs& attrs = ctx.node.attrs;
  const bool has_low = !attrs.is_none("min"), has_high = !attrs.is_none("max");
  if (!has_low && !has_high) return std::nullopt;
  std::vector<ops::TypedOperand> operands{ops::tensor_operand(ctx.inputs[0].meta)};
  for (const char* bound : {"min", "max"})
    if (!attrs.is_none(bound)) operands.push_back(ops::scalar_operand(attrs.get(bound)));
  const DType common = ops::result_type(operands);
  if (is_floating(common)) {
    return planned<float>(
        ctx, {OperandSpec{&ctx.inputs[0]}},
        [step = *clamp_step(attrs)](const float* const* x, float* out, int64_t n) { apply_unary(step, x[0], out, n); });
  }
  IntUnary op{IntUnaryKind::Clamp};
  if (has_low) op.low = scalar_spec(attrs.get("min")).int_scalar;
  if (has_high) op.high = scalar_spec(attrs.get("max")).int_scalar;
  return planned<int64_t>(ctx, {OperandSpec{&ctx.inputs[0]}}, op);
}

bool float_inputs(const KernelContext& ctx) {
  for (const Buffer& in : ctx.inputs)
    if (!is_floating(in.meta.dtype)) return false;
  return !ctx.outputs.empty() && is_floating(ctx.outputs[0].meta.dtype);
}

std::optional<Kernel> add_relu(const KernelContext& ctx) {
  if (ctx.inputs.size() != 2 || !float_inputs(ctx)) return std::nullopt;
  return planned<float>(ctx, {OperandSpec{&ctx.inputs[0]}, OperandSpec{&ctx.inputs[1]}},
                        [](const float* const* in, float* out, int64_t n) {
                          for (int64_t i = 0; i < n; ++i) {
                            const float sum = in[0][i] + in[1][i];
                            out[i] = sum < 0.0f ? 0.0f : sum;
                          }
                        });
}

std::optional<Kernel> silu_mul(const KernelContext& ctx) {
  if (ctx.inputs.size() != 2 || !float_inputs(ctx)) return std::nullopt;
  return planned<float>(ctx, {OperandSpec{&ctx.inputs[0]}, OperandSpec{&ctx.inputs[1]}},
                        [](const float* const* in, float* out, int64_t n) {
                          if (vector_silu_mul(in[0], in[1], out, n)) return;
                          for (int64_t i = 0; i < n; ++i) out[i] = in[0][i] * sigmoid(in[0][i]) * in[1][i];
                        });
}

// elementwise_chain: each step maps the chunk in place.
std::optional<Kernel> elementwise_chain(const KernelContext& ctx) {
  if (ctx.inputs.size() != 1 || !float_inputs(ctx)) return std::nullopt;
  std::optional<std::vector<UnaryStep>> chain = chain_steps(ctx.node.attrs);
  if (!chain) return std::nullopt;
  return planned<float>(ctx, {OperandSpec{&ctx.inputs[0]}},
                        [steps = std::move(*chain)](const float* const* x, float* out, int64_t n) {
                          const float* from = x[0];
                          for (const UnaryStep& step : steps) {
                            apply_unary(step, from, out, n);
                            from = out;
                          }
                          if (steps.empty() && from != out) std::copy(from, from + n, out);
                        });
}

// rope(x, cos, sin) = x * cos + rotate_half(x) * sin, one row of x's last dim at a time. cos and sin broadcast to
// x; their rows are found by walking x's leading dims with their strides.
std::optional<Kernel> rope(const KernelContext& ctx) {
  constexpr int64_t kMaxWidth = 4096;
  if (ctx.inputs.size() != 3 || !float_inputs(ctx)) return std::nullopt;
  const Buffer& x = ctx.inputs[0];
  const Buffer& out = ctx.outputs[0];
  const Shape& shape = out.meta.shape;
  if (shape.empty() || x.meta.shape != shape || shape.back() % 2 != 0 || shape.back() > kMaxWidth) return std::nullopt;
  const int64_t width = shape.back();
  const Shape rows_shape(shape.begin(), shape.end() - 1);
  std::vector<std::vector<int64_t>> row_strides;
  std::array<int64_t, 2> column_strides{};
  for (size_t k = 0; k < 2; ++k) {
    std::vector<int64_t> strides = ops::broadcast_strides(ctx.inputs[k + 1].meta.shape, shape);
    column_strides[k] = strides.back();
    strides.pop_back();
    row_strides.push_back(strides);
  }
  std::optional<StridedLoop> loop = make_loop(rows_shape, row_strides);
  if (!loop) return std::nullopt;
  struct Plan {
    StridedLoop rows;
    Buffer x, cos, sin, out;
    std::array<int64_t, 2> column_strides;
    int64_t width;
  };
  auto plan = std::make_shared<const Plan>(Plan{*loop, x, ctx.inputs[1], ctx.inputs[2], out, column_strides, width});
  ThreadPool* pool = &ctx.pool;
  auto rows = [plan](int64_t begin, int64_t end, int) {
    const Plan& p = *plan;
    const int64_t half = p.width / 2;
    alignas(64) float xs[kMaxWidth], cs[kMaxWidth], ss[kMaxWidth], ys[kMaxWidth];
    walk(p.rows, begin, end, [&](int64_t row, int64_t count, const int64_t* offsets) {
      int64_t cos_at = offsets[0], sin_at = offsets[1];
      for (int64_t r = row; r < row + count; ++r) {
        to_float(p.x.data + static_cast<size_t>(r * p.width) * elem_size(p.x.elem), p.x.elem, xs, p.width);
        const float* c = load_chunk<float>(p.cos.data, p.cos.elem, cos_at, p.column_strides[0], p.width, cs);
        const float* s = load_chunk<float>(p.sin.data, p.sin.elem, sin_at, p.column_strides[1], p.width, ss);
        for (int64_t i = 0; i < half; ++i) ys[i] = xs[i] * c[i] + -xs[i + half] * s[i];
        for (int64_t i = half; i < p.width; ++i) ys[i] = xs[i] * c[i] + xs[i - half] * s[i];
        from_float(ys, p.out.data + static_cast<size_t>(r * p.width) * elem_size(p.out.elem), p.out.elem, p.width);
        cos_at += p.rows.inner_stride(0);
        sin_at += p.rows.inner_stride(1);
      }
    });
  };
  const int64_t row_count = shape_numel(rows_shape);
  Kernel kernel;
  share_all_inputs(kernel, ctx);  // each row is read whole before its output row is written
  kernel.run = [pool, rows, row_count, plan] {
    if (row_count * plan->width < kParallelElements)
      rows(0, row_count, 0);
    else
      pool->parallel_for(row_count, 16, rows);
  };
  return kernel;
}

}  // namespace

void add_elementwise_kernels(KernelTable& table) {
  const std::vector<std::string> unary_ops = {
      "exp",  "log",   "log2",      "log10",       "log1p",      "expm1",       "sqrt",        "rsqrt", "reciprocal",
      "sin",  "cos",   "tan",       "atan",        "tanh",       "sigmoid",     "erf",         "neg",   "abs",
      "sign", "floor", "ceil",      "trunc",       "round",      "logical_not", "bitwise_not", "relu",  "hardtanh",
      "gelu", "silu",  "hardswish", "hardsigmoid", "leaky_relu", "elu",         "softplus",    "mish"};
  for (const std::string& op : unary_ops) table.add(op, unary(op));

  table.add("add", binary(BinaryKind::Add));
  table.add("sub", binary(BinaryKind::Add, kSelfOther, true));
  table.add("rsub", binary(BinaryKind::Add, kSelfOther, true, true));
  table.add("mul", binary(BinaryKind::Mul));
  table.add("div", division());
  table.add("remainder", binary(BinaryKind::Remainder));
  table.add("fmod", binary(BinaryKind::Fmod));
  table.add("pow", binary(BinaryKind::Pow, {"base", "exponent"}));
  table.add("maximum", binary(BinaryKind::Maximum));
  table.add("minimum", binary(BinaryKind::Minimum));
  table.add("eq", binary(BinaryKind::Eq));
  table.add("ne", binary(BinaryKind::Ne));
  table.add("lt", binary(BinaryKind::Lt));
  table.add("le", binary(BinaryKind::Le));
  table.add("gt", binary(BinaryKind::Gt));
  table.add("ge", binary(BinaryKind::Ge));
  table.add("logical_and", binary(BinaryKind::LogicalAnd));
  table.add("logical_or", binary(BinaryKind::LogicalOr));
  table.add("logical_xor", binary(BinaryKind::LogicalXor));
  table.add("bitwise_and", binary(BinaryKind::BitAnd));
  table.add("bitwise_or", binary(BinaryKind::BitOr));
  table.add("bitwise_xor", binary(BinaryKind::BitXor));

  table.add("to", conversion);
  table.add("where", where);
  table.add("masked_fill", masked_fill);
  table.add("clamp", clamp);
  table.add("add_relu", add_relu);
  table.add("silu_mul", silu_mul);
  table.add("elementwise_chain", elementwise_chain);
  table.add("rope", rope);
}

}  // namespace npusim::cpu
