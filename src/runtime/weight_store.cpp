#include "runtime/weight_store.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include "runtime/weight_transforms.h"

namespace npusim {

namespace {

// Embedding names a tied LM head may borrow, tried after the head's own prefix.
constexpr const char* kEmbeddingNames[] = {"model.embed_tokens.weight", "embed_tokens.weight",
                                           "transformer.wte.weight"};

bool ends_with_component(const std::string& key, std::string_view suffix) {
  if (key == suffix) return true;
  return key.size() > suffix.size() && key.ends_with(suffix) && key[key.size() - suffix.size() - 1] == '.';
}

std::string last_component(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// The key, then the key without its leading components one at a time, down to two components
// ("model.model.layers.0.mlp.up_proj.weight" -> "model.layers.0..." -> "layers.0..." -> ... -> "up_proj.weight").
std::vector<std::string> with_prefixes_stripped(const std::string& key) {
  std::vector<std::string> names{key};
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    if (dot == std::string::npos || key.find('.', dot + 1) == std::string::npos) break;
    start = dot + 1;
    names.push_back(key.substr(start));
  }
  return names;
}

void append_unique(std::vector<std::string>& names, const std::vector<std::string>& more) {
  for (const std::string& name : more)
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

// Values read by a node or returned by the graph, plus the sources of derived weights among them (a derived
// weight is computed from its sources at load time, so the sources are needed even when no node reads them).
std::set<ValueId> used_values(const Graph& graph) {
  std::set<ValueId> used(graph.outputs.begin(), graph.outputs.end());
  for (const Node& node : graph.nodes) used.insert(node.inputs.begin(), node.inputs.end());
  std::vector<ValueId> pending(used.begin(), used.end());
  while (!pending.empty()) {
    const Value& value = graph.value(pending.back());
    pending.pop_back();
    if (!value.transform) continue;
    for (ValueId source : value.transform->sources)
      if (source != kNoValue && used.insert(source).second) pending.push_back(source);
  }
  return used;
}

std::string describe(const Value& value) {
  std::string text = "'" + value.weight_key + "'";
  if (!value.name.empty() && value.name != value.weight_key) text += " (placeholder " + value.name + ")";
  return text;
}

bool is_rotary_buffer(const Value& value) {
  const std::string last = last_component(value.weight_key.empty() ? value.name : value.weight_key);
  return last == "inv_freq" || last == "original_inv_freq";
}

bool is_lifted_constant(const Value& value) { return value.name.starts_with("c_"); }

std::string file_list(const std::vector<SafetensorsFile>& files) {
  if (files.empty()) return "no weight files were given";
  std::string text = "searched ";
  for (size_t i = 0; i < files.size(); ++i) text += (i ? ", " : "") + files[i].path();
  return text;
}

}  // namespace

void WeightStore::add_file(const std::string& path) { files_.push_back(SafetensorsFile::open(path)); }

void WeightStore::set_config(const ModelConfig& config) { config_ = config; }

std::optional<WeightStore::Found> WeightStore::find_in_files(const std::vector<std::string>& candidates) const {
  for (const std::string& name : candidates) {
    for (size_t i = 0; i < files_.size(); ++i) {
      if (!files_[i].contains(name)) continue;
      const Shape& shape = files_[i].entry(name).shape;
      for (size_t j = i + 1; j < files_.size(); ++j)
        if (files_[j].contains(name) && files_[j].entry(name).shape != shape)
          fail("tensor '" + name + "' has shape " + shape_string(shape) + " in " + files_[i].path() + " but " +
               shape_string(files_[j].entry(name).shape) + " in " + files_[j].path());
      return Found{files_[i].get(name), files_[i].path() + " as '" + name + "'", name};
    }
  }
  return std::nullopt;
}

std::optional<WeightStore::Found> WeightStore::resolve(const Graph& graph, const Value& value,
                                                       std::vector<std::string>& notes) const {
  for (const std::string* name : {&value.weight_key, &value.name}) {
    auto constant = graph.constants.find(*name);
    if (constant != graph.constants.end())
      return Found{constant->second, "the IR constants of " + (graph.source.empty() ? "the graph" : graph.source),
                   *name};
  }
  std::vector<std::string> candidates{value.weight_key};
  append_unique(candidates, {value.name});
  append_unique(candidates, with_prefixes_stripped(value.weight_key));
  if (auto found = find_in_files(candidates)) return found;

  if (ends_with_component(value.weight_key, "lm_head.weight")) {
    const std::string prefix = value.weight_key.substr(0, value.weight_key.size() - std::strlen("lm_head.weight"));
    std::vector<std::string> embeddings;
    for (const char* embedding : kEmbeddingNames) append_unique(embeddings, with_prefixes_stripped(prefix + embedding));
    if (auto found = find_in_files(embeddings)) {
      notes.push_back(describe(value) + " is not in the weight files; tied to the embedding '" + found->name + "' (" +
                      found->origin + ")");
      return found;
    }
  }
  if (is_rotary_buffer(value) && config_) {
    const std::vector<float> inv_freq = config_->rope_inv_freq();
    Tensor tensor(DType::Float32, {static_cast<int64_t>(inv_freq.size())});
    std::copy(inv_freq.begin(), inv_freq.end(), tensor.mutable_data<float>());
    notes.push_back(describe(value) + " computed from the model configuration " + config_->source + " (RoPE type '" +
                    config_->rope_scaling.type + "')");
    return Found{tensor, "the model configuration " + config_->source, value.weight_key};
  }
  if (is_lifted_constant(value)) {
    if (shape_numel(value.meta.shape) != 0)
      notes.push_back(describe(value) +
                      " is a lifted constant with no data in the IR or the weight files; filled with zeros");
    return Found{Tensor(value.meta.dtype, value.meta.shape), "a lifted constant", value.name};
  }
  return std::nullopt;
}

WeightBinding WeightStore::bind(const Graph& graph, DerivedWeights derived) const {
  const std::string source = graph.source.empty() ? "graph" : graph.source;
  WeightBinding binding;
  std::vector<std::string> missing;
  const std::set<ValueId> used = used_values(graph);
  for (ValueId id : graph.weights) {
    const Value& value = graph.value(id);
    if (!used.count(id) || value.transform) continue;
    std::optional<Found> found = resolve(graph, value, binding.notes);
    if (!found) {
      std::string line =
          describe(value) + " " + shape_string(value.meta.shape) + " " + std::string(dtype_name(value.meta.dtype));
      if (is_rotary_buffer(value))
        line += ": a rotary buffer computed from the model configuration; pass --config <config.json>";
      missing.push_back(line);
      continue;
    }
    if (found->tensor.shape() != value.meta.shape)
      fail(source + ": weight " + describe(value) + " from " + found->origin + " has shape " +
           shape_string(found->tensor.shape()) + " but the graph expects " + shape_string(value.meta.shape));
    binding.tensors.emplace_back(id, std::move(found->tensor));
  }

  if (!missing.empty()) {
    std::string message = source + ": " + std::to_string(missing.size()) +
                          (missing.size() == 1 ? " weight was" : " weights were") + " not found (" + file_list(files_) +
                          "; tried the state_dict key, the placeholder name and the key without leading "
                          "components):";
    for (const std::string& line : missing) message += "\n  " + line;
    fail(message);
  }
  if (derived == DerivedWeights::Computed) add_derived_weights(graph, binding.tensors);
  return binding;
}

}  // namespace npusim
