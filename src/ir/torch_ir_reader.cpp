#include "ir/torch_ir_reader.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/json_text.h"
#include "npusim/op_registry.h"

namespace npusim {

namespace {

using json = nlohmann::json;

// Deeper nesting is refused while parsing: the walks over the tree (and dump() in messages) recurse.
std::string describe(const json& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) { graph_.source = source_; }

  Graph read(const json& root) {
    if (!root.is_object()) fail(source_ + ": top level must be a JSON object, got " + describe(root));
    for (const char* key : {"graph_inputs", "graph_outputs", "weights", "nodes"}) {
      if (!root.contains(key)) fail(source_ + ": missing top-level key '" + key + "'");
      if (!root[key].is_array()) fail(source_ + ": top-level key '" + key + "' must be a list");
    }
    graph_.model_name = optional_string(root, "model_name", "top level");
    graph_.pytorch_version = optional_string(root, "pytorch_version", "top level");
    read_inputs(root["graph_inputs"]);
    read_weights(root);
    read_constants(root);
    collect_node_output_names(root["nodes"]);
    const json& nodes = root["nodes"];
    for (size_t i = 0; i < nodes.size(); ++i) read_node(nodes[i], i);
    read_outputs(root["graph_outputs"]);
    return std::move(graph_);
  }

 private:
  std::string optional_string(const json& object, const char* key, const std::string& where) {
    if (!object.contains(key) || object[key].is_null()) return {};
    if (!object[key].is_string()) fail(source_ + ": " + where + ": field '" + key + "' must be a string");
    return object[key].get<std::string>();
  }

  std::string required_string(const json& object, const char* key, const std::string& where) {
    if (!object.is_object()) fail(source_ + ": " + where + " must be an object, got " + describe(object));
    if (!object.contains(key)) fail(source_ + ": " + where + ": missing field '" + key + "'");
    if (!object[key].is_string() || object[key].get<std::string>().empty())
      fail(source_ + ": " + where + ": field '" + key + "' must be a non-empty string");
    return object[key].get<std::string>();
  }

  TensorMeta read_meta(const json& entry, const std::string& where) {
    TensorMeta meta;
    if (!entry.contains("shape") || !entry["shape"].is_array())
      fail(source_ + ": " + where + ": field 'shape' must be a list of integers");
    const json& shape = entry["shape"];
    if (shape.size() > static_cast<size_t>(kMaxRank))
      fail(source_ + ": " + where + ": rank " + std::to_string(shape.size()) + " exceeds the maximum rank " +
           std::to_string(kMaxRank));
    int64_t elements = 1;
    for (const json& dim : shape) {
      if (!dim.is_number_integer())
        fail(source_ + ": " + where + ": field 'shape' must hold integers, got " + describe(dim));
      const int64_t d = dim.get<int64_t>();
      if (d < 0) fail(source_ + ": " + where + ": negative dimension " + std::to_string(d) + " in 'shape'");
      if (d > 0 && elements > kMaxTensorElements / d)
        fail(source_ + ": " + where + ": shape " + describe(shape) + " has more than 2^40 elements");
      elements *= d;
      meta.shape.push_back(d);
    }
    const std::string dtype = required_string(entry, "dtype", where);
    auto parsed = parse_dtype(dtype);
    if (!parsed) fail(source_ + ": " + where + ": unsupported dtype '" + dtype + "'");
    meta.dtype = *parsed;
    return meta;
  }

  ValueId add_value(Value value, const std::string& where) {
    if (by_name_.count(value.name))
      fail(source_ + ": " + where + ": tensor name '" + value.name + "' is defined twice");
    const auto id = static_cast<ValueId>(graph_.values.size());
    by_name_[value.name] = id;
    graph_.values.push_back(std::move(value));
    return id;
  }

  void read_inputs(const json& inputs) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string where = "graph_inputs[" + std::to_string(i) + "]";
      Value value;
      value.name = required_string(inputs[i], "name", where);
      value.meta = read_meta(inputs[i], where + " '" + value.name + "'");
      value.kind = ValueKind::GraphInput;
      graph_.inputs.push_back(add_value(std::move(value), where));
    }
  }

  void read_weights(const json& root) {
    std::map<std::string, std::string> placeholder_of;  // state_dict key -> placeholder
    if (root.contains("weight_name_mapping") && !root["weight_name_mapping"].is_null()) {
      const json& mapping = root["weight_name_mapping"];
      if (!mapping.is_object()) fail(source_ + ": 'weight_name_mapping' must be an object");
      for (const auto& [placeholder, key] : mapping.items()) {
        if (!key.is_string())
          fail(source_ + ": weight_name_mapping['" + placeholder + "'] must be a string, got " + describe(key));
        placeholder_of[key.get<std::string>()] = placeholder;
      }
    }
    const json& weights = root["weights"];
    for (size_t i = 0; i < weights.size(); ++i) {
      const std::string where = "weights[" + std::to_string(i) + "]";
      Value value;
      value.weight_key = required_string(weights[i], "name", where);
      value.meta = read_meta(weights[i], where + " '" + value.weight_key + "'");
      value.kind = ValueKind::Weight;
      auto placeholder = placeholder_of.find(value.weight_key);
      value.name = placeholder != placeholder_of.end() ? placeholder->second : value.weight_key;
      const ValueId id = add_value(value, where);
      if (value.name != value.weight_key && !by_name_.count(value.weight_key)) by_name_[value.weight_key] = id;
      graph_.weights.push_back(id);
    }
  }

  static void flatten_numbers(const json& data, std::vector<double>& out, Shape& shape, size_t depth,
                              const std::string& where) {
    if (data.is_array()) {
      if (shape.size() <= depth)
        shape.push_back(static_cast<int64_t>(data.size()));
      else if (shape[depth] != static_cast<int64_t>(data.size()))
        fail(where + ": ragged nested list");
      for (const json& item : data) flatten_numbers(item, out, shape, depth + 1, where);
      return;
    }
    if (data.is_boolean())
      out.push_back(data.get<bool>() ? 1.0 : 0.0);
    else if (data.is_number())
      out.push_back(data.get<double>());
    else
      fail(where + ": constant data must be numbers, got " + describe(data));
  }

  // Integer constants are converted from double: a value out of range (or NaN) would make that undefined.
  static bool fits_dtype(double value, DType dtype) {
    switch (dtype) {
      case DType::Int8:
        return value >= -128.0 && value <= 127.0;
      case DType::UInt8:
        return value >= 0.0 && value <= 255.0;
      case DType::Int16:
        return value >= -32768.0 && value <= 32767.0;
      case DType::Int32:
        return value >= -2147483648.0 && value <= 2147483647.0;
      case DType::Int64:
        return value >= -9223372036854775808.0 && value < 9223372036854775808.0;
      default:
        return true;
    }
  }

  void read_constants(const json& root) {
    if (!root.contains("constants") || root["constants"].is_null()) return;
    const json& constants = root["constants"];
    if (!constants.is_object()) fail(source_ + ": 'constants' must be an object");
    for (const auto& [name, entry] : constants.items()) {
      const std::string where = source_ + ": constants['" + name + "']";
      if (!entry.is_object() || !entry.contains("data")) fail(where + ": missing field 'data'");
      std::vector<double> numbers;
      Shape shape;
      flatten_numbers(entry["data"], numbers, shape, 0, where);
      DType dtype = DType::Float32;
      if (entry.contains("dtype")) {
        if (!entry["dtype"].is_string() || !parse_dtype(entry["dtype"].get<std::string>()))
          fail(where + ": unsupported dtype " + describe(entry["dtype"]));
        dtype = *parse_dtype(entry["dtype"].get<std::string>());
      }
      if (shape_numel(shape) != static_cast<int64_t>(numbers.size())) fail(where + ": ragged nested list");
      for (double number : numbers)
        if (!fits_dtype(number, dtype))
          fail(where + ": value " + json(number).dump() + " does not fit dtype " + std::string(dtype_name(dtype)));
      Tensor values(DType::Float64, shape);
      for (size_t i = 0; i < numbers.size(); ++i) values.mutable_data<double>()[i] = numbers[i];
      graph_.constants[name] = values.to(dtype);
    }
  }

  void collect_node_output_names(const json& nodes) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!nodes[i].is_object()) continue;
      if (nodes[i].contains("name") && nodes[i]["name"].is_string())
        later_nodes_.insert(nodes[i]["name"].get<std::string>());
      if (!nodes[i].contains("outputs") || !nodes[i]["outputs"].is_array()) continue;
      for (const json& output : nodes[i]["outputs"])
        if (output.is_object() && output.contains("name") && output["name"].is_string())
          later_outputs_.insert(output["name"].get<std::string>());
    }
  }

  AttrValue read_attr(const json& value, const std::string& where) {
    if (value.is_null()) return NoneValue{};
    if (value.is_boolean()) return value.get<bool>();
    if (value.is_number_unsigned()) {
      const auto u = value.get<uint64_t>();
      return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                            : static_cast<int64_t>(u);
    }
    if (value.is_number_integer()) return value.get<int64_t>();
    if (value.is_number_float()) return value.get<double>();
    if (value.is_string()) return value.get<std::string>();
    if (value.is_array()) {
      std::vector<json> flat;
      flatten_list(value, flat);
      bool all_ints = true, all_numbers = true, all_bools = true;
      for (const json& item : flat) {
        all_ints = all_ints && item.is_number_integer();
        all_numbers = all_numbers && item.is_number();
        all_bools = all_bools && item.is_boolean();
      }
      if (flat.empty() || all_ints) {
        std::vector<int64_t> ints;
        for (const json& item : flat) ints.push_back(std::get<int64_t>(read_attr(item, where)));
        return ints;
      }
      if (all_numbers) {
        std::vector<double> numbers;
        for (const json& item : flat) numbers.push_back(item.get<double>());
        return numbers;
      }
      if (all_bools) {
        std::vector<bool> bools;
        for (const json& item : flat) bools.push_back(item.get<bool>());
        return bools;
      }
    }
    return value.dump();  // kept as text; an op that needs it reports the type mismatch
  }

  static void flatten_list(const json& value, std::vector<json>& out) {
    for (const json& item : value) {
      if (item.is_array())
        flatten_list(item, out);
      else
        out.push_back(item);
    }
  }

  ValueId resolve_input(const json& entry, const std::string& where) {
    const std::string name = required_string(entry, "name", where);
    const TensorMeta meta = read_meta(entry, where + " '" + name + "'");
    ValueId id = kNoValue;
    if (entry.contains("producer_node") && !entry["producer_node"].is_null()) {
      if (!entry["producer_node"].is_string()) fail(source_ + ": " + where + ": 'producer_node' must be a string");
      const std::string producer = entry["producer_node"].get<std::string>();
      int64_t slot = 0;
      if (entry.contains("producer_output_idx") && !entry["producer_output_idx"].is_null()) {
        if (!entry["producer_output_idx"].is_number_integer())
          fail(source_ + ": " + where + ": 'producer_output_idx' must be an integer");
        slot = entry["producer_output_idx"].get<int64_t>();
      }
      auto node = node_index_.find(producer);
      if (node != node_index_.end()) {
        const Node& producer_node = graph_.nodes[node->second];
        if (slot < 0 || slot >= static_cast<int64_t>(producer_node.outputs.size()))
          fail(source_ + ": " + where + ": producer_output_idx " + std::to_string(slot) +
               " is out of range for node '" + producer + "' with " + std::to_string(producer_node.outputs.size()) +
               " outputs");
        id = producer_node.outputs[static_cast<size_t>(slot)];
      } else if (auto value = by_name_.find(producer);
                 value != by_name_.end() && graph_.value(value->second).kind == ValueKind::GraphInput) {
        id = value->second;
      } else if (later_nodes_.count(producer)) {
        fail(source_ + ": " + where + ": uses '" + name + "' from node '" + producer +
             "' before that node runs (nodes must be in topological order)");
      } else {
        fail(source_ + ": " + where + ": producer '" + producer + "' is neither a node nor a graph input");
      }
    } else {
      auto value = by_name_.find(name);
      if (value == by_name_.end()) {
        if (later_outputs_.count(name))
          fail(source_ + ": " + where + ": uses '" + name +
               "' before the node producing it runs (nodes must be in topological order)");
        fail(source_ + ": " + where + ": unknown tensor '" + name + "' (not a graph input, weight or node output)");
      }
      id = value->second;
    }
    const Value& value = graph_.value(id);
    if (value.meta.shape != meta.shape)
      fail(source_ + ": " + where + ": '" + name + "' has shape " + shape_string(meta.shape) + " here but " +
           shape_string(value.meta.shape) + " where it is defined");
    return id;
  }

  void read_node(const json& entry, size_t index) {
    const std::string position = "nodes[" + std::to_string(index) + "]";
    Node node;
    node.name = required_string(entry, "name", position);
    node.source_op = required_string(entry, "op_type", position + " '" + node.name + "'");
    const std::string where = "node '" + node.name + "' (" + node.source_op + ")";
    if (node_index_.count(node.name)) fail(source_ + ": " + position + ": node name '" + node.name + "' is used twice");
    for (const char* key : {"inputs", "outputs"})
      if (!entry.contains(key) || !entry[key].is_array())
        fail(source_ + ": " + where + ": field '" + key + "' must be a list");

    for (size_t i = 0; i < entry["inputs"].size(); ++i)
      node.inputs.push_back(resolve_input(entry["inputs"][i], where + " input " + std::to_string(i)));

    node.attrs.set_owner(source_ + ": " + where);
    if (entry.contains("attrs") && !entry["attrs"].is_null()) {
      if (!entry["attrs"].is_object()) fail(source_ + ": " + where + ": field 'attrs' must be an object");
      for (const auto& [key, value] : entry["attrs"].items())
        node.attrs.set(key, read_attr(value, source_ + ": " + where + " attribute '" + key + "'"));
    }

    std::vector<TensorMeta> ir_outputs;
    std::vector<std::string> output_names;
    for (size_t i = 0; i < entry["outputs"].size(); ++i) {
      const std::string output_where = where + " output " + std::to_string(i);
      output_names.push_back(required_string(entry["outputs"][i], "name", output_where));
      ir_outputs.push_back(read_meta(entry["outputs"][i], output_where + " '" + output_names.back() + "'"));
    }

    auto [def, spelling] = OpRegistry::instance().find_spelling(node.source_op);
    node.def = def;
    node.op = def ? def->name : node.source_op;
    if (def) check_against_registry(*def, spelling, node, ir_outputs, where);

    const auto node_id = static_cast<int32_t>(graph_.nodes.size());
    for (size_t i = 0; i < ir_outputs.size(); ++i) {
      Value value;
      value.name = output_names[i];
      value.meta = ir_outputs[i];
      value.kind = ValueKind::NodeOutput;
      value.producer = node_id;
      value.producer_slot = static_cast<int32_t>(i);
      node.outputs.push_back(add_value(std::move(value), where + " output " + std::to_string(i)));
    }
    node_index_[node.name] = static_cast<size_t>(node_id);
    graph_.nodes.push_back(std::move(node));
  }

  void check_against_registry(const OpDef& def, const AtenSpelling* spelling, Node& node,
                              const std::vector<TensorMeta>& ir_outputs, const std::string& where) {
    const auto count = static_cast<int>(node.inputs.size());
    if (count < def.min_inputs || (def.max_inputs >= 0 && count > def.max_inputs))
      fail(source_ + ": " + where + ": expects " + std::to_string(def.min_inputs) +
           (def.max_inputs == def.min_inputs ? ""
            : def.max_inputs < 0             ? " or more"
                                             : " to " + std::to_string(def.max_inputs)) +
           " tensor inputs, got " + std::to_string(count));
    OpRegistry::instance().normalize_attrs(def, spelling, node.attrs, source_ + ": " + where);
    std::vector<TensorMeta> input_metas;
    for (ValueId id : node.inputs) input_metas.push_back(graph_.value(id).meta);
    std::vector<TensorMeta> inferred;
    try {
      inferred = def.infer(node.attrs, input_metas);
    } catch (const Error& error) {
      std::string message = error.what();
      if (message.rfind(source_, 0) == 0) throw;
      fail(source_ + ": " + where + ": " + message);
    }
    if (inferred.size() != ir_outputs.size())
      fail(source_ + ": " + where + ": the IR lists " + std::to_string(ir_outputs.size()) + " outputs, the op has " +
           std::to_string(inferred.size()));
    for (size_t i = 0; i < inferred.size(); ++i) {
      if (inferred[i].shape != ir_outputs[i].shape)
        fail(source_ + ": " + where + ": output " + std::to_string(i) + " has shape " +
             shape_string(ir_outputs[i].shape) + " in the IR but the op computes " + shape_string(inferred[i].shape));
      if (reference_dtype(inferred[i].dtype) != reference_dtype(ir_outputs[i].dtype))
        fail(source_ + ": " + where + ": output " + std::to_string(i) + " has dtype " +
             std::string(dtype_name(ir_outputs[i].dtype)) + " in the IR but the op computes " +
             std::string(dtype_name(inferred[i].dtype)));
    }
  }

  void read_outputs(const json& outputs) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string where = "graph_outputs[" + std::to_string(i) + "]";
      const std::string name = required_string(outputs[i], "name", where);
      const TensorMeta meta = read_meta(outputs[i], where + " '" + name + "'");
      auto value = by_name_.find(name);
      if (value == by_name_.end())
        fail(source_ + ": " + where + ": '" + name + "' is not produced by any node, input or weight");
      if (graph_.value(value->second).meta.shape != meta.shape)
        fail(source_ + ": " + where + ": '" + name + "' has shape " + shape_string(meta.shape) +
             " but its producer gives " + shape_string(graph_.value(value->second).meta.shape));
      graph_.outputs.push_back(value->second);
    }
  }

  std::string source_;
  Graph graph_;
  std::map<std::string, ValueId> by_name_;
  std::map<std::string, size_t> node_index_;
  std::set<std::string> later_nodes_;
  std::set<std::string> later_outputs_;
};

}  // namespace

Graph parse_torch_ir(std::string_view text, const std::string& source_name) {
  if (text.empty()) fail(source_name + ": file is empty");
  const json root = parse_json_text(text, source_name);
  return Reader(source_name).read(root);
}

Graph read_torch_ir(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail(path + ": is a directory, not an IR file");
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) fail(path + ": cannot open file");
  const std::streamoff size = file.tellg();
  if (size < 0) fail(path + ": cannot read file");
  if (size > kMaxIrFileBytes) fail(path + ": file is larger than the 1 GiB limit for IR files");
  std::string text(static_cast<size_t>(size), '\0');
  file.seekg(0);
  file.read(text.data(), size);
  if (!file) fail(path + ": cannot read file");
  return parse_torch_ir(text, path);
}

}  // namespace npusim
