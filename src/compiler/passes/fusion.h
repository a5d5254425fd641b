#pragma once
// What the fusion passes share: a view of who produces and who reads each value while a pass matches patterns,
// and the one way a matched pattern is replaced. A fused node takes the place of the pattern's LAST node and
// reuses its output value, so graph outputs keep their names and every input of the pattern is already
// computed where the fused node runs. Matched nodes are removed when the pass finishes, together with any node
// (a view such as a transpose) that nothing reads any more.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/pass.h"
#include "npusim/graph.h"

namespace npusim::compiler {

class FusionMatcher {
 public:
  explicit FusionMatcher(Graph& graph);

  const Graph& graph() const { return graph_; }
  const TensorMeta& meta(ValueId id) const { return graph_.value(id).meta; }

  // The node producing `id`, when it is a node output not yet part of a match and (unless `op` is empty) of
  // that op.
  const Node* producer(ValueId id, std::string_view op = {}) const;
  int32_t index_of(const Node& node) const;
  bool taken(size_t node) const { return taken_[node]; }
  // The only node reading `id` (once, in one input slot), when `id` is not a graph output and that node is not
  // yet part of a match; (unless `op` is empty) it must be of that op.
  const Node* sole_consumer(ValueId id, std::string_view op = {}) const;
  // Nothing outside `pattern` (node indices) reads `id`, and it is not a graph output.
  bool absorbable(ValueId id, std::span<const int32_t> pattern) const;

  // Replaces the nodes of `pattern` by one node of `op` reading `inputs`, at the position of the last pattern
  // node, with its name and writing its (single) output. Attributes get the op's defaults. Returns false and changes
  // nothing when a node is already taken or the op's shape inference rejects the inputs or disagrees with the shape of
  // the value it would write.
  bool replace(std::span<const int32_t> pattern, const std::string& op, Attrs attrs, std::vector<ValueId> inputs);

  size_t replaced() const { return replaced_; }
  // Removes the replaced nodes, and notes "<count> <what>" under `pass` when anything fused.
  void finish(PassContext& context, const std::string& pass, const std::string& what);

 private:
  Graph& graph_;
  std::vector<std::vector<int32_t>> consumers_;
  std::vector<int32_t> uses_;
  std::vector<bool> taken_;
  std::vector<bool> remove_;
  size_t replaced_ = 0;
};

// A binary op's scalar operand: the node has one tensor input and the attribute holds a number.
std::optional<double> scalar_attr(const Node& node, const char* name = "other");
// add/sub with alpha == 1 (the default).
bool unit_alpha(const Node& node);
// The input of a two-input node that is not `known` (the second one when both are `known`).
ValueId other_input(const Node& node, ValueId known);
// Whether `node` is an activation that fused_conv2d and fused_batch_norm can end with (one input).
bool fusable_activation(const Node& node);
// Names `activation` (see fusable_activation) in a fused node's attributes, with its parameters.
void set_activation(Attrs& attrs, const Node& activation);
// `dim` (possibly negative) names the last of `rank` dims.
bool is_last_dim(int64_t dim, size_t rank);

}  // namespace npusim::compiler
