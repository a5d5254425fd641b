#include "npusim/graph.h"

#include <map>

namespace npusim {

std::optional<ValueId> Graph::find_value(const std::string& name) const {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].name == name) return static_cast<ValueId>(i);
  return std::nullopt;
}

std::vector<std::string> Graph::unsupported_ops() const {
  std::map<std::string, std::vector<std::string>> users;
  for (const Node& node : nodes)
    if (!node.def) users[node.source_op].push_back(node.name);
  std::vector<std::string> lines;
  for (const auto& [op, names] : users) {
    std::string line = op + " (" + std::to_string(names.size()) + (names.size() == 1 ? " node: " : " nodes: ");
    for (size_t i = 0; i < names.size(); ++i) line += (i ? ", " : "") + names[i];
    lines.push_back(line + ")");
  }
  return lines;
}

}  // namespace npusim
