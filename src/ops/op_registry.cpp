#include "npusim/op_registry.h"

#include <mutex>

#include "kernel_api/custom_ops.h"
#include "npusim/error.h"

namespace npusim {

const OpRegistry& OpRegistry::instance() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_elementwise_ops(r);
    register_reduction_ops(r);
    register_nn_ops(r);
    register_linalg_ops(r);
    register_shape_ops(r);
    register_index_ops(r);
    register_creation_ops(r);
    register_misc_ops(r);
    register_fused_ops(r);
    return r;
  }();
  return registry;
}

void OpRegistry::add(OpDef def) {
  if (ops_.count(def.name)) fail("op '" + def.name + "' registered twice");
  for (size_t i = 0; i < def.spellings.size(); ++i) {
    const std::string& spelling = def.spellings[i].op_type;
    if (spellings_.count(spelling)) fail("ATen spelling '" + spelling + "' registered twice");
    spellings_[spelling] = {def.name, i};
  }
  std::string name = def.name;
  ops_.emplace(std::move(name), std::move(def));
}

const OpDef* OpRegistry::find(const std::string& canonical_name) const {
  auto it = ops_.find(canonical_name);
  return it == ops_.end() ? find_custom_op(canonical_name) : &it->second;
}

std::pair<const OpDef*, const AtenSpelling*> OpRegistry::find_spelling(const std::string& op_type) const {
  auto it = spellings_.find(op_type);
  if (it == spellings_.end()) return find_custom_spelling(op_type);
  const OpDef* def = find(it->second.first);
  return {def, &def->spellings[it->second.second]};
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> defs;
  for (const auto& [name, def] : ops_) defs.push_back(&def);
  for (const OpDef* def : custom_ops()) defs.push_back(def);
  return defs;
}

namespace {

bool matches(AttrType type, const AttrValue& value) {
  switch (type) {
    case AttrType::Int:
      return std::holds_alternative<int64_t>(value) || std::holds_alternative<bool>(value);
    case AttrType::Float:
    case AttrType::Scalar:
      return std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value) ||
             std::holds_alternative<bool>(value);
    case AttrType::Bool: return std::holds_alternative<bool>(value) || std::holds_alternative<int64_t>(value);
    case AttrType::String: return std::holds_alternative<std::string>(value);
    case AttrType::Ints:
      return std::holds_alternative<std::vector<int64_t>>(value) || std::holds_alternative<int64_t>(value) ||
             (std::holds_alternative<std::vector<double>>(value) && std::get<std::vector<double>>(value).empty());
    case AttrType::Floats:
      return std::holds_alternative<std::vector<double>>(value) ||
             std::holds_alternative<std::vector<int64_t>>(value);
    case AttrType::DTypeName:
      return std::holds_alternative<std::string>(value) &&
             parse_dtype(std::get<std::string>(value)).has_value();
  }
  return false;
}

const char* type_name(AttrType type) {
  switch (type) {
    case AttrType::Int: return "an integer";
    case AttrType::Float: return "a number";
    case AttrType::Scalar: return "a number";
    case AttrType::Bool: return "a boolean";
    case AttrType::String: return "a string";
    case AttrType::Ints: return "a list of integers";
    case AttrType::Floats: return "a list of numbers";
    case AttrType::DTypeName: return "a dtype name such as \"torch.float32\"";
  }
  return "?";
}

}  // namespace

void OpRegistry::normalize_attrs(const OpDef& def, const AtenSpelling* spelling, Attrs& attrs,
                                 const std::string& where) const {
  if (spelling) {
    for (const auto& [from, to] : spelling->rename) {
      if (!attrs.has(from)) continue;
      AttrValue moved = attrs.get(from);
      attrs.erase(from);
      attrs.set(to, std::move(moved));
    }
    for (const auto& [name, value] : spelling->fixed) attrs.set(name, value);
  }
  for (const AttrSpec& spec : def.attrs) {
    if (!attrs.has(spec.name)) {
      if (spec.default_value) {
        attrs.set(spec.name, *spec.default_value);
      } else if (spec.required) {
        fail(where + ": missing attribute '" + spec.name + "'");
      }
      continue;
    }
    const AttrValue& value = attrs.get(spec.name);
    if (std::holds_alternative<NoneValue>(value)) {
      if (spec.required && !spec.default_value) fail(where + ": attribute '" + spec.name + "' must not be null");
      if (spec.default_value) attrs.set(spec.name, *spec.default_value);
      continue;
    }
    if (!matches(spec.type, value))
      fail(where + ": attribute '" + spec.name + "' must be " + type_name(spec.type) + ", got " +
           attr_value_string(value));
  }
}

}  // namespace npusim
