#include "runtime/state_pairs.h"

#include "compiler/graph_edit.h"
#include "npusim/error.h"

namespace npusim {

ValueId find_graph_io(const Graph& graph, const std::vector<ValueId>& ids, const std::string& name, const char* what) {
  for (ValueId id : ids)
    if (graph.value(id).name == name) return id;
  fail(graph.source + ": no graph " + what + " named '" + name + "'");
}

std::vector<StatePair> check_state_pairs(const Graph& graph, const compiler::MemoryPlan& plan,
                                         const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                                         const std::function<bool(ValueId, ValueId)>& same_storage,
                                         const std::function<bool(const std::string&)>& is_state_input) {
  const std::vector<std::vector<int32_t>> readers = compiler::consumers(graph);
  std::vector<StatePair> pairs;
  for (const auto& [input_name, output_name] : input_output_pairs) {
    const ValueId input = find_graph_io(graph, graph.inputs, input_name, "input");
    const ValueId output = find_graph_io(graph, graph.outputs, output_name, "output");
    const std::string label = "state '" + input_name + "' -> '" + output_name + "'";
    bool repeated = is_state_input(input_name);
    for (const StatePair& pair : pairs) repeated = repeated || pair.input == input || pair.output == output;
    if (repeated) fail(graph.source + ": " + label + ": the input or the output is already state");
    if (graph.value(input).meta.shape != graph.value(output).meta.shape || !same_storage(input, output))
      fail(graph.source + ": " + label + ": the input " + shape_string(graph.value(input).meta.shape) +
           " and the output " + shape_string(graph.value(output).meta.shape) + " differ in shape or storage");
    const int32_t producer = graph.value(output).producer;
    if (graph.value(output).kind != ValueKind::NodeOutput || producer < 0 ||
        plan.values[static_cast<size_t>(output)].placement == compiler::Placement::View)
      fail(graph.source + ": " + label + ": the output is not computed by a kernel of its own");
    for (int32_t reader : readers[static_cast<size_t>(input)])
      if (reader != producer)
        fail(graph.source + ": " + label + ": node '" + graph.nodes[static_cast<size_t>(reader)].name +
             "' reads the input too, so it cannot be updated in place");
    pairs.push_back({input_name, input, output, label});
  }
  return pairs;
}

}  // namespace npusim
