#include "llm/model_dir.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/json_text.h"
#include "npusim/error.h"

namespace npusim {

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::optional<double> number_field(const Json& root, const char* key, const std::string& source) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) fail(source + ": field '" + key + "' must be a number, got " + it->dump());
  return it->get<double>();
}

std::optional<int64_t> integer_field(const Json& root, const char* key, const std::string& source) {
  const auto value = number_field(root, key, source);
  if (!value) return std::nullopt;
  if (std::floor(*value) != *value || std::abs(*value) > 9.0e18)
    fail(source + ": field '" + key + "' must be an integer, got " + root.at(key).dump());
  return static_cast<int64_t>(*value);
}

std::vector<int64_t> token_ids_field(const Json& root, const char* key, const std::string& source) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return {};
  const auto as_id = [&](const Json& value) {
    if (!value.is_number_integer()) fail(source + ": field '" + key + "' must hold token ids, got " + it->dump());
    return value.get<int64_t>();
  };
  if (!it->is_array()) return {as_id(*it)};
  std::vector<int64_t> ids;
  for (const Json& item : *it) ids.push_back(as_id(item));
  return ids;
}

// Bytes per dtype over every tensor of the files.
DType dominant_dtype(const std::vector<SafetensorsFile>& files, int64_t& total_bytes) {
  std::map<DType, int64_t> bytes;
  total_bytes = 0;
  for (const SafetensorsFile& file : files)
    for (const std::string& name : file.names()) {
      const SafetensorsEntry& entry = file.entry(name);
      const auto size = static_cast<int64_t>(entry.end - entry.begin);
      bytes[entry.dtype] += size;
      total_bytes += size;
    }
  DType best = DType::Float32;
  int64_t most = -1;
  for (const auto& [dtype, count] : bytes)
    if (count > most) {
      best = dtype;
      most = count;
    }
  return best;
}

}  // namespace

GenerationConfig GenerationConfig::parse(const std::string& json_text, const std::string& source) {
  const Json root = parse_json_text(json_text, source);
  if (!root.is_object()) fail(source + ": a generation configuration must be a JSON object");
  GenerationConfig config;
  config.source = source;
  if (auto it = root.find("do_sample"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean()) fail(source + ": field 'do_sample' must be true or false, got " + it->dump());
    config.do_sample = it->get<bool>();
  }
  config.temperature = number_field(root, "temperature", source);
  config.top_k = integer_field(root, "top_k", source);
  config.top_p = number_field(root, "top_p", source);
  config.min_p = number_field(root, "min_p", source);
  config.repetition_penalty = number_field(root, "repetition_penalty", source);
  config.eos_token_ids = token_ids_field(root, "eos_token_id", source);
  config.bos_token_ids = token_ids_field(root, "bos_token_id", source);
  return config;
}

GenerationConfig GenerationConfig::load(const std::string& path) { return parse(read_text_file(path), path); }

std::vector<std::string> read_safetensors_index(const std::string& index_path) {
  const Json root = parse_json_text(read_text_file(index_path), index_path);
  auto map = root.is_object() ? root.find("weight_map") : root.end();
  if (map == root.end() || !map->is_object())
    fail(index_path + ": a safetensors index needs a 'weight_map' object {tensor name: shard file}");
  const fs::path directory = fs::path(index_path).parent_path();
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& [tensor, shard] : map->items()) {
    if (!shard.is_string())
      fail(index_path + ": weight_map entry '" + tensor + "' must name a file, got " + shard.dump());
    const std::string name = shard.get<std::string>();
    if (name.empty() || fs::path(name).is_absolute() || name.find("..") != std::string::npos)
      fail(index_path + ": weight_map entry '" + tensor + "' names '" + name + "', not a file in the directory");
    if (!seen.insert(name).second) continue;
    const std::string path = (directory / name).string();
    if (!fs::is_regular_file(path))
      fail(index_path + ": shard '" + name + "' (holding '" + tensor + "') is missing from " + directory.string());
    files.push_back(path);
  }
  if (files.empty()) fail(index_path + ": 'weight_map' lists no tensors");
  return files;
}

ModelDir ModelDir::open(const std::string& directory) {
  if (!fs::exists(directory)) fail(directory + ": no such model directory");
  if (!fs::is_directory(directory))
    fail(directory + ": not a directory (a model directory holds config.json and model.safetensors)");
  ModelDir dir;
  dir.path_ = directory;
  const std::string config_path = dir.file("config.json");
  if (!fs::exists(config_path))
    fail(directory +
         ": no config.json (a Hugging Face model directory holds config.json and the weights in "
         "model.safetensors or shards listed by model.safetensors.index.json)");
  dir.config_ = ModelConfig::load(config_path);
  if (const std::string path = dir.file("generation_config.json"); fs::exists(path))
    dir.generation_ = GenerationConfig::load(path);

  const std::string single = dir.file("model.safetensors");
  const std::string index = dir.file("model.safetensors.index.json");
  if (fs::exists(index))
    dir.weight_files_ = read_safetensors_index(index);
  else if (fs::exists(single))
    dir.weight_files_ = {single};
  else
    fail(directory + ": no weights: neither model.safetensors nor model.safetensors.index.json is there");
  for (const std::string& file : dir.weight_files_) dir.store_.add_file(file);
  dir.store_.set_config(dir.config_);
  dir.weight_dtype_ = dominant_dtype(dir.store_.files(), dir.weight_bytes_);
  return dir;
}

bool ModelDir::has_tokenizer() const { return fs::is_regular_file(file("tokenizer.json")); }

std::string ModelDir::file(const std::string& name) const { return (fs::path(path_) / name).string(); }

std::vector<int64_t> ModelDir::eos_token_ids() const {
  if (generation_ && !generation_->eos_token_ids.empty()) return generation_->eos_token_ids;
  return config_.eos_token_ids;
}

}  // namespace npusim
