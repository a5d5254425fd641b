// Elementwise ops: binary arithmetic, comparisons, logical and bitwise ops, unary math and activations, clamp,
// where and masked_fill. Shapes broadcast and dtypes promote like PyTorch, scalar operands included.
#include <cmath>
#include <map>
#include <memory>
#include <numbers>
#include <optional>

#include "ops/elementwise_util.h"

namespace npusim {

namespace {

using namespace ops;

std::vector<AtenSpelling> spellings(std::initializer_list<std::string> op_types) {
  std::vector<AtenSpelling> result;
  for (const std::string& op_type : op_types) result.push_back({op_type, {}, {}});
  return result;
}

// "aten.<name>.default" and its in-place twin "aten.<name>_.default".
std::vector<AtenSpelling> default_and_inplace(const std::string& name) {
  return spellings({"aten." + name + ".default", "aten." + name + "_.default"});
}

std::vector<TensorMeta> metas_of(std::span<const Tensor> tensors) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : tensors) metas.push_back({t.shape(), t.dtype()});
  return metas;
}

void require_slots(std::span<const SlotSource> sources, std::span<const std::string> slots) {
  for (size_t s = 0; s < sources.size(); ++s)
    if (!sources[s].present()) fail("missing operand '" + slots[s] + "' (neither an input nor a scalar attribute)");
}

bool is_float_scalar(const Attrs& attrs, const std::string& name) {
  return !attrs.is_none(name) && std::holds_alternative<double>(attrs.get(name));
}

// ---------------------------------------------------------------------------------------------------------------
// Binary ops

struct BinaryMath {
  std::function<double(double, double)> on_float;
  std::function<int64_t(int64_t, int64_t)> on_int;  // empty: integer operands compute in float
};

struct BinaryOp {
  std::string name;
  std::vector<AtenSpelling> spellings;
  std::vector<AttrSpec> attrs;
  // Output dtype from the promoted operand dtype; throws for combinations PyTorch rejects.
  std::function<DType(const Attrs&, DType common)> result_dtype;
  std::function<BinaryMath(const Attrs&)> math;
  std::vector<std::string> slots = {"self", "other"};
};

DType promoted(const Attrs&, DType common) { return common; }
DType boolean(const Attrs&, DType) { return DType::Bool; }

DType integer_only(const Attrs&, DType common) {
  if (is_floating(common)) fail("bitwise ops need bool or integer operands, got " + std::string(dtype_name(common)));
  return common;
}

// add/sub/rsub: an integer result needs an integral alpha; bool subtraction is rejected as in PyTorch.
std::function<DType(const Attrs&, DType)> alpha_checked(bool subtracts) {
  return [subtracts](const Attrs& attrs, DType common) {
    if (!is_floating(common) && is_float_scalar(attrs, "alpha"))
      fail("alpha must be an integer for " + std::string(dtype_name(common)) + " operands, got " +
           attr_value_string(attrs.get("alpha")));
    if (subtracts && common == DType::Bool) fail("subtraction of bool tensors is not supported");
    return common;
  };
}

OpDef make_binary(BinaryOp op) {
  auto shared = std::make_shared<BinaryOp>(std::move(op));
  ShapeFn infer = [shared](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    const auto sources = resolve_slots(attrs, inputs.size(), shared->slots);
    require_slots(sources, shared->slots);
    const DType common = result_type(slot_operands(sources, inputs));
    return std::vector<TensorMeta>{{slot_shape(sources, inputs), shared->result_dtype(attrs, common)}};
  };
  ReferenceFn reference = [shared](const Attrs& attrs, std::span<const Tensor> inputs,
                                   std::span<const TensorMeta> outputs) {
    const auto sources = resolve_slots(attrs, inputs.size(), shared->slots);
    require_slots(sources, shared->slots);
    const auto metas = metas_of(inputs);
    const DType common = result_type(slot_operands(sources, metas));
    const auto operands = slot_tensors(sources, inputs, common);
    const BinaryMath math = shared->math(attrs);
    if (computes_in_float(common) || !math.on_int)
      return std::vector<Tensor>{map_float(outputs[0], operands, [&](auto v) { return math.on_float(v[0], v[1]); })};
    return std::vector<Tensor>{map_int(outputs[0], operands, [&](auto v) { return math.on_int(v[0], v[1]); })};
  };
  const int slot_count = static_cast<int>(shared->slots.size());
  return OpDef{shared->name, shared->spellings, shared->attrs, 1, slot_count, infer, reference};
}

AttrSpec scalar_attr(std::string name) { return {std::move(name), AttrType::Scalar, std::nullopt}; }
AttrSpec alpha_attr() { return {"alpha", AttrType::Scalar, AttrValue{int64_t{1}}}; }

// Float alpha is applied in fp32, as PyTorch's opmath does for float tensors.
double float_alpha(const Attrs& attrs) { return static_cast<float>(attrs.get_float("alpha")); }
// Only used for integer operands, where the ShapeFn has checked that alpha is integral.
int64_t int_alpha(const Attrs& attrs) { return attrs.is_integer("alpha") ? attrs.get_int("alpha") : 0; }

[[noreturn]] double reject_float_operands(double, double) { fail("bitwise ops need bool or integer operands"); }

int64_t checked_divisor(int64_t b) {
  if (b == 0) fail("integer division by zero");
  return b;
}

int64_t int_div_trunc(int64_t a, int64_t b) {
  if (checked_divisor(b) == -1) return wrapping_sub(0, a);  // INT64_MIN / -1 wraps
  return a / b;
}

int64_t int_div_floor(int64_t a, int64_t b) {
  const int64_t q = int_div_trunc(a, b);
  return (b != -1 && a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t int_remainder(int64_t a, int64_t b) {
  if (checked_divisor(b) == -1) return 0;
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

int64_t int_fmod(int64_t a, int64_t b) { return checked_divisor(b) == -1 ? 0 : a % b; }

// PyTorch's floor division of floats, in fp32: exact quotient of (a - fmod(a, b)), corrected to the floor.
double float_div_floor(double a_in, double b_in) {
  const float a = static_cast<float>(a_in), b = static_cast<float>(b_in);
  if (b == 0) return a / b;
  const float mod = std::fmod(a, b);
  float div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0f;
  if (div == 0) return std::copysign(0.0f, a / b);
  float floordiv = std::floor(div);
  if (div - floordiv > 0.5f) floordiv += 1.0f;
  return floordiv;
}

double float_remainder(double a, double b) {
  const double mod = std::fmod(a, b);
  return (mod != 0 && ((b < 0) != (mod < 0))) ? mod + b : mod;
}

// Integer powers by squaring; negative exponents follow PyTorch (only 1 and -1 survive).
int64_t int_pow(int64_t base, int64_t exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return exponent % 2 == 0 ? 1 : -1;
    return 0;
  }
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1) result = wrapping_mul(result, base);
    base = wrapping_mul(base, base);
    exponent >>= 1;
  }
  return result;
}

double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

std::function<BinaryMath(const Attrs&)> fixed_math(BinaryMath math) {
  return [math](const Attrs&) { return math; };
}

std::string rounding_mode(const Attrs& attrs) {
  if (attrs.is_none("rounding_mode")) return "";
  const std::string& mode = attrs.get_string("rounding_mode");
  if (mode != "trunc" && mode != "floor")
    fail("rounding_mode must be null, \"trunc\" or \"floor\", got \"" + mode + "\"");
  return mode;
}

// add: self + alpha * other; sub: self - alpha * other; rsub (reversed): other - alpha * self.
BinaryOp scaled_sum_op(std::string name, std::initializer_list<std::string> op_types, bool subtracts, bool reversed) {
  auto math = [subtracts, reversed](const Attrs& attrs) {
    const double alpha = (subtracts ? -1.0 : 1.0) * float_alpha(attrs);
    const int64_t int_alpha_value = wrapping_mul(subtracts ? -1 : 1, int_alpha(attrs));
    return BinaryMath{[=](double a, double b) { return reversed ? b + alpha * a : a + alpha * b; },
                      [=](int64_t a, int64_t b) {
                        return reversed ? wrapping_add(b, wrapping_mul(int_alpha_value, a))
                                        : wrapping_add(a, wrapping_mul(int_alpha_value, b));
                      }};
  };
  return {std::move(name), spellings(op_types), {scalar_attr("other"), alpha_attr()}, alpha_checked(subtracts), math};
}

void register_arithmetic(OpRegistry& r) {
  r.add(make_binary(scaled_sum_op("add", {"aten.add.Tensor", "aten.add_.Tensor", "aten.add.Scalar", "aten.add_.Scalar"},
                                  false, false)));
  r.add(make_binary(scaled_sum_op("sub", {"aten.sub.Tensor", "aten.sub_.Tensor", "aten.sub.Scalar", "aten.sub_.Scalar"},
                                  true, false)));
  r.add(make_binary(scaled_sum_op("rsub", {"aten.rsub.Tensor", "aten.rsub.Scalar"}, true, true)));
  r.add(make_binary({"mul",
                     spellings({"aten.mul.Tensor", "aten.mul_.Tensor", "aten.mul.Scalar", "aten.mul_.Scalar"}),
                     {scalar_attr("other")},
                     promoted,
                     fixed_math({[](double a, double b) { return a * b; }, wrapping_mul})}));

  std::vector<AtenSpelling> div_spellings =
      spellings({"aten.div.Tensor", "aten.div_.Tensor", "aten.div.Scalar", "aten.div_.Scalar", "aten.div.Tensor_mode",
                 "aten.div_.Tensor_mode", "aten.div.Scalar_mode", "aten.div_.Scalar_mode", "aten.true_divide.Tensor"});
  for (const char* op_type : {"aten.floor_divide.default", "aten.floor_divide.Scalar", "aten.floor_divide_.Tensor"})
    div_spellings.push_back({op_type, {}, {{"rounding_mode", AttrValue{std::string("floor")}}}});
  r.add(make_binary(
      {"div",
       std::move(div_spellings),
       {scalar_attr("other"), {"rounding_mode", AttrType::String, AttrValue{NoneValue{}}}},
       [](const Attrs& attrs, DType common) {
         if (rounding_mode(attrs).empty()) return is_floating(common) ? common : DType::Float32;
         if (common == DType::Bool) fail("div with a rounding_mode does not support bool operands");
         return common;
       },
       [](const Attrs& attrs) {
         const std::string mode = rounding_mode(attrs);
         if (mode == "trunc")
           return BinaryMath{[](double a, double b) { return std::trunc(static_cast<float>(a / b)); }, int_div_trunc};
         if (mode == "floor") return BinaryMath{float_div_floor, int_div_floor};
         return BinaryMath{[](double a, double b) { return a / b; }, nullptr};
       }}));
  r.add(make_binary({"remainder",
                     spellings({"aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder_.Tensor",
                                "aten.remainder_.Scalar"}),
                     {scalar_attr("other")},
                     promoted,
                     fixed_math({float_remainder, int_remainder})}));
  r.add(make_binary({"fmod",
                     spellings({"aten.fmod.Tensor", "aten.fmod.Scalar", "aten.fmod_.Tensor", "aten.fmod_.Scalar"}),
                     {scalar_attr("other")},
                     promoted,
                     fixed_math({[](double a, double b) { return std::fmod(a, b); }, int_fmod})}));

  // pow.Scalar has a scalar base (its `self`), renamed to `base`; pow.Tensor_Scalar a scalar `exponent`.
  std::vector<AtenSpelling> pow_spellings =
      spellings({"aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow_.Scalar", "aten.pow_.Tensor"});
  pow_spellings.push_back({"aten.pow.Scalar", {{"self", "base"}}, {}});
  BinaryOp pow{"pow",
               std::move(pow_spellings),
               {scalar_attr("base"), scalar_attr("exponent")},
               [](const Attrs& attrs, DType common) {
                 if (!is_floating(common) && attrs.is_integer("exponent") && attrs.get_int("exponent") < 0)
                   fail("integers to negative integer powers are not allowed");
                 return common;
               },
               fixed_math({[](double a, double b) { return std::pow(a, b); }, int_pow})};
  pow.slots = {"base", "exponent"};
  r.add(make_binary(std::move(pow)));

  r.add(make_binary({"maximum",
                     spellings({"aten.maximum.default", "aten.max.other"}),
                     {},
                     promoted,
                     fixed_math({nan_max, [](int64_t a, int64_t b) { return std::max(a, b); }})}));
  r.add(make_binary({"minimum",
                     spellings({"aten.minimum.default", "aten.min.other"}),
                     {},
                     promoted,
                     fixed_math({nan_min, [](int64_t a, int64_t b) { return std::min(a, b); }})}));
}

void register_comparisons(OpRegistry& r) {
  struct Comparison {
    const char* name;
    std::function<double(double, double)> on_float;
    std::function<int64_t(int64_t, int64_t)> on_int;
  };
  const Comparison comparisons[] = {
      {"eq", [](double a, double b) { return a == b; }, [](int64_t a, int64_t b) { return a == b; }},
      {"ne", [](double a, double b) { return a != b; }, [](int64_t a, int64_t b) { return a != b; }},
      {"lt", [](double a, double b) { return a < b; }, [](int64_t a, int64_t b) { return a < b; }},
      {"le", [](double a, double b) { return a <= b; }, [](int64_t a, int64_t b) { return a <= b; }},
      {"gt", [](double a, double b) { return a > b; }, [](int64_t a, int64_t b) { return a > b; }},
      {"ge", [](double a, double b) { return a >= b; }, [](int64_t a, int64_t b) { return a >= b; }},
  };
  for (const Comparison& c : comparisons) {
    const std::string name = c.name;
    r.add(make_binary({name,
                       spellings({"aten." + name + ".Tensor", "aten." + name + ".Scalar"}),
                       {scalar_attr("other")},
                       boolean,
                       fixed_math({c.on_float, c.on_int})}));
  }

  const auto truth = [](double v) { return v != 0.0; };
  r.add(make_binary({"logical_and",
                     spellings({"aten.logical_and.default", "aten.logical_and_.default"}),
                     {},
                     boolean,
                     fixed_math({[truth](double a, double b) { return truth(a) && truth(b); },
                                 [](int64_t a, int64_t b) -> int64_t { return a != 0 && b != 0; }})}));
  r.add(make_binary({"logical_or",
                     spellings({"aten.logical_or.default", "aten.logical_or_.default"}),
                     {},
                     boolean,
                     fixed_math({[truth](double a, double b) { return truth(a) || truth(b); },
                                 [](int64_t a, int64_t b) -> int64_t { return a != 0 || b != 0; }})}));
  r.add(make_binary({"logical_xor",
                     spellings({"aten.logical_xor.default", "aten.logical_xor_.default"}),
                     {},
                     boolean,
                     fixed_math({[truth](double a, double b) { return truth(a) != truth(b); },
                                 [](int64_t a, int64_t b) -> int64_t { return (a != 0) != (b != 0); }})}));

  struct Bitwise {
    const char* name;
    const char* dunder;
    std::function<int64_t(int64_t, int64_t)> op;
  };
  const Bitwise bitwise[] = {{"bitwise_and", "__and__", [](int64_t a, int64_t b) { return a & b; }},
                             {"bitwise_or", "__or__", [](int64_t a, int64_t b) { return a | b; }},
                             {"bitwise_xor", "__xor__", [](int64_t a, int64_t b) { return a ^ b; }}};
  for (const Bitwise& b : bitwise) {
    std::vector<AtenSpelling> names;
    for (const std::string& base : {std::string(b.name), std::string(b.dunder)})
      for (const char* overload : {".Tensor", ".Scalar"}) names.push_back({"aten." + base + overload, {}, {}});
    r.add(make_binary(
        {b.name, std::move(names), {scalar_attr("other")}, integer_only, fixed_math({reject_float_operands, b.op})}));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Unary ops

struct UnaryMath {
  std::function<double(double)> on_float;
  std::function<int64_t(int64_t)> on_int;  // empty: integer inputs compute in float
};

UnaryMath float_only(std::function<double(double)> on_float) { return {std::move(on_float), nullptr}; }

enum class UnaryResult { SameAsInput, Floating, Bool };

struct UnaryOp {
  std::string name;
  std::vector<AtenSpelling> spellings;
  std::vector<AttrSpec> attrs;
  UnaryResult result;
  std::function<UnaryMath(const Attrs&, DType input)> math;
  std::function<void(const Attrs&, DType input)> check = nullptr;
};

std::function<UnaryMath(const Attrs&, DType)> plain(std::function<double(double)> on_float,
                                                    std::function<int64_t(int64_t)> on_int = nullptr) {
  UnaryMath math{std::move(on_float), std::move(on_int)};
  return [math](const Attrs&, DType) { return math; };
}

DType unary_result_dtype(UnaryResult result, DType input) {
  switch (result) {
    case UnaryResult::SameAsInput:
      return input;
    case UnaryResult::Floating:
      return is_floating(input) ? input : DType::Float32;
    case UnaryResult::Bool:
      return DType::Bool;
  }
  return input;
}

OpDef make_unary(UnaryOp op) {
  auto shared = std::make_shared<UnaryOp>(std::move(op));
  ShapeFn infer = [shared](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    expect_inputs(inputs, 1, shared->name.c_str());
    if (shared->check) shared->check(attrs, inputs[0].dtype);
    return std::vector<TensorMeta>{{inputs[0].shape, unary_result_dtype(shared->result, inputs[0].dtype)}};
  };
  ReferenceFn reference = [shared](const Attrs& attrs, std::span<const Tensor> inputs,
                                   std::span<const TensorMeta> outputs) {
    const UnaryMath math = shared->math(attrs, inputs[0].dtype());
    const bool in_float = is_floating(inputs[0].dtype()) || is_floating(outputs[0].dtype) || !math.on_int;
    if (in_float)
      return std::vector<Tensor>{map_float(outputs[0], inputs, [&](auto v) { return math.on_float(v[0]); })};
    return std::vector<Tensor>{map_int(outputs[0], inputs, [&](auto v) { return math.on_int(v[0]); })};
  };
  return OpDef{shared->name, shared->spellings, shared->attrs, 1, 1, infer, reference};
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double relu6(double x) { return std::min(std::max(x, 0.0), 6.0); }
double softplus(double x, double beta, double threshold) {
  return x * beta > threshold ? x : std::log1p(std::exp(x * beta)) / beta;
}

int64_t int_abs(int64_t a) { return a < 0 ? wrapping_sub(0, a) : a; }
int64_t identity_int(int64_t a) { return a; }

// round(x, decimals) in fp32, as PyTorch computes it (so 2.675 rounds to 2.68 at two decimals).
double round_decimals(double x, int64_t decimals) {
  if (decimals == 0) return std::nearbyint(x);
  const float scale = static_cast<float>(std::pow(10.0, static_cast<double>(std::abs(decimals))));
  const float value = static_cast<float>(x);
  if (decimals > 0) return std::nearbyint(value * scale) / scale;
  return std::nearbyint(value / scale) * scale;
}

void register_math(OpRegistry& r) {
  const auto floating = UnaryResult::Floating;
  const auto same = UnaryResult::SameAsInput;
  struct Simple {
    const char* name;
    std::function<double(double)> on_float;
  };
  const Simple float_math[] = {
      {"exp", [](double x) { return std::exp(x); }},
      {"log", [](double x) { return std::log(x); }},
      {"log2", [](double x) { return std::log2(x); }},
      {"log10", [](double x) { return std::log10(x); }},
      {"log1p", [](double x) { return std::log1p(x); }},
      {"expm1", [](double x) { return std::expm1(x); }},
      {"sqrt", [](double x) { return std::sqrt(x); }},
      {"rsqrt", [](double x) { return 1.0 / std::sqrt(x); }},
      {"reciprocal", [](double x) { return 1.0 / x; }},
      {"sin", [](double x) { return std::sin(x); }},
      {"cos", [](double x) { return std::cos(x); }},
      {"tan", [](double x) { return std::tan(x); }},
      {"atan", [](double x) { return std::atan(x); }},
      {"tanh", [](double x) { return std::tanh(x); }},
      {"sigmoid", sigmoid},
      {"erf", [](double x) { return std::erf(x); }},
  };
  for (const Simple& op : float_math)
    r.add(make_unary({op.name, default_and_inplace(op.name), {}, floating, plain(op.on_float)}));

  r.add(make_unary({"neg",
                    default_and_inplace("neg"),
                    {},
                    same,
                    plain([](double x) { return -x; }, [](int64_t x) { return wrapping_sub(0, x); }),
                    [](const Attrs&, DType input) {
                      if (input == DType::Bool) fail("negation of a bool tensor is not supported; use logical_not");
                    }}));
  r.add(
      make_unary({"abs", default_and_inplace("abs"), {}, same, plain([](double x) { return std::fabs(x); }, int_abs)}));
  // sign(NaN) is 0 in PyTorch: both comparisons are false.
  r.add(make_unary({"sign",
                    default_and_inplace("sign"),
                    {},
                    same,
                    plain([](double x) { return static_cast<double>((0 < x) - (x < 0)); },
                          [](int64_t x) -> int64_t { return (0 < x) - (x < 0); })}));
  r.add(make_unary(
      {"floor", default_and_inplace("floor"), {}, same, plain([](double x) { return std::floor(x); }, identity_int)}));
  r.add(make_unary(
      {"ceil", default_and_inplace("ceil"), {}, same, plain([](double x) { return std::ceil(x); }, identity_int)}));
  r.add(make_unary(
      {"trunc", default_and_inplace("trunc"), {}, same, plain([](double x) { return std::trunc(x); }, identity_int)}));
  std::vector<AtenSpelling> round_spellings =
      spellings({"aten.round.default", "aten.round_.default", "aten.round.decimals", "aten.round_.decimals"});
  r.add(make_unary({"round",
                    std::move(round_spellings),
                    {{"decimals", AttrType::Int, AttrValue{int64_t{0}}}},
                    same,
                    [](const Attrs& attrs, DType) {
                      const int64_t decimals = attrs.get_int("decimals", 0);
                      return UnaryMath{[decimals](double x) { return round_decimals(x, decimals); }, identity_int};
                    }}));
  r.add(
      make_unary({"logical_not",
                  default_and_inplace("logical_not"),
                  {},
                  UnaryResult::Bool,
                  plain([](double x) { return x == 0.0 ? 1.0 : 0.0; }, [](int64_t x) -> int64_t { return x == 0; })}));
  r.add(make_unary({"bitwise_not",
                    default_and_inplace("bitwise_not"),
                    {},
                    same,
                    [](const Attrs&, DType input) {
                      const auto reject = [](double) -> double { fail("bitwise_not needs a bool or integer input"); };
                      if (input == DType::Bool) return UnaryMath{reject, [](int64_t x) -> int64_t { return x == 0; }};
                      return UnaryMath{reject, [](int64_t x) { return ~x; }};
                    },
                    [](const Attrs&, DType input) {
                      if (is_floating(input)) fail("bitwise_not needs a bool or integer input");
                    }}));
}

void register_activations(OpRegistry& r) {
  const auto floating = UnaryResult::Floating;
  r.add(make_unary({"relu",
                    default_and_inplace("relu"),
                    {},
                    UnaryResult::SameAsInput,
                    plain([](double x) { return std::isnan(x) ? x : std::max(x, 0.0); },
                          [](int64_t x) { return std::max<int64_t>(x, 0); })}));

  std::vector<AtenSpelling> hardtanh_spellings = default_and_inplace("hardtanh");
  const std::map<std::string, AttrValue> relu6_bounds = {{"min_val", AttrValue{0.0}}, {"max_val", AttrValue{6.0}}};
  hardtanh_spellings.push_back({"aten.relu6.default", {}, relu6_bounds});
  hardtanh_spellings.push_back({"aten.relu6_.default", {}, relu6_bounds});
  r.add(make_unary({"hardtanh",
                    std::move(hardtanh_spellings),
                    {{"min_val", AttrType::Float, AttrValue{-1.0}}, {"max_val", AttrType::Float, AttrValue{1.0}}},
                    UnaryResult::SameAsInput,
                    [](const Attrs& attrs, DType) {
                      const double lo = attrs.get_float("min_val"), hi = attrs.get_float("max_val");
                      return UnaryMath{[lo, hi](double x) { return std::isnan(x) ? x : std::min(std::max(x, lo), hi); },
                                       [lo, hi](int64_t x) {
                                         return std::min(std::max(x, static_cast<int64_t>(lo)),
                                                         static_cast<int64_t>(hi));
                                       }};
                    }}));

  r.add(make_unary({"gelu",
                    default_and_inplace("gelu"),
                    {{"approximate", AttrType::String, AttrValue{std::string("none")}}},
                    floating,
                    [](const Attrs& attrs, DType) {
                      if (attrs.get_string("approximate") == "tanh") {
                        return float_only([](double x) {
                          const double inner = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
                          return 0.5 * x * (1.0 + std::tanh(inner));
                        });
                      }
                      return float_only([](double x) { return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2)); });
                    },
                    [](const Attrs& attrs, DType) {
                      const std::string& approximate = attrs.get_string("approximate");
                      if (approximate != "none" && approximate != "tanh")
                        fail("gelu approximate must be \"none\" or \"tanh\", got \"" + approximate + "\"");
                    }}));
  r.add(
      make_unary({"silu", default_and_inplace("silu"), {}, floating, plain([](double x) { return x * sigmoid(x); })}));
  r.add(make_unary({"hardswish", default_and_inplace("hardswish"), {}, floating, plain([](double x) {
                      return x * relu6(x + 3.0) / 6.0;
                    })}));
  r.add(make_unary({"hardsigmoid", default_and_inplace("hardsigmoid"), {}, floating, plain([](double x) {
                      return relu6(x + 3.0) / 6.0;
                    })}));
  r.add(make_unary({"leaky_relu",
                    default_and_inplace("leaky_relu"),
                    {{"negative_slope", AttrType::Float, AttrValue{0.01}}},
                    floating,
                    [](const Attrs& attrs, DType) {
                      const double slope = attrs.get_float("negative_slope");
                      return float_only([slope](double x) { return x > 0 ? x : x * slope; });
                    }}));
  r.add(make_unary({"elu",
                    default_and_inplace("elu"),
                    {{"alpha", AttrType::Float, AttrValue{1.0}},
                     {"scale", AttrType::Float, AttrValue{1.0}},
                     {"input_scale", AttrType::Float, AttrValue{1.0}}},
                    floating,
                    [](const Attrs& attrs, DType) {
                      const double alpha = attrs.get_float("alpha"), scale = attrs.get_float("scale"),
                                   input_scale = attrs.get_float("input_scale");
                      return float_only(
                          [=](double x) { return x > 0 ? x * scale : std::expm1(x * input_scale) * alpha * scale; });
                    }}));
  r.add(make_unary({"softplus",
                    spellings({"aten.softplus.default"}),
                    {{"beta", AttrType::Float, AttrValue{1.0}}, {"threshold", AttrType::Float, AttrValue{20.0}}},
                    floating,
                    [](const Attrs& attrs, DType) {
                      const double beta = attrs.get_float("beta"), threshold = attrs.get_float("threshold");
                      return float_only([=](double x) { return softplus(x, beta, threshold); });
                    }}));
  r.add(make_unary({"mish", default_and_inplace("mish"), {}, floating, plain([](double x) {
                      return x * std::tanh(std::log1p(std::exp(x)));
                    })}));
}

// ---------------------------------------------------------------------------------------------------------------
// clamp, where, masked_fill

// Clamp slots in input order: with two inputs, `tensor_bound` says whether the second one is min or max.
std::vector<std::string> clamp_slots(const Attrs& attrs, size_t input_count) {
  const std::string bound = attrs.get_string("tensor_bound");
  if (bound != "min" && bound != "max") fail("clamp tensor_bound must be \"min\" or \"max\", got \"" + bound + "\"");
  if (input_count == 2 && bound == "max") return {"self", "max", "min"};
  return {"self", "min", "max"};
}

// Sources in the order self, min, max.
std::vector<SlotSource> clamp_sources(const Attrs& attrs, size_t input_count) {
  const auto slots = clamp_slots(attrs, input_count);
  auto sources = resolve_slots(attrs, input_count, slots);
  if (slots[1] == "max") std::swap(sources[1], sources[2]);
  if (!sources[1].present() && !sources[2].present()) fail("clamp needs at least one of min and max");
  return sources;
}

// Bounds are propagated when NaN, the input is kept when NaN, as in PyTorch.
double clamp_float(double x, std::optional<double> lo, std::optional<double> hi) {
  if (std::isnan(x)) return x;
  if (lo) x = std::isnan(*lo) ? *lo : std::max(x, *lo);
  if (hi) x = std::isnan(*hi) ? *hi : std::min(x, *hi);
  return x;
}

OpDef clamp_op() {
  std::vector<AtenSpelling> names = spellings(
      {"aten.clamp.default", "aten.clamp_.default", "aten.clamp.Tensor", "aten.clamp_.Tensor", "aten.clip.default",
       "aten.clip_.default", "aten.clip.Tensor", "aten.clamp_min.default", "aten.clamp_min_.default",
       "aten.clamp_min.Tensor", "aten.clamp_max.default", "aten.clamp_max_.default"});
  names.push_back({"aten.clamp_max.Tensor", {}, {{"tensor_bound", AttrValue{std::string("max")}}}});
  ShapeFn infer = [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    const auto sources = clamp_sources(attrs, inputs.size());
    return std::vector<TensorMeta>{{slot_shape(sources, inputs), result_type(slot_operands(sources, inputs))}};
  };
  ReferenceFn reference = [](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
    const auto sources = clamp_sources(attrs, inputs.size());
    const auto metas = metas_of(inputs);
    const DType common = result_type(slot_operands(sources, metas));
    const auto operands = slot_tensors(sources, inputs, common);
    // operands holds self, then the bounds that are present, in slot order (min before max).
    const bool has_min = sources[1].present(), has_max = sources[2].present();
    const size_t max_index = has_min ? 2 : 1;
    if (computes_in_float(common)) {
      return std::vector<Tensor>{map_float(outputs[0], operands, [&](std::span<const double> v) {
        return clamp_float(v[0], has_min ? std::optional(v[1]) : std::nullopt,
                           has_max ? std::optional(v[max_index]) : std::nullopt);
      })};
    }
    return std::vector<Tensor>{map_int(outputs[0], operands, [&](std::span<const int64_t> v) {
      int64_t x = v[0];
      if (has_min) x = std::max(x, v[1]);
      if (has_max) x = std::min(x, v[max_index]);
      return x;
    })};
  };
  return OpDef{
      "clamp",
      std::move(names),
      {scalar_attr("min"), scalar_attr("max"), {"tensor_bound", AttrType::String, AttrValue{std::string("min")}}},
      1,
      3,
      infer,
      reference};
}

const std::vector<std::string> kWhereSlots = {"condition", "self", "other"};

void check_mask_dtype(DType dtype, const char* what) {
  if (dtype != DType::Bool && dtype != DType::UInt8)
    fail(std::string(what) + " must be bool, got " + std::string(dtype_name(dtype)));
}

OpDef where_op() {
  ShapeFn infer = [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    const auto sources = resolve_slots(attrs, inputs.size(), kWhereSlots);
    require_slots(sources, kWhereSlots);
    if (sources[0].input != 0) fail("where needs the condition as its first input");
    check_mask_dtype(inputs[0].dtype, "where condition");
    const DType dtype = result_type(slot_operands(std::span(sources).subspan(1), inputs));
    return std::vector<TensorMeta>{{slot_shape(sources, inputs), dtype}};
  };
  ReferenceFn reference = [](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
    const auto sources = resolve_slots(attrs, inputs.size(), kWhereSlots);
    const auto metas = metas_of(inputs);
    const DType common = result_type(slot_operands(std::span(sources).subspan(1), metas));
    const auto operands = slot_tensors(sources, inputs, common);
    if (computes_in_float(common))
      return std::vector<Tensor>{map_float(outputs[0], operands, [](auto v) { return v[0] != 0 ? v[1] : v[2]; })};
    return std::vector<Tensor>{map_int(outputs[0], operands, [](auto v) { return v[0] != 0 ? v[1] : v[2]; })};
  };
  return OpDef{"where",
               spellings({"aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar"}),
               {scalar_attr("self"), scalar_attr("other")},
               1,
               3,
               infer,
               reference};
}

const std::vector<std::string> kMaskedFillSlots = {"self", "mask", "value"};

OpDef masked_fill_op() {
  ShapeFn infer = [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    if (inputs.size() < 2) fail("masked_fill needs self and mask inputs");
    const auto sources = resolve_slots(attrs, inputs.size(), kMaskedFillSlots);
    require_slots(sources, kMaskedFillSlots);
    check_mask_dtype(inputs[1].dtype, "masked_fill mask");
    if (inputs.size() == 3 && !inputs[2].shape.empty())
      fail("masked_fill value must be a 0-d tensor, got shape " + shape_string(inputs[2].shape));
    return std::vector<TensorMeta>{{broadcast_shapes(inputs[0].shape, inputs[1].shape), inputs[0].dtype}};
  };
  ReferenceFn reference = [](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
    const auto sources = resolve_slots(attrs, inputs.size(), kMaskedFillSlots);
    const DType dtype = inputs[0].dtype();
    const auto operands = slot_tensors(sources, inputs, dtype);
    if (computes_in_float(dtype))
      return std::vector<Tensor>{map_float(outputs[0], operands, [](auto v) { return v[1] != 0 ? v[2] : v[0]; })};
    return std::vector<Tensor>{map_int(outputs[0], operands, [](auto v) { return v[1] != 0 ? v[2] : v[0]; })};
  };
  return OpDef{"masked_fill",
               spellings({"aten.masked_fill.Scalar", "aten.masked_fill.Tensor", "aten.masked_fill_.Scalar",
                          "aten.masked_fill_.Tensor"}),
               {scalar_attr("value")},
               2,
               3,
               infer,
               reference};
}

}  // namespace

void register_elementwise_ops(OpRegistry& registry) {
  register_arithmetic(registry);
  register_comparisons(registry);
  register_math(registry);
  register_activations(registry);
  registry.add(clamp_op());
  registry.add(where_op());
  registry.add(masked_fill_op());
}

}  // namespace npusim
