// Hugging Face's apply_rotary_pos_emb, x * cos + cat(-x2, x1) * sin where x1 and x2 are the halves of x's last
// dim taken by two slices, becomes one rope(x, cos, sin). cos and sin stay as the muls read them (usually
// unsqueezed to broadcast over the heads), and the operands of every mul and of the add may come in either order.
#include <algorithm>
#include <limits>
#include <optional>

#include "compiler/passes/fusion.h"

namespace npusim::compiler {

namespace {

// slice(x, last dim, [begin, end)) with step 1, ends clamped like Python's.
bool is_last_dim_slice(const FusionMatcher& m, const Node& slice, ValueId x, int64_t begin, int64_t end) {
  if (slice.op != "slice" || slice.inputs.size() != 1 || slice.inputs[0] != x) return false;
  const Shape& shape = m.meta(x).shape;
  if (!is_last_dim(slice.attrs.get_int("dim", 0), shape.size()) || slice.attrs.get_int("step", 1) != 1) return false;
  const int64_t width = shape.back();
  const auto clamp = [width](int64_t at) { return std::clamp<int64_t>(at < 0 ? at + width : at, 0, width); };
  return clamp(slice.attrs.get_int("start", 0)) == begin &&
         clamp(slice.attrs.get_int("end", std::numeric_limits<int64_t>::max())) == end;
}

struct Rope {
  ValueId x = kNoValue, cos = kNoValue, sin = kNoValue;
  std::vector<int32_t> pattern;
};

// `rotated_value` = cat(-x2, x1) * sin, in either operand order of the mul.
std::optional<Rope> match_rotated(const FusionMatcher& m, ValueId rotated_value) {
  const Node* rotated = m.producer(rotated_value, "mul");
  if (!rotated || rotated->inputs.size() != 2) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const Node* cat = m.producer(rotated->inputs[side], "cat");
    if (!cat || cat->inputs.size() != 2 ||
        !is_last_dim(cat->attrs.get_int("dim", 0), m.meta(cat->outputs[0]).shape.size()))
      continue;
    const Node* neg = m.producer(cat->inputs[0], "neg");
    const Node* upper = neg && neg->inputs.size() == 1 ? m.producer(neg->inputs[0], "slice") : nullptr;
    const Node* lower = m.producer(cat->inputs[1], "slice");
    if (!upper || !lower) continue;
    const ValueId x = upper->inputs[0];
    const Shape& shape = m.meta(x).shape;
    if (shape.empty() || shape.back() % 2 != 0) continue;
    const int64_t width = shape.back();
    if (!is_last_dim_slice(m, *upper, x, width / 2, width) || !is_last_dim_slice(m, *lower, x, 0, width / 2)) continue;
    Rope rope;
    rope.x = x;
    rope.sin = rotated->inputs[1 - side];
    rope.pattern = {m.index_of(*rotated), m.index_of(*cat), m.index_of(*neg), m.index_of(*upper), m.index_of(*lower)};
    return rope;
  }
  return std::nullopt;
}

std::optional<Rope> match(const FusionMatcher& m, const Node& add) {
  if (add.op != "add" || add.inputs.size() != 2 || !unit_alpha(add)) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    std::optional<Rope> rope = match_rotated(m, add.inputs[1 - side]);
    const Node* direct = m.producer(add.inputs[side], "mul");
    if (!rope || !direct || direct->inputs.size() != 2) continue;
    if (direct->inputs[0] == rope->x)
      rope->cos = direct->inputs[1];
    else if (direct->inputs[1] == rope->x)
      rope->cos = direct->inputs[0];
    else
      continue;
    rope->pattern.push_back(m.index_of(*direct));
    rope->pattern.push_back(m.index_of(add));
    bool absorbable = m.meta(add.outputs[0]).shape == m.meta(rope->x).shape;
    for (size_t i = 0; i + 1 < rope->pattern.size(); ++i)
      absorbable =
          absorbable && m.absorbable(m.graph().nodes[static_cast<size_t>(rope->pattern[i])].outputs[0], rope->pattern);
    if (absorbable) return rope;
  }
  return std::nullopt;
}

}  // namespace

void fuse_rope(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (m.taken(n)) continue;
    if (const std::optional<Rope> rope = match(m, graph.nodes[n]))
      m.replace(rope->pattern, "rope", {}, {rope->x, rope->cos, rope->sin});
  }
  m.finish(context, "fuse_rope", "rotary embeddings fused");
}

}  // namespace npusim::compiler
