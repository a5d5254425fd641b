// The torch_ir JSON reader through graph validation and shape inference. Errors (npusim::Error) are the
// expected answer to bad input; anything else, a sanitizer report or a broken graph invariant, is a finding.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "ir/torch_ir_reader.h"
#include "npusim/error.h"

using npusim::fuzz::require;

namespace {

// What later stages rely on: every node reads values defined before it, and shapes stay within the limits.
void check_graph(const npusim::Graph& graph) {
  const auto value_count = graph.values.size();
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (npusim::ValueId id : graph.nodes[n].inputs) {
      require(id >= 0 && static_cast<size_t>(id) < value_count);
      const npusim::Value& value = graph.value(id);
      require(value.kind != npusim::ValueKind::NodeOutput || static_cast<size_t>(value.producer) < n);
    }
    for (npusim::ValueId id : graph.nodes[n].outputs) require(id >= 0 && static_cast<size_t>(id) < value_count);
  }
  for (const npusim::Value& value : graph.values) {
    require(value.meta.shape.size() <= static_cast<size_t>(npusim::kMaxRank));
    require(npusim::shape_numel(value.meta.shape) <= npusim::kMaxTensorElements);
  }
  for (npusim::ValueId id : graph.outputs) require(id >= 0 && static_cast<size_t>(id) < value_count);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const npusim::Graph graph =
        npusim::parse_torch_ir(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    check_graph(graph);
    graph.unsupported_ops();
  } catch (const npusim::Error&) {
  }
  return 0;
}
