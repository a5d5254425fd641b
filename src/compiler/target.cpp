#include "compiler/target.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_text.h"

namespace npusim::compiler {

namespace {

// The built-in targets. A target is data: these could equally live in files.
const std::map<std::string, const char*> kBuiltinTargets = {
    {"cpu", R"({"name": "cpu", "backend": "cpu", "alignment": 64, "max_rank": 8,
               "compute_dtypes": ["float32", "float16", "bfloat16"], "ops": "*", "memory_bytes": 0,
               "fallback": ""})"},
    {"cuda", R"({"name": "cuda", "backend": "cuda", "alignment": 256, "max_rank": 8,
                "compute_dtypes": ["float32", "float16", "bfloat16"], "ops": "*", "memory_bytes": 0,
                "fallback": "cpu"})"},
};

}  // namespace

Target parse_target(const std::string& json_text, const std::string& source) {
  const nlohmann::json root = parse_json_text(json_text, source);
  if (!root.is_object()) fail(source + ": a target must be a JSON object");
  Target target;
  auto field = [&](const char* key) -> const nlohmann::json* { return root.contains(key) ? &root[key] : nullptr; };
  // get<int64_t>() of a float like 1e300 would be an undefined conversion: integers only.
  auto integer = [&](const nlohmann::json& value, const char* key) -> int64_t {
    if (!value.is_number_integer()) fail(source + ": '" + key + "' must be an integer, got " + value.dump());
    return value.get<int64_t>();
  };
  try {
    if (auto* v = field("name")) target.name = v->get<std::string>();
    if (auto* v = field("backend")) target.backend = v->get<std::string>();
    if (auto* v = field("alignment")) target.alignment = integer(*v, "alignment");
    if (auto* v = field("max_rank"))
      target.max_rank = static_cast<int>(std::clamp<int64_t>(integer(*v, "max_rank"), 0, 64));
    if (auto* v = field("memory_bytes")) target.memory_bytes = integer(*v, "memory_bytes");
    if (auto* v = field("fallback")) target.fallback = v->get<std::string>();
    if (auto* v = field("compute_dtypes")) {
      target.compute_dtypes.clear();
      for (const auto& name : *v) {
        auto dtype = parse_dtype(name.get<std::string>());
        if (!dtype || !is_floating(*dtype))
          fail(source + ": 'compute_dtypes' has an unknown float dtype " + name.dump());
        target.compute_dtypes.push_back(*dtype);
      }
    }
    if (auto* v = field("ops")) {
      if (v->is_string()) {
        if (v->get<std::string>() != "*") fail(source + ": 'ops' must be \"*\" or a list of canonical op names");
        target.all_ops = true;
      } else {
        target.all_ops = false;
        for (const auto& op : *v) target.ops.insert(op.get<std::string>());
      }
    }
  } catch (const nlohmann::json::exception& error) {
    fail(source + ": wrong field type (" + std::string(error.what()) + ")");
  }
  if (target.name.empty()) fail(source + ": missing field 'name'");
  if (target.alignment <= 0 || (target.alignment & (target.alignment - 1)) != 0)
    fail(source + ": 'alignment' must be a power of two, got " + std::to_string(target.alignment));
  if (target.max_rank < 1) fail(source + ": 'max_rank' must be at least 1");
  return target;
}

std::vector<std::string> builtin_target_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : kBuiltinTargets) names.push_back(name);
  return names;
}

Target load_target(const std::string& name_or_path) {
  if (auto it = kBuiltinTargets.find(name_or_path); it != kBuiltinTargets.end())
    return parse_target(it->second, "built-in target '" + name_or_path + "'");
  std::ifstream file(name_or_path);
  if (!file) {
    std::string names;
    for (const auto& name : builtin_target_names()) names += (names.empty() ? "" : ", ") + name;
    fail("unknown target '" + name_or_path + "' (built-in targets: " + names + "; or a path to a target JSON file)");
  }
  std::stringstream text;
  text << file.rdbuf();
  return parse_target(text.str(), name_or_path);
}

std::vector<Violation> check_target(const Graph& graph, const Target& target, DType compute_dtype,
                                    int64_t planned_bytes) {
  std::vector<Violation> violations;
  bool dtype_ok = false;
  for (DType dtype : target.compute_dtypes) dtype_ok = dtype_ok || dtype == compute_dtype;
  if (!dtype_ok)
    violations.push_back({"", "", "compute dtype " + std::string(dtype_name(compute_dtype)) + " is not supported"});
  for (const Node& node : graph.nodes) {
    if (!node.def) {
      violations.push_back({node.name, node.source_op, "op is unknown to npusim"});
      continue;
    }
    if (!target.supports_op(node.op))
      violations.push_back(
          {node.name, node.op, "op is not supported by target '" + target.name + "'", !target.fallback.empty()});
    for (ValueId id : node.outputs) {
      const Value& value = graph.value(id);
      if (static_cast<int>(value.meta.shape.size()) > target.max_rank)
        violations.push_back({node.name, node.op,
                              "output '" + value.name + "' has rank " + std::to_string(value.meta.shape.size()) +
                                  ", above the target's maximum " + std::to_string(target.max_rank)});
    }
  }
  if (target.memory_bytes > 0 && planned_bytes > target.memory_bytes)
    violations.push_back({"", "",
                          "the program needs " + std::to_string(planned_bytes) + " bytes, the target has " +
                              std::to_string(target.memory_bytes)});
  return violations;
}

}  // namespace npusim::compiler
