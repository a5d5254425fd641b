#include "kernel_api/kernel_spec_json.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json_text.h"
#include "kernel_api/kernel_cache.h"
#include "kernel_api/kernel_plan.h"
#include "npusim/error.h"
#include "runtime/npy.h"

namespace npusim::kernels {

namespace {

using json = nlohmann::json;

class SpecReader {
 public:
  SpecReader(std::string source, std::string folder) : source_(std::move(source)), folder_(std::move(folder)) {}

  KernelSpec read(const json& root) {
    if (!root.is_object()) fail(source_ + ": a kernel spec must be a JSON object");
    static const std::set<std::string> known = {"name",
                                                "inputs",
                                                "outputs",
                                                "source",
                                                "header",
                                                "atomic_outputs",
                                                "max_threads_per_threadgroup",
                                                "arguments",
                                                "output_specs",
                                                "grid",
                                                "blocks",
                                                "threadgroup",
                                                "shared_memory_bytes",
                                                "init_value",
                                                "template",
                                                "device",
                                                "verbose"};
    for (const auto& [key, value] : root.items())
      if (!known.count(key)) fail(source_ + ": unknown key '" + key + "'");
    KernelSpec spec;
    spec.source.name = string(root, "name", true);
    spec.source.inputs = names(root, "inputs");
    spec.source.outputs = names(root, "outputs");
    spec.source.body = code(root, "source", true);
    spec.source.header = code(root, "header", false);
    spec.source.atomic_outputs = boolean(root, "atomic_outputs");
    spec.source.max_threads_per_threadgroup = integer(root, "max_threads_per_threadgroup", 0);
    if (root.contains("arguments")) {
      const json& arguments = object(root, "arguments");
      for (const auto& [name, value] : arguments.items()) spec.arguments[name] = argument(name, value);
    }
    if (root.contains("output_specs")) {
      for (const auto& [name, value] : object(root, "output_specs").items()) {
        const std::string where = "output_specs." + name;
        if (!value.is_object()) fail(source_ + ": '" + where + "' must be an object with shape and dtype");
        spec.config.outputs[name] = {shape(value, where), dtype(value, where)};
      }
    }
    if (root.contains("grid") && root.contains("blocks"))
      fail(source_ + ": give 'grid' (threads) or 'blocks', not both");
    if (!root.contains("grid") && !root.contains("blocks")) fail(source_ + ": missing 'grid' (threads per dimension)");
    const auto threadgroup = triple(root, "threadgroup", true);
    spec.config.threadgroup = {threadgroup[0], threadgroup[1], threadgroup[2]};
    if (root.contains("grid")) {
      const auto grid = triple(root, "grid", true);
      spec.config.grid = {grid[0], grid[1], grid[2]};
    } else {
      const auto blocks = triple(root, "blocks", true);
      spec.config.grid = grid_of(Blocks{blocks[0], blocks[1], blocks[2]}, spec.config.threadgroup);
    }
    spec.config.shared_memory_bytes = integer(root, "shared_memory_bytes", 0);
    if (root.contains("init_value")) {
      if (!root["init_value"].is_number()) fail(source_ + ": 'init_value' must be a number");
      spec.config.init_value = root["init_value"].get<double>();
    }
    if (root.contains("template")) {
      for (const auto& [name, value] : object(root, "template").items()) {
        if (value.is_boolean())
          spec.config.template_args.push_back({name, value.get<bool>()});
        else if (value.is_number_integer())
          spec.config.template_args.push_back({name, value.get<int64_t>()});
        else if (value.is_string() && parse_dtype(value.get<std::string>()))
          spec.config.template_args.push_back({name, *parse_dtype(value.get<std::string>())});
        else
          fail(source_ + ": template parameter '" + name + "' must be a dtype name, an integer or a boolean");
      }
    }
    const std::string device = root.contains("device") ? string(root, "device", true) : "cpu";
    const auto parsed = parse_device(device);
    if (!parsed) fail(source_ + ": unknown device '" + device + "' (cpu or cuda)");
    spec.config.device = *parsed;
    spec.config.verbose = boolean(root, "verbose");
    return spec;
  }

 private:
  std::string string(const json& root, const std::string& key, bool required) {
    if (!root.contains(key)) {
      if (required) fail(source_ + ": missing '" + key + "'");
      return "";
    }
    if (!root[key].is_string()) fail(source_ + ": '" + key + "' must be a string");
    return root[key].get<std::string>();
  }

  // A string, or a list of lines joined with newlines.
  std::string code(const json& root, const std::string& key, bool required) {
    if (!root.contains(key) || !root[key].is_array()) return string(root, key, required);
    std::string text;
    for (const json& line : root[key]) {
      if (!line.is_string()) fail(source_ + ": '" + key + "' must be a string or a list of strings");
      text += line.get<std::string>() + "\n";
    }
    return text;
  }

  std::vector<std::string> names(const json& root, const std::string& key) {
    if (!root.contains(key)) return {};
    if (!root[key].is_array()) fail(source_ + ": '" + key + "' must be a list of names");
    std::vector<std::string> list;
    for (const json& name : root[key]) {
      if (!name.is_string()) fail(source_ + ": '" + key + "' must be a list of names");
      list.push_back(name.get<std::string>());
    }
    return list;
  }

  bool boolean(const json& root, const std::string& key) {
    if (!root.contains(key)) return false;
    if (!root[key].is_boolean()) fail(source_ + ": '" + key + "' must be true or false");
    return root[key].get<bool>();
  }

  int64_t integer(const json& root, const std::string& key, int64_t fallback) {
    if (!root.contains(key)) return fallback;
    if (!root[key].is_number_integer()) fail(source_ + ": '" + key + "' must be an integer");
    return root[key].get<int64_t>();
  }

  const json& object(const json& root, const std::string& key) {
    if (!root[key].is_object()) fail(source_ + ": '" + key + "' must be an object");
    return root[key];
  }

  std::array<int64_t, 3> triple(const json& root, const std::string& key, bool required) {
    std::array<int64_t, 3> values = {1, 1, 1};
    if (!root.contains(key)) {
      if (required) fail(source_ + ": missing '" + key + "'");
      return values;
    }
    json list = root[key];
    if (list.is_number_integer()) list = json::array({list});
    if (!list.is_array() || list.empty() || list.size() > 3)
      fail(source_ + ": '" + key + "' must be a list of 1 to 3 integers");
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_number_integer()) fail(source_ + ": '" + key + "' must be a list of 1 to 3 integers");
      values[i] = list[i].get<int64_t>();
    }
    return values;
  }

  Shape shape(const json& entry, const std::string& where) {
    if (!entry.contains("shape") || !entry["shape"].is_array())
      fail(source_ + ": '" + where + ".shape' must be a list");
    Shape result;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail(source_ + ": '" + where + ".shape' must hold integers of at least 0");
      result.push_back(d.get<int64_t>());
    }
    return result;
  }

  DType dtype(const json& entry, const std::string& where) {
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) fail(source_ + ": '" + where + ".dtype' is missing");
    const auto parsed = parse_dtype(entry["dtype"].get<std::string>());
    if (!parsed) fail(source_ + ": '" + where + ".dtype' is not a dtype: " + entry["dtype"].get<std::string>());
    return *parsed;
  }

  Argument argument(const std::string& name, const json& entry) {
    const std::string where = "arguments." + name;
    if (!entry.is_object()) fail(source_ + ": '" + where + "' must be an object");
    if (entry.contains("npy")) {
      if (!entry["npy"].is_string()) fail(source_ + ": '" + where + ".npy' must be a path");
      std::filesystem::path path = entry["npy"].get<std::string>();
      if (path.is_relative()) path = std::filesystem::path(folder_) / path;
      return read_npy(path.string());
    }
    if (entry.contains("scalar")) {
      const json& value = entry["scalar"];
      const DType type = entry.contains("dtype") ? dtype(entry, where) : DType::Float32;
      if (value.is_boolean()) return Scalar(type, int64_t{value.get<bool>() ? 1 : 0});
      if (value.is_number_integer()) return Scalar(type, value.get<int64_t>());
      if (value.is_number()) return Scalar(type, value.get<double>());
      fail(source_ + ": '" + where + ".scalar' must be a number");
    }
    const DType type = dtype(entry, where);
    Tensor tensor(type, shape(entry, where));
    if (!entry.contains("data")) fail(source_ + ": '" + where + "' needs 'data', 'npy' or 'scalar'");
    const json& data = entry["data"];
    if (!data.is_number() && !data.is_boolean() && !data.is_array())
      fail(source_ + ": '" + where + ".data' must be a number or a list of numbers");
    const int64_t count = data.is_array() ? static_cast<int64_t>(data.size()) : tensor.numel();
    if (count != tensor.numel())
      fail(source_ + ": '" + where + ".data' has " + std::to_string(count) + " values for shape " +
           shape_string(tensor.shape()) + " (" + std::to_string(tensor.numel()) + " elements)");
    const size_t size = dtype_size(type);
    for (int64_t i = 0; i < count; ++i) {
      const json& value = data.is_array() ? data[static_cast<size_t>(i)] : data;
      if (!value.is_number() && !value.is_boolean()) fail(source_ + ": '" + where + ".data' must hold numbers");
      const std::variant<double, int64_t> number =
          value.is_boolean()          ? std::variant<double, int64_t>(int64_t{value.get<bool>() ? 1 : 0})
          : value.is_number_integer() ? std::variant<double, int64_t>(value.get<int64_t>())
                                      : std::variant<double, int64_t>(value.get<double>());
      const auto bytes = detail::encode_value(type, number, source_ + ": '" + where + ".data' value");
      std::memcpy(tensor.mutable_bytes() + static_cast<size_t>(i) * size, bytes.data(), size);
    }
    return tensor;
  }

  std::string source_;
  std::string folder_;
};

}  // namespace

KernelSpec parse_kernel_spec(const std::string& text, const std::string& source_name, const std::string& base_folder) {
  const json root = parse_json_text(text, source_name);
  try {
    return SpecReader(source_name, base_folder).read(root);
  } catch (const json::exception& error) {
    fail(source_name + ": " + error.what());
  }
}

KernelSpec read_kernel_spec(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail(path + ": is a directory, not a kernel spec");
  const auto text = detail::read_file(path);
  if (!text) fail(path + ": cannot read file");
  return parse_kernel_spec(*text, path, std::filesystem::path(path).parent_path().string());
}

}  // namespace npusim::kernels
