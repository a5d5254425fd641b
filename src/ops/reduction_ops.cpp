// Reductions (sum, mean, prod, amax/amin, max/min with indices, argmax/argmin, var/std, logsumexp) and the ops that
// work along one dim (softmax, log_softmax, cumsum). Floats accumulate in double; integer sums stay exact in int64.
#include <cmath>
#include <limits>
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

// ---------------------------------------------------------------------------------------------------------------
// Reduction geometry

std::vector<bool> single_dim(int64_t dim, int64_t rank) {
  const int64_t d = normalize_dim(dim, rank);
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  if (rank > 0) reduced[static_cast<size_t>(d)] = true;
  return reduced;
}

Shape reduced_shape(const Shape& input, const std::vector<bool>& reduced, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < input.size(); ++d) {
    if (!reduced[d])
      out.push_back(input[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

void require_nonempty_reduction(const Shape& input, const std::vector<bool>& reduced, const char* op) {
  for (size_t d = 0; d < input.size(); ++d)
    if (reduced[d] && input[d] == 0)
      fail(std::string(op) + " cannot reduce over dim " + std::to_string(d) + " of size 0 (shape " +
           shape_string(input) + ")");
}

// Flat offsets of every element spanned by `dims` (row-major over them), given the tensor's strides.
std::vector<int64_t> offsets_over(const Shape& shape, const Shape& strides, const std::vector<size_t>& dims) {
  std::vector<int64_t> offsets = {0};
  for (size_t d : dims) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(shape[d]));
    for (int64_t base : offsets)
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(base + i * strides[d]);
    offsets = std::move(next);
  }
  return offsets;
}

// Each output element reduces the input elements at groups[o] + members[k], k over the reduced dims.
struct ReductionPlan {
  std::vector<int64_t> groups;   // one per output element, in output order
  std::vector<int64_t> members;  // relative offsets, row-major over the reduced dims
};

ReductionPlan plan_reduction(const Shape& input, const std::vector<bool>& reduced) {
  const Shape strides = contiguous_strides(input);
  std::vector<size_t> kept_dims, reduced_list;
  for (size_t d = 0; d < input.size(); ++d) (reduced[d] ? reduced_list : kept_dims).push_back(d);
  return {offsets_over(input, strides, kept_dims), offsets_over(input, strides, reduced_list)};
}

std::optional<DType> dtype_attr(const Attrs& attrs) {
  if (attrs.is_none("dtype")) return std::nullopt;
  const auto dtype = parse_dtype(attrs.get_string("dtype"));
  if (!dtype) fail("unknown dtype " + attrs.get_string("dtype"));
  return dtype;
}

DType require_floating(DType dtype, const std::string& op) {
  if (!is_floating(dtype)) fail(op + " needs a floating point input or dtype, got " + std::string(dtype_name(dtype)));
  return dtype;
}

// ---------------------------------------------------------------------------------------------------------------
// Full and partial reductions over a `dim` list

// Reduces the values of one group; reads through `value(k)` for k in [0, count).
struct GroupReader {
  const Tensor& input;
  int64_t group;
  const std::vector<int64_t>& members;
  int64_t count() const { return static_cast<int64_t>(members.size()); }
  double as_float(int64_t k) const { return load_float(input, group + members[static_cast<size_t>(k)]); }
  int64_t as_int(int64_t k) const { return load_int(input, group + members[static_cast<size_t>(k)]); }
};

using FloatReducer = std::function<double(const GroupReader&)>;
using IntReducer = std::function<int64_t(const GroupReader&)>;

// Applies a reducer to every group: `on_float` for float inputs or outputs, else `on_int`; either may be empty.
Tensor reduce_groups(const Tensor& input, const std::vector<bool>& reduced, const TensorMeta& out,
                     const FloatReducer& on_float, const IntReducer& on_int) {
  const ReductionPlan plan = plan_reduction(input.shape(), reduced);
  Tensor result = make_output(out);
  const bool in_float = on_float && (is_floating(out.dtype) || is_floating(input.dtype()) || !on_int);
  for (size_t o = 0; o < plan.groups.size(); ++o) {
    const GroupReader reader{input, plan.groups[o], plan.members};
    if (in_float)
      store_float(result, static_cast<int64_t>(o), on_float(reader));
    else
      store_int(result, static_cast<int64_t>(o), on_int(reader));
  }
  return result;
}

double float_sum(const GroupReader& g) {
  double sum = 0;
  for (int64_t k = 0; k < g.count(); ++k) sum += g.as_float(k);
  return sum;
}

int64_t int_sum(const GroupReader& g) {
  int64_t sum = 0;
  for (int64_t k = 0; k < g.count(); ++k) sum = wrapping_add(sum, g.as_int(k));
  return sum;
}

double float_mean(const GroupReader& g) { return float_sum(g) / static_cast<double>(g.count()); }

double float_prod(const GroupReader& g) {
  double prod = 1;
  for (int64_t k = 0; k < g.count(); ++k) prod *= g.as_float(k);
  return prod;
}

int64_t int_prod(const GroupReader& g) {
  int64_t prod = 1;
  for (int64_t k = 0; k < g.count(); ++k) prod = wrapping_mul(prod, g.as_int(k));
  return prod;
}

// NaN counts as larger than everything, as in PyTorch's max/argmax.
bool float_better(double candidate, double best, bool want_max) {
  if (std::isnan(best)) return false;
  if (std::isnan(candidate)) return true;
  return want_max ? candidate > best : candidate < best;
}

// Index of the first extreme element of the group.
int64_t extreme_index(const GroupReader& g, bool want_max, bool in_float) {
  int64_t best = 0;
  for (int64_t k = 1; k < g.count(); ++k) {
    const bool better = in_float ? float_better(g.as_float(k), g.as_float(best), want_max)
                                 : (want_max ? g.as_int(k) > g.as_int(best) : g.as_int(k) < g.as_int(best));
    if (better) best = k;
  }
  return best;
}

// Variance with `correction` subtracted from the count; a count <= correction divides by zero like PyTorch.
double float_variance(const GroupReader& g, double correction) {
  const double mean = float_mean(g);
  double squares = 0;
  for (int64_t k = 0; k < g.count(); ++k) squares += (g.as_float(k) - mean) * (g.as_float(k) - mean);
  return squares / std::max(0.0, static_cast<double>(g.count()) - correction);
}

// log(sum(exp(x))) shifted by the max; an infinite max shifts by 0 so all -inf gives -inf and +inf gives inf.
double float_logsumexp(const GroupReader& g) {
  double shift = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < g.count(); ++k) shift = std::max(shift, g.as_float(k));
  if (std::isinf(shift)) shift = 0;
  double sum = 0;
  for (int64_t k = 0; k < g.count(); ++k) sum += std::exp(g.as_float(k) - shift);
  return std::log(sum) + shift;
}

// The common attrs of dim-list reductions.
std::vector<AttrSpec> dim_list_attrs(bool with_dtype) {
  std::vector<AttrSpec> attrs = {{"dim", AttrType::Ints, AttrValue{NoneValue{}}},
                                 {"keepdim", AttrType::Bool, AttrValue{false}}};
  if (with_dtype) attrs.push_back({"dtype", AttrType::DTypeName, AttrValue{NoneValue{}}});
  return attrs;
}

struct DimListReduction {
  std::string name;
  std::vector<AtenSpelling> spellings;
  std::vector<AttrSpec> attrs;
  std::function<DType(const Attrs&, DType input)> result_dtype;
  std::function<FloatReducer(const Attrs&)> float_reducer;
  IntReducer on_int;            // empty: integer inputs reduce in float
  bool needs_elements = false;  // amax/amin: a zero-size reduced dim is an error
};

OpDef make_dim_list_reduction(DimListReduction op) {
  auto shared = std::make_shared<DimListReduction>(std::move(op));
  ShapeFn infer = [shared](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    expect_inputs(inputs, 1, shared->name.c_str());
    const Shape& shape = inputs[0].shape;
    const auto reduced = reduced_dims(attrs, static_cast<int64_t>(shape.size()));
    if (shared->needs_elements) require_nonempty_reduction(shape, reduced, shared->name.c_str());
    return std::vector<TensorMeta>{{reduced_shape(shape, reduced, attrs.get_bool("keepdim", false)),
                                    shared->result_dtype(attrs, inputs[0].dtype)}};
  };
  ReferenceFn reference = [shared](const Attrs& attrs, std::span<const Tensor> inputs,
                                   std::span<const TensorMeta> outputs) {
    const auto reduced = reduced_dims(attrs, inputs[0].rank());
    return std::vector<Tensor>{
        reduce_groups(inputs[0], reduced, outputs[0], shared->float_reducer(attrs), shared->on_int)};
  };
  return OpDef{shared->name, shared->spellings, shared->attrs, 1, 1, infer, reference};
}

// sum/prod: integers and bools accumulate in int64 unless a dtype says otherwise.
DType sum_dtype(const Attrs& attrs, DType input) {
  if (auto dtype = dtype_attr(attrs)) return *dtype;
  return is_floating(input) ? input : DType::Int64;
}

DType same_dtype(const Attrs&, DType input) { return input; }

std::function<FloatReducer(const Attrs&)> always(FloatReducer reducer) {
  return [reducer](const Attrs&) { return reducer; };
}

double correction_of(const Attrs& attrs) {
  if (!attrs.is_none("correction")) return attrs.get_float("correction");
  return attrs.get_bool("unbiased", true) ? 1.0 : 0.0;
}

void register_dim_list_reductions(OpRegistry& r) {
  r.add(make_dim_list_reduction({"sum", spellings({"aten.sum.dim_IntList", "aten.sum.default"}), dim_list_attrs(true),
                                 sum_dtype, always(float_sum), int_sum}));
  r.add(make_dim_list_reduction(
      {"mean", spellings({"aten.mean.dim", "aten.mean.default"}), dim_list_attrs(true),
       [](const Attrs& attrs, DType input) { return require_floating(dtype_attr(attrs).value_or(input), "mean"); },
       always(float_mean), nullptr}));
  r.add(make_dim_list_reduction({"prod", spellings({"aten.prod.dim_int", "aten.prod.default"}), dim_list_attrs(true),
                                 sum_dtype, always(float_prod), int_prod}));

  // amax/amin take dim=[] for "all dims"; max.default/min.default are the same full reduction.
  for (const bool want_max : {true, false}) {
    const std::string name = want_max ? "amax" : "amin";
    std::vector<AtenSpelling> names = spellings({"aten." + name + ".default"});
    names.push_back(
        {want_max ? "aten.max.default" : "aten.min.default", {}, {{"dim", AttrValue{std::vector<int64_t>{}}}}});
    std::vector<AttrSpec> attrs = {{"dim", AttrType::Ints, AttrValue{std::vector<int64_t>{}}},
                                   {"keepdim", AttrType::Bool, AttrValue{false}}};
    DimListReduction op{
        name,
        std::move(names),
        std::move(attrs),
        same_dtype,
        always([want_max](const GroupReader& g) { return g.as_float(extreme_index(g, want_max, true)); }),
        [want_max](const GroupReader& g) { return g.as_int(extreme_index(g, want_max, false)); }};
    op.needs_elements = true;
    r.add(make_dim_list_reduction(std::move(op)));
  }

  for (const bool take_sqrt : {false, true}) {
    const std::string name = take_sqrt ? "std" : "var";
    std::vector<AttrSpec> attrs = dim_list_attrs(false);
    attrs.push_back({"unbiased", AttrType::Bool, AttrValue{true}});
    // Null means 1, or 0 when `unbiased` (var.dim, var.default) is false.
    attrs.push_back({"correction", AttrType::Scalar, AttrValue{NoneValue{}}});
    r.add(make_dim_list_reduction(
        {name, spellings({"aten." + name + ".correction", "aten." + name + ".dim", "aten." + name + ".default"}),
         std::move(attrs), [name](const Attrs&, DType input) { return require_floating(input, name); },
         [take_sqrt](const Attrs& attrs) -> FloatReducer {
           const double correction = correction_of(attrs);
           return [take_sqrt, correction](const GroupReader& g) {
             const double variance = float_variance(g, correction);
             return take_sqrt ? std::sqrt(variance) : variance;
           };
         },
         nullptr}));
  }

  std::vector<AttrSpec> logsumexp_attrs = {{"dim", AttrType::Ints, std::nullopt, true},
                                           {"keepdim", AttrType::Bool, AttrValue{false}}};
  r.add(make_dim_list_reduction({"logsumexp", spellings({"aten.logsumexp.default"}), std::move(logsumexp_attrs),
                                 [](const Attrs&, DType input) { return is_floating(input) ? input : DType::Float32; },
                                 always(float_logsumexp), nullptr}));
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions along one dim that return indices

TensorMeta single_dim_output(const Attrs& attrs, const TensorMeta& input, DType dtype, const char* op) {
  const auto reduced = single_dim(attrs.get_int("dim"), static_cast<int64_t>(input.shape.size()));
  require_nonempty_reduction(input.shape, reduced, op);
  return {reduced_shape(input.shape, reduced, attrs.get_bool("keepdim", false)), dtype};
}

// max.dim / min.dim: (values, int64 indices of the first extreme element).
OpDef extreme_with_indices_op(bool want_max) {
  const std::string name = want_max ? "max_dim" : "min_dim";
  ShapeFn infer = [name](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    expect_inputs(inputs, 1, name.c_str());
    return std::vector<TensorMeta>{single_dim_output(attrs, inputs[0], inputs[0].dtype, name.c_str()),
                                   single_dim_output(attrs, inputs[0], DType::Int64, name.c_str())};
  };
  ReferenceFn reference = [want_max](const Attrs& attrs, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
    const Tensor& input = inputs[0];
    const ReductionPlan plan = plan_reduction(input.shape(), single_dim(attrs.get_int("dim"), input.rank()));
    Tensor values = make_output(outputs[0]);
    Tensor indices = make_output(outputs[1]);
    const bool in_float = is_floating(input.dtype());
    for (size_t o = 0; o < plan.groups.size(); ++o) {
      const GroupReader g{input, plan.groups[o], plan.members};
      const int64_t best = extreme_index(g, want_max, in_float);
      const auto out_index = static_cast<int64_t>(o);
      if (in_float)
        store_float(values, out_index, g.as_float(best));
      else
        store_int(values, out_index, g.as_int(best));
      store_int(indices, out_index, best);
    }
    return std::vector<Tensor>{values, indices};
  };
  return OpDef{name,
               spellings({want_max ? "aten.max.dim" : "aten.min.dim"}),
               {{"dim", AttrType::Int, std::nullopt, true}, {"keepdim", AttrType::Bool, AttrValue{false}}},
               1,
               1,
               infer,
               reference};
}

// argmax/argmin: a null dim searches the flattened tensor (keepdim then gives all-ones dims).
std::vector<bool> arg_reduced_dims(const Attrs& attrs, int64_t rank) {
  if (attrs.is_none("dim")) return std::vector<bool>(static_cast<size_t>(rank), true);
  return single_dim(attrs.get_int("dim"), rank);
}

OpDef arg_extreme_op(bool want_max) {
  const std::string name = want_max ? "argmax" : "argmin";
  ShapeFn infer = [name](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    expect_inputs(inputs, 1, name.c_str());
    const Shape& shape = inputs[0].shape;
    const auto reduced = arg_reduced_dims(attrs, static_cast<int64_t>(shape.size()));
    require_nonempty_reduction(shape, reduced, name.c_str());
    return std::vector<TensorMeta>{{reduced_shape(shape, reduced, attrs.get_bool("keepdim", false)), DType::Int64}};
  };
  ReferenceFn reference = [want_max](const Attrs& attrs, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
    const Tensor& input = inputs[0];
    const bool in_float = is_floating(input.dtype());
    const auto reduced = arg_reduced_dims(attrs, input.rank());
    return std::vector<Tensor>{reduce_groups(input, reduced, outputs[0], nullptr, [&](const GroupReader& g) {
      return extreme_index(g, want_max, in_float);
    })};
  };
  return OpDef{name,
               spellings({"aten." + name + ".default"}),
               {{"dim", AttrType::Int, AttrValue{NoneValue{}}}, {"keepdim", AttrType::Bool, AttrValue{false}}},
               1,
               1,
               infer,
               reference};
}

// ---------------------------------------------------------------------------------------------------------------
// Ops along one dim with the input's shape: softmax, log_softmax, cumsum

// Calls fn(reader, write) for each line along `dim`; write(k, value) stores element k of the line.
using LineFn = std::function<void(const GroupReader&, const std::function<void(int64_t, double)>&)>;

Tensor along_dim_float(const Tensor& input, int64_t dim, const TensorMeta& out, const LineFn& fn) {
  const ReductionPlan plan = plan_reduction(input.shape(), single_dim(dim, input.rank()));
  Tensor result = make_output(out);
  for (int64_t group : plan.groups) {
    const GroupReader reader{input, group, plan.members};
    fn(reader,
       [&](int64_t k, double value) { store_float(result, group + plan.members[static_cast<size_t>(k)], value); });
  }
  return result;
}

// softmax.int carries an optional dtype; _softmax.default a half_to_float flag.
DType softmax_dtype(const Attrs& attrs, DType input, const std::string& op) {
  if (auto dtype = dtype_attr(attrs)) return require_floating(*dtype, op);
  if (attrs.get_bool("half_to_float", false) && (input == DType::Float16 || input == DType::BFloat16))
    return DType::Float32;
  return require_floating(input, op);
}

// Exponentials shifted by the line max; a line of all -inf gives NaN, as in PyTorch.
void softmax_line(const GroupReader& g, const std::function<void(int64_t, double)>& write, bool log) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < g.count(); ++k) max = std::max(max, g.as_float(k));
  double sum = 0;
  for (int64_t k = 0; k < g.count(); ++k) sum += std::exp(g.as_float(k) - max);
  for (int64_t k = 0; k < g.count(); ++k) {
    const double shifted = g.as_float(k) - max;
    write(k, log ? shifted - std::log(sum) : std::exp(shifted) / sum);
  }
}

OpDef softmax_op(bool log) {
  const std::string name = log ? "log_softmax" : "softmax";
  ShapeFn infer = [name](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    expect_inputs(inputs, 1, name.c_str());
    normalize_dim(attrs.get_int("dim"), static_cast<int64_t>(inputs[0].shape.size()));
    return std::vector<TensorMeta>{{inputs[0].shape, softmax_dtype(attrs, inputs[0].dtype, name)}};
  };
  ReferenceFn reference = [log](const Attrs& attrs, std::span<const Tensor> inputs,
                                std::span<const TensorMeta> outputs) {
    return std::vector<Tensor>{
        along_dim_float(inputs[0], attrs.get_int("dim"), outputs[0],
                        [log](const GroupReader& g, const auto& write) { softmax_line(g, write, log); })};
  };
  return OpDef{name,
               spellings({"aten." + name + ".int", "aten._" + name + ".default"}),
               {{"dim", AttrType::Int, std::nullopt, true},
                {"dtype", AttrType::DTypeName, AttrValue{NoneValue{}}},
                {"half_to_float", AttrType::Bool, AttrValue{false}}},
               1,
               1,
               infer,
               reference};
}

OpDef cumsum_op() {
  ShapeFn infer = [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
    expect_inputs(inputs, 1, "cumsum");
    normalize_dim(attrs.get_int("dim"), static_cast<int64_t>(inputs[0].shape.size()));
    return std::vector<TensorMeta>{{inputs[0].shape, sum_dtype(attrs, inputs[0].dtype)}};
  };
  ReferenceFn reference = [](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
    const Tensor& input = inputs[0];
    const ReductionPlan plan = plan_reduction(input.shape(), single_dim(attrs.get_int("dim"), input.rank()));
    Tensor result = make_output(outputs[0]);
    const bool in_float = is_floating(outputs[0].dtype) || is_floating(input.dtype());
    for (int64_t group : plan.groups) {
      double float_total = 0;
      int64_t int_total = 0;
      for (int64_t member : plan.members) {
        const int64_t at = group + member;
        if (in_float)
          store_float(result, at, float_total += load_float(input, at));
        else
          store_int(result, at, int_total = wrapping_add(int_total, load_int(input, at)));
      }
    }
    return std::vector<Tensor>{result};
  };
  return OpDef{"cumsum",
               spellings({"aten.cumsum.default", "aten.cumsum_.default"}),
               {{"dim", AttrType::Int, std::nullopt, true}, {"dtype", AttrType::DTypeName, AttrValue{NoneValue{}}}},
               1,
               1,
               infer,
               reference};
}

}  // namespace

void register_reduction_ops(OpRegistry& registry) {
  register_dim_list_reductions(registry);
  registry.add(extreme_with_indices_op(true));
  registry.add(extreme_with_indices_op(false));
  registry.add(arg_extreme_op(true));
  registry.add(arg_extreme_op(false));
  registry.add(softmax_op(false));
  registry.add(softmax_op(true));
  registry.add(cumsum_op());
}

}  // namespace npusim
