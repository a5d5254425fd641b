// x * rsqrt(mean(x^2, dim=-1, keepdim) + eps) [* weight] becomes one rms_norm(x, weight?). Casts to fp32 around
// the chain (Hugging Face's RMSNorm computes in fp32) are absorbed: rms_norm computes in fp32 anyway.
#include <cstdint>
#include <optional>

#include "compiler/passes/fusion.h"

namespace npusim::compiler {

namespace {

bool is_float_cast(const FusionMatcher& m, const Node& node) {
  return node.op == "to" && node.inputs.size() == 1 && is_floating(m.meta(node.inputs[0]).dtype) &&
         is_floating(m.meta(node.outputs[0]).dtype);
}

bool is_mean_of_last_dim(const FusionMatcher& m, const Node& mean) {
  const std::vector<int64_t> dims = mean.attrs.get_ints("dim", {});
  return mean.inputs.size() == 1 && dims.size() == 1 && is_last_dim(dims[0], m.meta(mean.inputs[0]).shape.size()) &&
         mean.attrs.get_bool("keepdim", false);
}

struct RmsNorm {
  std::vector<int32_t> pattern;
  ValueId x = kNoValue;
  ValueId weight = kNoValue;
  double eps = 0;
};

// The chain that starts at `pow` (x^2), or nothing.
std::optional<RmsNorm> match(const FusionMatcher& m, const Node& pow) {
  if (pow.op != "pow" || scalar_attr(pow, "exponent") != 2.0 || !pow.attrs.is_none("base")) return std::nullopt;
  RmsNorm norm;
  norm.x = pow.inputs[0];
  const Node* mean = m.sole_consumer(pow.outputs[0], "mean");
  if (!mean || !is_mean_of_last_dim(m, *mean)) return std::nullopt;
  const Node* add = m.sole_consumer(mean->outputs[0], "add");
  if (!add || !unit_alpha(*add) || !scalar_attr(*add)) return std::nullopt;
  norm.eps = *scalar_attr(*add);
  const Node* rsqrt = m.sole_consumer(add->outputs[0], "rsqrt");
  if (!rsqrt) return std::nullopt;
  const Node* normalize = m.sole_consumer(rsqrt->outputs[0], "mul");
  if (!normalize || normalize->inputs.size() != 2 || other_input(*normalize, rsqrt->outputs[0]) != norm.x)
    return std::nullopt;
  norm.pattern = {m.index_of(pow), m.index_of(*mean), m.index_of(*add), m.index_of(*rsqrt), m.index_of(*normalize)};

  ValueId value = normalize->outputs[0];
  const Node* cast = m.sole_consumer(value, "to");
  if (cast && is_float_cast(m, *cast)) {
    norm.pattern.push_back(m.index_of(*cast));
    value = cast->outputs[0];
  }
  const Shape& shape = m.meta(norm.x).shape;
  const Node* scale = m.sole_consumer(value, "mul");
  if (scale && scale->inputs.size() == 2 && !shape.empty()) {
    const ValueId weight = other_input(*scale, value);
    if (weight != value && m.meta(weight).shape == Shape{shape.back()}) {
      norm.pattern.push_back(m.index_of(*scale));
      norm.weight = weight;
    }
  }
  // x itself may be a cast that only this chain reads.
  while (const Node* x_cast = m.producer(norm.x, "to")) {
    if (!is_float_cast(m, *x_cast) || !m.absorbable(norm.x, norm.pattern)) break;
    norm.pattern.push_back(m.index_of(*x_cast));
    norm.x = x_cast->inputs[0];
  }
  return norm;
}

}  // namespace

void fuse_rms_norm(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (m.taken(n)) continue;
    const std::optional<RmsNorm> norm = match(m, graph.nodes[n]);
    if (!norm) continue;
    const Shape& shape = m.meta(norm->x).shape;
    Attrs attrs;
    attrs.set("normalized_shape", std::vector<int64_t>{shape.back()});
    attrs.set("eps", norm->eps);
    std::vector<ValueId> inputs{norm->x};
    if (norm->weight != kNoValue) inputs.push_back(norm->weight);
    m.replace(norm->pattern, "rms_norm", attrs, inputs);
  }
  m.finish(context, "fuse_rms_norm", "rms_norm fused");
}

}  // namespace npusim::compiler
