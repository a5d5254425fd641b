#include "runtime/coverage.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backends/cuda/kernel_op_names.h"
#include "core/json_text.h"
#include "npusim/op_registry.h"
#include "runtime/backend.h"

namespace npusim {

namespace {

// The built-in declarations. The CPU backend's dedicated kernels come from its capabilities; the CUDA backend's
// from its kernel list (the same in builds without the CUDA toolkit, where only running on it fails). The CUDA
// backend runs every other op on the host, on the registry's reference.
const std::map<std::string, const char*> kBuiltinCoverage = {
    {"cpu", R"({"backend": "cpu", "compute_dtypes": ["float32", "float16", "bfloat16"], "dtypes": "*", "ops": "*"})"},
    {"cuda", R"({"backend": "cuda", "compute_dtypes": ["float32", "float16", "bfloat16"], "dtypes": "*", "ops": "*"})"},
    {"reference", R"({"backend": "reference", "compute_dtypes": ["float32"], "dtypes": "*", "ops": "*"})"},
};

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

bool contains(const std::vector<DType>& dtypes, DType dtype) {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

std::vector<DType> parse_dtype_list(const nlohmann::json& list, const std::string& where) {
  if (list.is_string() && list.get<std::string>() == "*") return {};
  if (!list.is_array()) fail(where + " must be \"*\" or a list of dtype names");
  std::vector<DType> dtypes;
  for (const auto& name : list) {
    const auto dtype = name.is_string() ? parse_dtype(name.get<std::string>()) : std::nullopt;
    if (!dtype) fail(where + " has an unknown dtype " + name.dump());
    dtypes.push_back(*dtype);
  }
  return dtypes;
}

AttrRange parse_range(const std::string& name, const nlohmann::json& bounds, const std::string& where) {
  AttrRange range;
  range.name = name;
  if (!bounds.is_object()) fail(where + ": the range of '" + name + "' must be an object with 'min' and/or 'max'");
  for (const auto& [key, bound] : bounds.items()) {
    if (!bound.is_number()) fail(where + ": '" + name + "." + key + "' must be a number");
    if (key == "min")
      range.min = bound.get<double>();
    else if (key == "max")
      range.max = bound.get<double>();
    else
      fail(where + ": the range of '" + name + "' has an unknown field '" + key + "'");
  }
  if (range.min > range.max) fail(where + ": the range of '" + name + "' is empty");
  return range;
}

OpCoverage op_named(std::string name) {
  OpCoverage op;
  op.op = std::move(name);
  return op;
}

OpCoverage parse_op_entry(const nlohmann::json& entry, const std::string& source) {
  if (entry.is_string()) return op_named(entry.get<std::string>());
  if (!entry.is_object() || !entry.contains("op") || !entry["op"].is_string())
    fail(source + ": each entry of 'ops' must be an op name or an object with an 'op' name");
  OpCoverage op = op_named(entry["op"].get<std::string>());
  const std::string where = source + ": op '" + op.op + "'";
  for (const auto& [key, value] : entry.items()) {
    if (key == "op") continue;
    if (key == "dtypes") {
      op.dtypes = parse_dtype_list(value, where + " 'dtypes'");
    } else if (key == "attrs") {
      if (!value.is_object()) fail(where + ": 'attrs' must be an object of ranges");
      for (const auto& [name, bounds] : value.items()) op.attrs.push_back(parse_range(name, bounds, where));
    } else {
      fail(where + " has an unknown field '" + key + "'");
    }
  }
  return op;
}

// An attribute outside its range, described, or nothing.
std::optional<std::string> attr_outside(const Attrs& attrs, const AttrRange& range) {
  if (!attrs.has(range.name)) return std::nullopt;
  std::vector<double> values;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
          values.push_back(static_cast<double>(v));
        else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>)
          for (auto element : v) values.push_back(static_cast<double>(element));
      },
      attrs.get(range.name));
  for (double value : values)
    if (!(value >= range.min && value <= range.max))
      return "attribute " + range.name + " = " + attr_value_string(attrs.get(range.name)) + " is outside " +
             range.describe();
  return std::nullopt;
}

std::string dtype_list(const std::vector<DType>& dtypes) {
  if (dtypes.empty()) return "any";
  std::string text;
  for (DType dtype : dtypes) text += (text.empty() ? "" : ", ") + std::string(dtype_name(dtype));
  return text;
}

// "kernel", "generic", with the op's own limits: "kernel (float32; dim in [-1, -1])"; "-" when not covered.
std::string coverage_cell(const BackendCoverage& backend, const std::string& op_name) {
  const OpCoverage* op = backend.find(op_name);
  if (!op) return "-";
  std::string limits = op->dtypes.empty() ? "" : dtype_list(op->dtypes);
  for (const AttrRange& range : op->attrs) limits += (limits.empty() ? "" : "; ") + range.describe();
  return std::string(op->kernel ? "kernel" : "generic") + (limits.empty() ? "" : " (" + limits + ")");
}

std::string target_cell(const compiler::Target& target, const BackendCoverage& on_target,
                        const BackendCoverage* fallback, const std::string& op) {
  if (target.supports_op(op) && on_target.find(op)) return "yes";
  if (fallback && fallback->find(op)) return "fallback " + fallback->backend;
  return "no";
}

size_t kernel_count(const BackendCoverage& backend) {
  size_t count = 0;
  for (const auto& [name, op] : backend.ops) count += op.kernel;
  return count;
}

}  // namespace

std::string AttrRange::describe() const {
  const bool has_min = std::isfinite(min), has_max = std::isfinite(max);
  if (has_min && has_max) return name + " in [" + format_number(min) + ", " + format_number(max) + "]";
  if (has_min) return name + " >= " + format_number(min);
  if (has_max) return name + " <= " + format_number(max);
  return name + " any";
}

DType stored_dtype(DType dtype, DType compute_dtype) { return is_floating(dtype) ? compute_dtype : dtype; }

const OpCoverage* BackendCoverage::find(const std::string& op) const {
  auto it = ops.find(op);
  return it == ops.end() ? nullptr : &it->second;
}

bool BackendCoverage::supports_compute_dtype(DType compute_dtype) const {
  return contains(compute_dtypes, compute_dtype);
}

std::optional<std::string> BackendCoverage::unsupported_reason(const Graph& graph, const Node& node,
                                                               DType compute_dtype) const {
  const OpCoverage* op = find(node.op);
  if (!op) return "backend '" + backend + "' has no kernel for op '" + node.op + "'";
  if (!supports_compute_dtype(compute_dtype))
    return "backend '" + backend + "' does not store activations as " + std::string(dtype_name(compute_dtype));
  const std::vector<DType>& allowed = op->dtypes.empty() ? dtypes : op->dtypes;
  if (!allowed.empty()) {
    auto check = [&](ValueId id) -> std::optional<std::string> {
      const DType stored = stored_dtype(graph.value(id).meta.dtype, compute_dtype);
      if (contains(allowed, stored)) return std::nullopt;
      return "backend '" + backend + "' does not run '" + node.op + "' on " + std::string(dtype_name(stored)) + " ('" +
             graph.value(id).name + "')";
    };
    for (const auto* ids : {&node.inputs, &node.outputs})
      for (ValueId id : *ids)
        if (auto reason = check(id)) return reason;
  }
  for (const AttrRange& range : op->attrs)
    if (auto reason = attr_outside(node.attrs, range))
      return "backend '" + backend + "' runs '" + node.op + "' only with " + range.describe() + ": " + *reason;
  return std::nullopt;
}

BackendCoverage parse_coverage(const std::string& json_text, const std::string& source) {
  const nlohmann::json root = parse_json_text(json_text, source);
  if (!root.is_object()) fail(source + ": a coverage must be a JSON object");
  for (const auto& [key, value] : root.items())
    if (key != "backend" && key != "compute_dtypes" && key != "dtypes" && key != "ops")
      fail(source + ": unknown field '" + key + "'");
  if (!root.contains("backend") || !root["backend"].is_string()) fail(source + ": missing string field 'backend'");
  BackendCoverage coverage;
  coverage.backend = root["backend"].get<std::string>();
  coverage.compute_dtypes = {DType::Float32};
  if (root.contains("compute_dtypes")) {
    coverage.compute_dtypes = parse_dtype_list(root["compute_dtypes"], source + ": 'compute_dtypes'");
    for (DType dtype : coverage.compute_dtypes)
      if (!is_floating(dtype) || dtype == DType::Float64)
        fail(source + ": 'compute_dtypes' must be float32, float16 or bfloat16, got " + std::string(dtype_name(dtype)));
  }
  if (root.contains("dtypes")) coverage.dtypes = parse_dtype_list(root["dtypes"], source + ": 'dtypes'");
  const nlohmann::json ops = root.contains("ops") ? root["ops"] : nlohmann::json::array();
  if (ops.is_string() && ops.get<std::string>() == "*") {
    for (const OpDef* def : OpRegistry::instance().all()) coverage.ops[def->name] = op_named(def->name);
  } else if (ops.is_array()) {
    for (const auto& entry : ops) {
      OpCoverage op = parse_op_entry(entry, source);
      if (!OpRegistry::instance().find(op.op)) fail(source + ": unknown op '" + op.op + "'");
      if (coverage.ops.count(op.op)) fail(source + ": op '" + op.op + "' is listed twice");
      coverage.ops[op.op] = std::move(op);
    }
  } else {
    fail(source + ": 'ops' must be \"*\" or a list of ops");
  }
  return coverage;
}

BackendCoverage coverage_from_capabilities(const BackendCapabilities& capabilities) {
  BackendCoverage coverage;
  coverage.backend = capabilities.name;
  coverage.compute_dtypes = capabilities.compute_dtypes;
  for (const OpDef* def : OpRegistry::instance().all()) {
    OpCoverage op = op_named(def->name);
    op.kernel = capabilities.has_kernel(def->name);
    if (op.kernel || capabilities.reference_fallback) coverage.ops[def->name] = std::move(op);
  }
  return coverage;
}

BackendCoverage backend_coverage(const std::string& backend) {
  auto it = kBuiltinCoverage.find(backend);
  if (it == kBuiltinCoverage.end()) {
    std::unique_ptr<Backend> made;
    try {
      made = make_backend(backend);
    } catch (const Error&) {
      std::string names;
      for (const std::string& name : coverage_backend_names()) names += (names.empty() ? "" : ", ") + name;
      fail("unknown backend '" + backend + "' (backends: " + names + ")");
    }
    return coverage_from_capabilities(made->capabilities());
  }
  BackendCoverage coverage = parse_coverage(it->second, "built-in coverage of '" + backend + "'");
  if (backend == "reference") {
    for (auto& [name, op] : coverage.ops) op.kernel = true;  // its kernels are the reference implementations
    return coverage;
  }
  if (backend == "cuda") {
    for (auto& [name, op] : coverage.ops)
      op.kernel =
          std::find(cuda::kKernelOpNames.begin(), cuda::kKernelOpNames.end(), name) != cuda::kKernelOpNames.end();
    return coverage;
  }
  const BackendCapabilities capabilities = make_backend(backend)->capabilities();
  for (auto& [name, op] : coverage.ops) op.kernel = capabilities.has_kernel(name);
  return coverage;
}

std::vector<BackendCoverage> builtin_coverages() {
  std::vector<BackendCoverage> coverages;
  for (const std::string& name : coverage_backend_names()) coverages.push_back(backend_coverage(name));
  return coverages;
}

std::string format_coverage_table(const std::vector<BackendCoverage>& backends, const compiler::Target* target) {
  std::string text = "backends:\n";
  char line[512];
  for (const BackendCoverage& backend : backends) {
    std::snprintf(line, sizeof line, "  %-10s compute %s; values %s; %zu ops, %zu with a dedicated kernel\n",
                  backend.backend.c_str(), dtype_list(backend.compute_dtypes).c_str(),
                  dtype_list(backend.dtypes).c_str(), backend.ops.size(), kernel_count(backend));
    text += line;
  }
  std::optional<BackendCoverage> on_target, fallback;
  if (target) {
    on_target = backend_coverage(target->backend);
    if (!target->fallback.empty()) fallback = backend_coverage(target->fallback);
    text += "target " + target->name + ": backend " + target->backend + ", " +
            (target->all_ops ? std::string("every op") : std::to_string(target->ops.size()) + " ops") + ", fallback " +
            (target->fallback.empty() ? std::string("none") : target->fallback) + "\n";
  }
  text += "\n";
  std::snprintf(line, sizeof line, "%-26s", "op");
  text += line;
  for (const BackendCoverage& backend : backends) {
    std::snprintf(line, sizeof line, " %-12s", backend.backend.c_str());
    text += line;
  }
  if (target) text.append(" ").append(target->name);
  while (!text.empty() && text.back() == ' ') text.pop_back();
  text += "\n";
  for (const OpDef* def : OpRegistry::instance().all()) {
    std::snprintf(line, sizeof line, "%-26s", def->name.c_str());
    text += line;
    for (const BackendCoverage& backend : backends) {
      std::snprintf(line, sizeof line, " %-12s", coverage_cell(backend, def->name).c_str());
      text += line;
    }
    if (target) text.append(" ").append(target_cell(*target, *on_target, fallback ? &*fallback : nullptr, def->name));
    while (!text.empty() && text.back() == ' ') text.pop_back();
    text += "\n";
  }
  return text;
}

std::string coverage_markdown(const std::vector<BackendCoverage>& backends) {
  std::string text =
      "# Op coverage\n\n"
      "Generated by `npusim ops --markdown > docs/ops.md` from the coverage each backend declares "
      "(`src/runtime/coverage.cpp`); do not edit by hand.\n\n"
      "A target runs an op on its backend when the target lists it and the backend covers it (dtypes and "
      "attribute ranges included), and on its fallback backend otherwise; `npusim ops --target T` shows where "
      "each op of a target runs. \"kernel\": the backend has a dedicated kernel; \"generic\": its generic kernel "
      "runs the registry's reference implementation on converted copies.\n\n"
      "## Backends\n\n"
      "| backend | compute dtypes | value dtypes | ops | dedicated kernels |\n"
      "|---|---|---|---|---|\n";
  for (const BackendCoverage& backend : backends)
    text += "| " + backend.backend + " | " + dtype_list(backend.compute_dtypes) + " | " + dtype_list(backend.dtypes) +
            " | " + std::to_string(backend.ops.size()) + " | " + std::to_string(kernel_count(backend)) + " |\n";
  text += "\n## Ops\n\n| op | ATen spellings |";
  for (const BackendCoverage& backend : backends) text += " " + backend.backend + " |";
  text += "\n|---|---|";
  for (size_t i = 0; i < backends.size(); ++i) text += "---|";
  text += "\n";
  for (const OpDef* def : OpRegistry::instance().all()) {
    std::string spellings;
    for (const AtenSpelling& spelling : def->spellings)
      spellings += (spellings.empty() ? "" : ", ") + std::string("`") + spelling.op_type + "`";
    text += "| `" + def->name + "` | " + (spellings.empty() ? "(created by the compiler)" : spellings) + " |";
    for (const BackendCoverage& backend : backends)
      text.append(" ").append(coverage_cell(backend, def->name)).append(" |");
    text += "\n";
  }
  return text;
}

std::vector<std::string> coverage_backend_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : kBuiltinCoverage) names.push_back(name);
  return names;
}

}  // namespace npusim
