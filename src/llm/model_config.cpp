#include "llm/model_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "core/json_text.h"
#include "npusim/error.h"

namespace npusim {

namespace {

using Json = nlohmann::json;

// Deeper nesting is refused while parsing: the walks over the tree (and dump() in messages) recurse.
constexpr const char* kRopeTypes[] = {"default", "linear", "dynamic", "llama3", "yarn"};

// Typed access to config fields; every error names the file and the field.
class FieldReader {
 public:
  FieldReader(const std::string& source, const Json& object, std::string prefix = "")
      : source_(source), object_(object), prefix_(std::move(prefix)) {}

  [[noreturn]] void error(const std::string& key, const std::string& problem) const {
    fail(source_ + ": field '" + prefix_ + key + "' " + problem);
  }

  // Absent and null read the same: not given.
  const Json* find(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }

  std::optional<int64_t> integer(const std::string& key) const {
    const Json* value = find(key);
    if (!value) return std::nullopt;
    return as_integer(key, *value);
  }

  int64_t required_positive(const std::string& key) const {
    const auto value = integer(key);
    if (!value) error(key, "is missing");
    if (*value <= 0) error(key, "must be positive, got " + std::to_string(*value));
    return *value;
  }

  std::optional<double> number(const std::string& key) const {
    const Json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_number()) error(key, "must be a number, got " + value->dump());
    return value->get<double>();
  }

  std::optional<bool> boolean(const std::string& key) const {
    const Json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_boolean()) error(key, "must be true or false, got " + value->dump());
    return value->get<bool>();
  }

  std::optional<std::string> string(const std::string& key) const {
    const Json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_string()) error(key, "must be a string, got " + value->dump());
    return value->get<std::string>();
  }

  std::vector<std::string> strings(const std::string& key) const {
    const Json* value = find(key);
    if (!value) return {};
    if (!value->is_array()) error(key, "must be a list of strings, got " + value->dump());
    std::vector<std::string> result;
    for (const Json& item : *value) {
      if (!item.is_string()) error(key, "must be a list of strings, got " + value->dump());
      result.push_back(item.get<std::string>());
    }
    return result;
  }

  // A token id given as one integer or a list of them.
  std::vector<int64_t> token_ids(const std::string& key) const {
    const Json* value = find(key);
    if (!value) return {};
    if (!value->is_array()) return {as_integer(key, *value)};
    std::vector<int64_t> result;
    for (const Json& item : *value) result.push_back(as_integer(key, item));
    return result;
  }

 private:
  int64_t as_integer(const std::string& key, const Json& value) const {
    if (value.is_number_integer()) return value.get<int64_t>();
    if (value.is_number_float()) {
      const double number = value.get<double>();
      if (std::floor(number) == number && std::abs(number) < 9.0e18) return static_cast<int64_t>(number);
    }
    error(key, "must be an integer, got " + value.dump());
  }

  const std::string& source_;
  const Json& object_;
  std::string prefix_;
};

// The object that holds the RoPE settings and the name it goes by in messages; null when there is none.
std::pair<const Json*, std::string> find_rope_object(const std::string& source, const Json& root) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_object()) fail(source + ": field '" + key + "' must be an object, got " + it->dump());
    // transformers 5 may key the parameters by attention type; full attention is what decoder layers use.
    auto full = it->find("full_attention");
    if (full != it->end() && full->is_object() && !it->contains("rope_type") && !it->contains("rope_theta"))
      return {&*full, std::string(key) + ".full_attention"};
    return {&*it, key};
  }
  return {nullptr, ""};
}

void read_rope(const std::string& source, const Json& root, ModelConfig& config) {
  const FieldReader top(source, root);
  const auto [rope, rope_name] = find_rope_object(source, root);
  config.rope_theta = top.number("rope_theta").value_or(10000.0);
  config.partial_rotary_factor = top.number("partial_rotary_factor").value_or(1.0);
  if (!rope) return;

  const FieldReader fields(source, *rope, rope_name + ".");
  config.rope_theta = fields.number("rope_theta").value_or(config.rope_theta);
  config.partial_rotary_factor = fields.number("partial_rotary_factor").value_or(config.partial_rotary_factor);
  RopeScaling& scaling = config.rope_scaling;
  const std::string type_key = fields.has("rope_type") ? "rope_type" : "type";
  scaling.type = fields.string(type_key).value_or("default");
  if (std::find(std::begin(kRopeTypes), std::end(kRopeTypes), scaling.type) == std::end(kRopeTypes))
    fields.error(type_key, "names RoPE type '" + scaling.type +
                               "', which is not supported (supported: default, linear, dynamic, llama3, yarn)");

  const auto factor = fields.number("factor");
  scaling.original_max_position_embeddings = fields.integer("original_max_position_embeddings").value_or(0);
  if (scaling.type == "yarn" && !factor && scaling.original_max_position_embeddings > 0 &&
      config.max_position_embeddings > 0) {
    scaling.factor = static_cast<double>(config.max_position_embeddings) /
                     static_cast<double>(scaling.original_max_position_embeddings);
  } else if (scaling.type != "default") {
    if (!factor) fields.error("factor", "is required by RoPE type '" + scaling.type + "'");
    scaling.factor = *factor;
  }
  if (scaling.type != "default" && scaling.factor <= 0)
    fields.error("factor", "must be positive, got " + std::to_string(scaling.factor));

  if (scaling.type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!fields.has(key)) fields.error(key, "is required by RoPE type 'llama3'");
    scaling.low_freq_factor = *fields.number("low_freq_factor");
    scaling.high_freq_factor = *fields.number("high_freq_factor");
    if (scaling.high_freq_factor == scaling.low_freq_factor)
      fields.error("high_freq_factor", "must differ from low_freq_factor");
  }
  if (scaling.type == "yarn") {
    scaling.attention_factor = fields.number("attention_factor");
    // Hugging Face treats 0 like absent here (`get(...) or default`).
    if (const auto beta = fields.number("beta_fast"); beta && *beta != 0) scaling.beta_fast = *beta;
    if (const auto beta = fields.number("beta_slow"); beta && *beta != 0) scaling.beta_slow = *beta;
    scaling.mscale = fields.number("mscale");
    scaling.mscale_all_dim = fields.number("mscale_all_dim");
    scaling.truncate = fields.boolean("truncate").value_or(true);
  }
}

void read_shapes(const FieldReader& fields, ModelConfig& config) {
  config.hidden_size = fields.required_positive("hidden_size");
  config.num_hidden_layers = fields.required_positive("num_hidden_layers");
  config.num_attention_heads = fields.required_positive("num_attention_heads");
  config.intermediate_size = fields.required_positive("intermediate_size");
  config.vocab_size = fields.required_positive("vocab_size");
  config.max_position_embeddings = fields.integer("max_position_embeddings").value_or(0);

  config.num_key_value_heads = fields.integer("num_key_value_heads").value_or(config.num_attention_heads);
  if (config.num_key_value_heads <= 0 || config.num_attention_heads % config.num_key_value_heads != 0)
    fields.error("num_key_value_heads", "must be positive and divide num_attention_heads (" +
                                            std::to_string(config.num_attention_heads) + "), got " +
                                            std::to_string(config.num_key_value_heads));

  if (const auto head_dim = fields.integer("head_dim")) {
    if (*head_dim <= 0) fields.error("head_dim", "must be positive, got " + std::to_string(*head_dim));
    config.head_dim = *head_dim;
  } else {
    if (config.hidden_size % config.num_attention_heads != 0)
      fields.error("num_attention_heads",
                   "must divide hidden_size (" + std::to_string(config.hidden_size) + ") when head_dim is not given");
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
}

// theta ** (arange(0, dim, 2).float() / dim), every step in fp32 as torch does it.
std::vector<float> rope_powers(double theta, int64_t dim) {
  const auto base = static_cast<float>(theta);
  std::vector<float> powers(static_cast<size_t>(dim / 2));
  for (size_t i = 0; i < powers.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    powers[i] = std::pow(base, exponent);
  }
  return powers;
}

std::vector<float> default_inv_freq(double theta, int64_t dim) {
  std::vector<float> inv_freq = rope_powers(theta, dim);
  for (float& value : inv_freq) value = 1.0f / value;
  return inv_freq;
}

// Hugging Face `_compute_llama3_parameters`, with its fp32 tensor arithmetic.
std::vector<float> llama3_inv_freq(std::vector<float> inv_freq, const RopeScaling& scaling) {
  const auto context = static_cast<double>(scaling.original_max_position_embeddings);
  const auto low_freq_wavelen = static_cast<float>(context / scaling.low_freq_factor);
  const auto high_freq_wavelen = static_cast<float>(context / scaling.high_freq_factor);
  const auto factor = static_cast<float>(scaling.factor);
  const auto two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const auto band = static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
  for (float& value : inv_freq) {
    const float wavelen = (1.0f / value) * two_pi;
    const float scaled = wavelen > low_freq_wavelen ? value / factor : value;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (!medium) {
      value = scaled;
      continue;
    }
    const float smooth =
        ((1.0f / wavelen) * static_cast<float>(context) - static_cast<float>(scaling.low_freq_factor)) / band;
    value = (1.0f - smooth) * scaled / factor + smooth * scaled;
  }
  return inv_freq;
}

// Hugging Face `_compute_yarn_parameters` (transformers 5).
std::vector<float> yarn_inv_freq(const ModelConfig& config, int64_t dim) {
  const RopeScaling& scaling = config.rope_scaling;
  const double base = config.rope_theta;
  const auto context =
      static_cast<double>(scaling.original_max_position_embeddings > 0 ? scaling.original_max_position_embeddings
                                                                       : config.max_position_embeddings);
  if (context <= 0)
    fail(config.source + ": RoPE type 'yarn' needs max_position_embeddings or original_max_position_embeddings");
  const auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(context / (rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(scaling.beta_fast);
  double high = correction_dim(scaling.beta_slow);
  if (scaling.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;

  const std::vector<float> pos_freqs = rope_powers(base, dim);
  std::vector<float> inv_freq(pos_freqs.size());
  const auto factor = static_cast<float>(scaling.factor);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (factor * pos_freqs[i]);
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv_freq;
}

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

ModelConfig ModelConfig::load(const std::string& path) { return parse(read_text_file(path, "a config.json"), path); }

ModelConfig ModelConfig::parse(const std::string& json_text, const std::string& source) {
  const Json root = parse_json_text(json_text, source);
  if (!root.is_object()) fail(source + ": a model configuration must be a JSON object");
  const FieldReader fields(source, root);

  ModelConfig config;
  config.source = source;
  config.model_type = fields.string("model_type").value_or("");
  config.architectures = fields.strings("architectures");
  if (config.model_type.empty() && config.architectures.empty())
    fields.error("model_type", "is missing, and 'architectures' is empty: the model family is unknown");

  read_shapes(fields, config);
  config.rms_norm_eps = fields.number("rms_norm_eps").value_or(1e-6);
  config.tie_word_embeddings = fields.boolean("tie_word_embeddings").value_or(false);
  config.attention_bias = config.model_type == "qwen2" || fields.boolean("attention_bias").value_or(false);

  const std::string dtype_key = fields.has("dtype") ? "dtype" : "torch_dtype";
  if (const auto dtype_text = fields.string(dtype_key)) {
    const auto dtype = parse_dtype(*dtype_text);
    if (!dtype) fields.error(dtype_key, "names an unknown dtype '" + *dtype_text + "'");
    config.dtype = *dtype;
  }
  config.bos_token_ids = fields.token_ids("bos_token_id");
  config.eos_token_ids = fields.token_ids("eos_token_id");
  read_rope(source, root, config);
  if (config.partial_rotary_factor <= 0 || config.partial_rotary_factor > 1)
    fields.error("partial_rotary_factor", "must be in (0, 1], got " + std::to_string(config.partial_rotary_factor));
  if (config.rope_theta <= 0) fields.error("rope_theta", "must be positive");
  return config;
}

int64_t ModelConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

std::vector<float> ModelConfig::rope_inv_freq(int64_t seq_len) const {
  const int64_t dim = rotary_dim();
  if (dim < 2)
    fail(source + ": rotary dimension " + std::to_string(dim) + " is too small (head_dim " + std::to_string(head_dim) +
         ", partial_rotary_factor " + std::to_string(partial_rotary_factor) + ")");
  const std::string& type = rope_scaling.type;
  if (type == "default") return default_inv_freq(rope_theta, dim);
  if (type == "linear") {
    std::vector<float> inv_freq = default_inv_freq(rope_theta, dim);
    for (float& value : inv_freq) value /= static_cast<float>(rope_scaling.factor);
    return inv_freq;
  }
  if (type == "dynamic") {
    if (max_position_embeddings <= 0) fail(source + ": RoPE type 'dynamic' needs max_position_embeddings");
    const auto max_positions = static_cast<double>(max_position_embeddings);
    const double length = std::max(static_cast<double>(seq_len), max_positions);
    const double factor = rope_scaling.factor;
    const double base = rope_theta * std::pow(factor * length / max_positions - (factor - 1.0),
                                              static_cast<double>(dim) / static_cast<double>(dim - 2));
    return default_inv_freq(base, dim);
  }
  if (type == "llama3") return llama3_inv_freq(default_inv_freq(rope_theta, dim), rope_scaling);
  if (type == "yarn") return yarn_inv_freq(*this, dim);
  fail(source + ": RoPE type '" + type + "' is not supported (supported: default, linear, dynamic, llama3, yarn)");
}

double ModelConfig::attention_scaling() const {
  if (rope_scaling.type != "yarn") return 1.0;
  if (rope_scaling.attention_factor) return *rope_scaling.attention_factor;
  const double factor = rope_scaling.factor;
  if (rope_scaling.mscale.value_or(0) != 0 && rope_scaling.mscale_all_dim.value_or(0) != 0)
    return yarn_mscale(factor, *rope_scaling.mscale) / yarn_mscale(factor, *rope_scaling.mscale_all_dim);
  return yarn_mscale(factor, 1.0);
}

}  // namespace npusim
