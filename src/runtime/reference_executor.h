#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Fails with one message listing every op the registry does not know and the nodes that use it.
void check_supported(const Graph& graph);

// Checks user inputs against the graph's inputs: every name known and given, shapes equal, dtype of the same
// kind (floats may differ in width). Returns them in graph-input order, converted to the reference domain.
std::vector<Tensor> check_inputs(const Graph& graph, const std::map<std::string, Tensor>& inputs);
// The user's tensor for graph input `id`, its shape equal and its dtype of the same kind as the graph's; null when
// it is not given and `may_omit` (an input a backend keeps as state), else an error.
const Tensor* checked_input(const Graph& graph, const std::map<std::string, Tensor>& inputs, ValueId id,
                            bool may_omit = false);

// Runs a graph node by node with the registry's reference implementations (fp32 floats, int64 integers).
// Intermediate values are released after their last use.
class ReferenceExecutor {
 public:
  ReferenceExecutor(const Graph& graph, const std::vector<std::pair<ValueId, Tensor>>& weights);

  // Called after each node with its outputs (for verification tools).
  using NodeObserver = std::function<void(const Node& node, const std::vector<Tensor>& outputs)>;

  NamedTensors run(const std::map<std::string, Tensor>& inputs, const NodeObserver& observer = {}) const;

 private:
  const Graph& graph_;
  std::vector<Tensor> weights_;    // by ValueId; undefined where not a weight
  std::vector<int32_t> last_use_;  // by ValueId: index of the last node reading it, or nodes.size() for outputs
};

}  // namespace npusim
