// matmul(q, transpose(k, -2, -1)) -> mul by a scalar scale (or div) -> [add(mask)] -> softmax(-1) -> [to] ->
// matmul(v) becomes one attention(q, k, v, mask?, cache_position?), and so does scaled_dot_product_attention.
// Keys and values that reach the products through the grouped-query repeat (unsqueeze -> expand -> reshape,
// [B, Hkv, S, D] -> [B, Hkv * n, S, D]) are read un-repeated: attention maps query heads to key/value heads.
// When keys and values are a static cache just written by index_copy at positions that are a graph input
// (a decode step), those positions become the extra input cache_position: attention then reads only cache
// positions up to the last one written, which the mask already leaves as the only visible ones.
#include <algorithm>
#include <cmath>
#include <optional>

#include "compiler/passes/fusion.h"

namespace npusim::compiler {

namespace {

// The tensor before the grouped-query repeat that produced `value`, or `value` itself. The repeat is recognised
// by shapes: [..., H, S, D] -> [..., H, 1, S, D] -> [..., H, n, S, D] -> [..., H * n, S, D].
ValueId unrepeated(const FusionMatcher& m, ValueId value) {
  const Node* reshape = m.producer(value, "reshape");
  const Node* expand = reshape && reshape->inputs.size() == 1 ? m.producer(reshape->inputs[0], "expand") : nullptr;
  const Node* unsqueeze = expand && expand->inputs.size() == 1 ? m.producer(expand->inputs[0], "unsqueeze") : nullptr;
  if (!unsqueeze) return value;
  const ValueId source = unsqueeze->inputs[0];
  const Shape& shape = m.meta(source).shape;
  if (shape.size() < 3) return value;
  const size_t heads = shape.size() - 3;
  Shape inserted = shape;
  inserted.insert(inserted.begin() + static_cast<std::ptrdiff_t>(heads) + 1, 1);
  Shape expanded = m.meta(expand->outputs[0]).shape;
  if (m.meta(unsqueeze->outputs[0]).shape != inserted || expanded.size() != inserted.size()) return value;
  const int64_t copies = expanded[heads + 1];
  expanded[heads + 1] = 1;
  Shape repeated = shape;
  repeated[heads] *= copies;
  if (expanded != inserted || m.meta(value).shape != repeated) return value;
  return source;
}

// The positions `cache` (an un-repeated key or value) was just written at, when it is index_copy of a static
// cache along the positions dim with indices that are a graph input.
ValueId written_positions(const FusionMatcher& m, ValueId cache) {
  const Node* copy = m.producer(cache, "index_copy");
  if (!copy || copy->inputs.size() != 3) return kNoValue;
  const size_t rank = m.meta(cache).shape.size();
  const int64_t dim = copy->attrs.get_int("dim", 0);
  if (rank < 2 || (dim != static_cast<int64_t>(rank) - 2 && dim != -2)) return kNoValue;
  const ValueId positions = copy->inputs[1];
  return m.graph().value(positions).kind == ValueKind::GraphInput ? positions : kNoValue;
}

struct Attention {
  std::vector<int32_t> pattern;
  ValueId q = kNoValue, k = kNoValue, v = kNoValue, mask = kNoValue;
  double scale = 1.0;
  bool is_causal = false;
  bool zero_masked_rows = false;
};

// `scores` = [matmul(q, transpose(k)) scaled] as described above; fills q, k, scale and the pattern.
bool match_scores(const FusionMatcher& m, ValueId scores, Attention& a) {
  ValueId raw = scores;
  const Node* scaling = m.producer(scores);
  if (scaling && (scaling->op == "mul" || scaling->op == "div") && scalar_attr(*scaling)) {
    if (scaling->op == "div" && !scaling->attrs.is_none("rounding_mode")) return false;
    const double factor = *scalar_attr(*scaling);
    a.scale = scaling->op == "mul" ? factor : 1.0 / factor;
    a.pattern.push_back(m.index_of(*scaling));
    raw = scaling->inputs[0];
  }
  const Node* product = m.producer(raw, "matmul");
  if (!product || product->inputs.size() != 2) return false;
  const Node* transpose = m.producer(product->inputs[1], "transpose");
  if (!transpose) return false;
  const size_t rank = m.meta(transpose->inputs[0]).shape.size();
  const int64_t dim0 = transpose->attrs.get_int("dim0"), dim1 = transpose->attrs.get_int("dim1");
  const auto wrap = [rank](int64_t d) { return d < 0 ? d + static_cast<int64_t>(rank) : d; };
  const auto last = static_cast<int64_t>(rank) - 1;
  if (rank < 3 || std::min(wrap(dim0), wrap(dim1)) != last - 1 || std::max(wrap(dim0), wrap(dim1)) != last)
    return false;
  a.pattern.push_back(m.index_of(*product));
  a.q = product->inputs[0];
  a.k = transpose->inputs[0];
  return true;
}

// The chain ending at `output` = matmul(probabilities, v).
std::optional<Attention> match_chain(const FusionMatcher& m, const Node& output) {
  if (output.op != "matmul" || output.inputs.size() != 2) return std::nullopt;
  Attention a;
  a.pattern.push_back(m.index_of(output));
  a.v = output.inputs[1];
  ValueId probabilities = output.inputs[0];
  if (const Node* cast = m.producer(probabilities, "to");
      cast && cast->inputs.size() == 1 && is_floating(m.meta(cast->outputs[0]).dtype)) {
    a.pattern.push_back(m.index_of(*cast));
    probabilities = cast->inputs[0];
  }
  const Node* softmax = m.producer(probabilities, "softmax");
  if (!softmax || !is_last_dim(softmax->attrs.get_int("dim"), m.meta(probabilities).shape.size()) ||
      softmax->attrs.get_bool("half_to_float", false))
    return std::nullopt;
  a.pattern.push_back(m.index_of(*softmax));
  const ValueId logits = softmax->inputs[0];
  const Node* add = m.producer(logits, "add");
  bool matched = false;
  if (add && add->inputs.size() == 2 && unit_alpha(*add)) {
    for (int side = 0; side < 2 && !matched; ++side) {
      Attention candidate = a;
      candidate.pattern.push_back(m.index_of(*add));
      if (match_scores(m, add->inputs[side], candidate)) {
        candidate.mask = add->inputs[1 - side];
        a = candidate;
        matched = true;
      }
    }
  }
  if (!matched && !match_scores(m, logits, a)) return std::nullopt;
  // Everything computed along the chain is read only inside it.
  for (int32_t n : a.pattern)
    if (n != a.pattern.front() && !m.absorbable(m.graph().nodes[static_cast<size_t>(n)].outputs[0], a.pattern))
      return std::nullopt;
  return a;
}

std::optional<Attention> match_sdpa(const FusionMatcher& m, const Node& sdpa) {
  if (sdpa.op != "scaled_dot_product_attention" || sdpa.outputs.size() != 1 || sdpa.inputs.size() < 3 ||
      sdpa.attrs.get_float("dropout_p", 0.0) != 0.0)
    return std::nullopt;
  Attention a;
  a.pattern = {m.index_of(sdpa)};
  a.q = sdpa.inputs[0];
  a.k = sdpa.inputs[1];
  a.v = sdpa.inputs[2];
  if (sdpa.inputs.size() == 4) a.mask = sdpa.inputs[3];
  const Shape& q = m.meta(a.q).shape;
  if (q.empty()) return std::nullopt;
  a.scale =
      sdpa.attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(q.back())) : sdpa.attrs.get_float("scale");
  a.is_causal = sdpa.attrs.get_bool("is_causal", false);
  a.zero_masked_rows = true;
  return a;
}

}  // namespace

void fuse_attention(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  size_t bounded = 0, from_sdpa = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (m.taken(n)) continue;
    const Node& node = graph.nodes[n];
    std::optional<Attention> a = node.op == "scaled_dot_product_attention" ? match_sdpa(m, node) : match_chain(m, node);
    if (!a) continue;
    const bool is_sdpa = node.op == "scaled_dot_product_attention";
    const ValueId k = unrepeated(m, a->k), v = unrepeated(m, a->v);
    Attrs attrs;
    attrs.set("scale", a->scale);
    attrs.set("is_causal", a->is_causal);
    attrs.set("zero_masked_rows", a->zero_masked_rows);
    attrs.set("has_mask", a->mask != kNoValue);
    std::vector<ValueId> inputs{a->q, k, v};
    if (a->mask != kNoValue) inputs.push_back(a->mask);
    const ValueId positions = written_positions(m, k);
    const bool bound = positions != kNoValue && written_positions(m, v) == positions;
    attrs.set("has_cache_position", bound);
    if (bound) inputs.push_back(positions);
    if (!m.replace(a->pattern, "attention", attrs, inputs)) continue;
    bounded += bound;
    from_sdpa += is_sdpa;
  }
  m.finish(context, "fuse_attention",
           "attention fused (" + std::to_string(bounded) + " bounded by cache_position, " + std::to_string(from_sdpa) +
               " from scaled_dot_product_attention)");
}

}  // namespace npusim::compiler
