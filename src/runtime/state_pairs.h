#pragma once
// The checks every backend makes when it keeps state between runs (PreparedProgram::bind_state), in one place.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/memory_plan.h"
#include "npusim/graph.h"

namespace npusim {

// The graph input or output named `name`; fails naming the graph when there is none (`what`: "input"/"output").
ValueId find_graph_io(const Graph& graph, const std::vector<ValueId>& ids, const std::string& name, const char* what);

struct StatePair {
  std::string input_name;
  ValueId input = kNoValue;
  ValueId output = kNoValue;
  std::string label;  // "state 'IN' -> 'OUT'", for messages
};

// Checks input/output name pairs for in-place state: each names a graph input and a graph output of the same shape
// and storage (`same_storage`), neither already state (`is_state_input` for earlier bindings, and the other pairs),
// the output computed by a node of its own (not a view in `plan`), and no node other than that producer reads the
// input. Fails naming the graph and the pair.
std::vector<StatePair> check_state_pairs(const Graph& graph, const compiler::MemoryPlan& plan,
                                         const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                                         const std::function<bool(ValueId, ValueId)>& same_storage,
                                         const std::function<bool(const std::string&)>& is_state_input);

}  // namespace npusim
