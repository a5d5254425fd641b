#pragma once
#include <string>
#include <string_view>

#include "npusim/graph.h"

namespace npusim {

// Limits on what a graph may declare, checked before anything is allocated.
constexpr int kMaxRank = 8;
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
constexpr int64_t kMaxIrFileBytes = int64_t{1} << 30;

// Reads a torch_ir JSON file into a validated graph: every node's inputs exist and come earlier, attributes
// have their defaults and types, and inferred shapes agree with the IR. Ops the registry does not know stay
// as opaque nodes (see Graph::unsupported_ops). Errors name the file, the node and the field.
Graph read_torch_ir(const std::string& path);
Graph parse_torch_ir(std::string_view text, const std::string& source_name);

}  // namespace npusim
