#pragma once
// Small editing primitives the compiler passes share. Passes keep nodes in topological order.
#include <string>
#include <vector>

#include "npusim/graph.h"

namespace npusim::compiler {

// Node indices reading each value (by ValueId), in node order.
std::vector<std::vector<int32_t>> consumers(const Graph& graph);
bool is_graph_output(const Graph& graph, ValueId id);
// Number of node inputs plus graph outputs naming each value.
std::vector<int32_t> use_counts(const Graph& graph);

// Every use of `from` (node inputs and graph outputs) now reads `to`.
void replace_uses(Graph& graph, ValueId from, ValueId to);

// Removes the nodes at the given indices and every node whose outputs nobody reads (all ops are pure), then
// renumbers producers.
void remove_nodes(Graph& graph, const std::vector<bool>& remove);
void remove_dead_nodes(Graph& graph);

ValueId add_value(Graph& graph, std::string name, TensorMeta meta, ValueKind kind);
// A weight whose data lives in graph.constants under `key` (folded at compile time).
ValueId add_constant(Graph& graph, const std::string& key, Tensor data);
// A weight computed at load time from other weights.
ValueId add_derived_weight(Graph& graph, const std::string& name, TensorMeta meta, WeightTransform transform);

// A node of a registered canonical op; outputs are fresh values with the given metas.
Node make_node(Graph& graph, const std::string& op, const std::string& name, Attrs attrs, std::vector<ValueId> inputs,
               const std::vector<TensorMeta>& output_metas, const std::vector<std::string>& output_names);

// Inserts `node` at `position`, shifting later nodes, and fixes producer indices.
void insert_node(Graph& graph, size_t position, Node node);
void renumber_producers(Graph& graph);

// Fails when a node reads a value before it is produced or a graph output has no producer.
void check_graph(const Graph& graph, const std::string& after_pass);

// A name not yet used by any value.
std::string unique_value_name(const Graph& graph, const std::string& base);

}  // namespace npusim::compiler
