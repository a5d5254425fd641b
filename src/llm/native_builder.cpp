#include "llm/native_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/graph_edit.h"
#include "npusim/op_registry.h"

namespace npusim {

namespace {

enum class Family { Qwen2, Llama };

struct KnownArchitecture {
  const char* architecture;
  const char* model_type;
  Family family;
};

constexpr KnownArchitecture kArchitectures[] = {
    {"Qwen2ForCausalLM", "qwen2", Family::Qwen2},
    {"LlamaForCausalLM", "llama", Family::Llama},
};

Family family_of(const ModelConfig& config) {
  const std::string where = config.source.empty() ? "model configuration" : config.source;
  if (!config.architectures.empty()) {
    for (const std::string& name : config.architectures)
      for (const KnownArchitecture& known : kArchitectures)
        if (name == known.architecture) return known.family;
    std::string listed;
    for (const std::string& name : config.architectures) listed += (listed.empty() ? "" : ", ") + name;
    fail(where + ": unknown architecture " + listed + " (the native builder knows " + native_architectures() +
         "; other models run from exported graphs: --prefill-ir/--decode-ir)");
  }
  for (const KnownArchitecture& known : kArchitectures)
    if (config.model_type == known.model_type) return known.family;
  fail(where + ": unknown model_type '" + config.model_type + "' (the native builder knows " + native_architectures() +
       "; other models run from exported graphs: --prefill-ir/--decode-ir)");
}

TensorMeta floats(Shape shape) { return {std::move(shape), DType::Float32}; }
TensorMeta int64s(Shape shape) { return {std::move(shape), DType::Int64}; }

// Appends canonical nodes with their attributes normalized and their outputs inferred by the registry.
class GraphBuilder {
 public:
  explicit GraphBuilder(Graph& graph) : graph_(graph) {}

  ValueId input(const std::string& name, TensorMeta meta) {
    const ValueId id = compiler::add_value(graph_, name, std::move(meta), ValueKind::GraphInput);
    graph_.inputs.push_back(id);
    return id;
  }

  ValueId weight(const std::string& key, Shape shape) {
    const ValueId id = compiler::add_value(graph_, key, floats(std::move(shape)), ValueKind::Weight);
    graph_.value(id).weight_key = key;
    graph_.weights.push_back(id);
    return id;
  }

  ValueId constant(const std::string& key, Tensor data) { return compiler::add_constant(graph_, key, std::move(data)); }

  std::vector<ValueId> nodes(const std::string& op, const std::string& name, Attrs attrs, std::vector<ValueId> inputs,
                             const std::vector<std::string>& output_names) {
    const OpDef* def = OpRegistry::instance().find(op);
    if (!def) fail("internal: op '" + op + "' is not registered");
    const std::string where = graph_.source + ": node '" + name + "'";
    OpRegistry::instance().normalize_attrs(*def, nullptr, attrs, where);
    std::vector<TensorMeta> metas;
    for (ValueId id : inputs) metas.push_back(graph_.value(id).meta);
    std::vector<TensorMeta> outputs;
    try {
      outputs = def->infer(attrs, metas);
    } catch (const Error& error) {
      fail(where + " (" + op + "): " + error.what());
    }
    Node node = compiler::make_node(graph_, op, name, std::move(attrs), std::move(inputs), outputs, output_names);
    const auto index = static_cast<int32_t>(graph_.nodes.size());
    for (size_t slot = 0; slot < node.outputs.size(); ++slot) {
      graph_.value(node.outputs[slot]).producer = index;
      graph_.value(node.outputs[slot]).producer_slot = static_cast<int32_t>(slot);
    }
    std::vector<ValueId> results = node.outputs;
    graph_.nodes.push_back(std::move(node));
    return results;
  }

  ValueId node(const std::string& op, const std::string& name, Attrs attrs, std::vector<ValueId> inputs) {
    return nodes(op, name, std::move(attrs), std::move(inputs), {name}).at(0);
  }

  ValueId reshape(const std::string& name, ValueId x, Shape shape) {
    Attrs attrs;
    attrs.set("shape", std::move(shape));
    return node("reshape", name, std::move(attrs), {x});
  }

  ValueId transpose(const std::string& name, ValueId x, int64_t dim0, int64_t dim1) {
    Attrs attrs;
    attrs.set("dim0", dim0);
    attrs.set("dim1", dim1);
    return node("transpose", name, std::move(attrs), {x});
  }

  ValueId linear(const std::string& name, ValueId x, ValueId weight, ValueId bias = kNoValue) {
    std::vector<ValueId> inputs{x, weight};
    if (bias != kNoValue) inputs.push_back(bias);
    return node("linear", name, {}, std::move(inputs));
  }

  ValueId rms_norm(const std::string& name, ValueId x, ValueId weight, int64_t width, double eps) {
    Attrs attrs;
    attrs.set("normalized_shape", std::vector<int64_t>{width});
    attrs.set("eps", eps);
    return node("rms_norm", name, std::move(attrs), {x, weight});
  }

 private:
  Graph& graph_;
};

struct Dims {
  int64_t tokens, context, hidden, q_heads, kv_heads, head_dim, intermediate, vocab;
};

// Self-attention of one layer; `cos` and `sin` are [1, 1, T, D]. Returns the attention output [1, T, hidden]
// and appends the layer's updated caches to `caches`.
ValueId attention_block(GraphBuilder& b, const ModelConfig& config, Family family, const Dims& d, int64_t layer,
                        ValueId x, ValueId cos, ValueId sin, ValueId positions, ValueId mask,
                        std::vector<ValueId>& caches) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
  const std::string name = "layers." + std::to_string(layer) + ".attn.";
  const bool qkv_bias = config.attention_bias;
  const bool o_bias = family == Family::Llama && config.attention_bias;
  const auto projection = [&](const char* which, int64_t heads) {
    const std::string key = prefix + which + "_proj.";
    const ValueId weight = b.weight(key + "weight", {heads * d.head_dim, d.hidden});
    const ValueId bias = qkv_bias ? b.weight(key + "bias", {heads * d.head_dim}) : kNoValue;
    const ValueId flat = b.linear(name + which, x, weight, bias);
    const ValueId split = b.reshape(name + which + ".heads", flat, {1, d.tokens, heads, d.head_dim});
    return b.transpose(name + which + ".t", split, 1, 2);  // [1, heads, T, D]
  };
  const ValueId q = b.node("rope", name + "q.rope", {}, {projection("q", d.q_heads), cos, sin});
  const ValueId k = b.node("rope", name + "k.rope", {}, {projection("k", d.kv_heads), cos, sin});
  const ValueId v = projection("v", d.kv_heads);

  std::vector<ValueId> cache;
  for (const auto& [rows, slot] : {std::pair{k, 0}, std::pair{v, 1}}) {
    const ValueId past =
        b.input("kv_" + std::to_string(2 * layer + slot), floats({1, d.kv_heads, d.context, d.head_dim}));
    Attrs attrs;
    attrs.set("dim", int64_t{2});
    cache.push_back(b.node("index_copy", "kv_" + std::to_string(2 * layer + slot) + "_out", std::move(attrs),
                           {past, positions, rows}));
  }
  caches.insert(caches.end(), cache.begin(), cache.end());

  Attrs attrs;
  attrs.set("scale", 1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  attrs.set("has_mask", mask != kNoValue);
  attrs.set("has_cache_position", true);
  std::vector<ValueId> inputs{q, cache[0], cache[1]};
  if (mask != kNoValue) inputs.push_back(mask);
  inputs.push_back(positions);
  const ValueId heads = b.node("attention", name + "sdpa", std::move(attrs), std::move(inputs));
  const ValueId merged =
      b.reshape(name + "merged", b.transpose(name + "sdpa.t", heads, 1, 2), {1, d.tokens, d.q_heads * d.head_dim});
  const ValueId o_weight = b.weight(prefix + "o_proj.weight", {d.hidden, d.q_heads * d.head_dim});
  const ValueId o_bias_value = o_bias ? b.weight(prefix + "o_proj.bias", {d.hidden}) : kNoValue;
  return b.linear(name + "o", merged, o_weight, o_bias_value);
}

ValueId mlp_block(GraphBuilder& b, const Dims& d, int64_t layer, ValueId x) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.";
  const std::string name = "layers." + std::to_string(layer) + ".mlp.";
  const ValueId gate = b.linear(name + "gate", x, b.weight(prefix + "gate_proj.weight", {d.intermediate, d.hidden}));
  const ValueId up = b.linear(name + "up", x, b.weight(prefix + "up_proj.weight", {d.intermediate, d.hidden}));
  const ValueId act = b.node("silu_mul", name + "act", {}, {gate, up});
  return b.linear(name + "down", act, b.weight(prefix + "down_proj.weight", {d.hidden, d.intermediate}));
}

}  // namespace

std::string native_architectures() {
  std::string text;
  for (const KnownArchitecture& known : kArchitectures)
    text += (text.empty() ? "" : ", ") + std::string(known.architecture) + " (" + known.model_type + ")";
  return text;
}

void check_native_support(const ModelConfig& config) {
  family_of(config);
  if (config.partial_rotary_factor != 1.0)
    fail(config.source + ": partial_rotary_factor " + std::to_string(config.partial_rotary_factor) +
         " is not supported by the native builder (Qwen2 and Llama rotate whole heads)");
  if (config.head_dim % 2 != 0)
    fail(config.source + ": head_dim " + std::to_string(config.head_dim) + " must be even for rotary embeddings");
}

std::vector<std::pair<std::string, std::string>> native_cache_pairs(const ModelConfig& config) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int64_t i = 0; i < 2 * config.num_hidden_layers; ++i)
    pairs.emplace_back("kv_" + std::to_string(i), "kv_" + std::to_string(i) + "_out");
  return pairs;
}

Graph build_native_graph(const ModelConfig& config, const NativeGraphOptions& options) {
  check_native_support(config);
  const Family family = family_of(config);
  if (options.tokens < 1)
    fail("native graph: tokens per step must be at least 1, got " + std::to_string(options.tokens));
  if (options.context < options.tokens)
    fail("native graph: a context of " + std::to_string(options.context) + " positions cannot hold " +
         std::to_string(options.tokens) + " tokens");
  const Dims d{options.tokens,
               options.context,
               config.hidden_size,
               config.num_attention_heads,
               config.num_key_value_heads,
               config.head_dim,
               config.intermediate_size,
               config.vocab_size};

  Graph graph;
  graph.model_name = config.model_type;
  graph.source = "native " + config.model_type + " graph (" + std::to_string(d.tokens) + " tokens, context " +
                 std::to_string(d.context) + ")";
  GraphBuilder b(graph);

  const ValueId ids = b.input("input_ids", int64s({1, d.tokens}));
  const ValueId position_ids = b.input("position_ids", int64s({1, d.tokens}));
  const ValueId cache_position = b.input("cache_position", int64s({d.tokens}));
  const ValueId mask = d.tokens > 1 ? b.input("attention_mask", floats({1, 1, d.tokens, d.context})) : kNoValue;

  const ValueId embed_weight = b.weight("model.embed_tokens.weight", {d.vocab, d.hidden});
  ValueId x = b.node("embedding", "embed", {}, {embed_weight, ids});

  const std::vector<float> inv_freq = config.rope_inv_freq(d.context);
  Tensor frequencies(DType::Float32, {static_cast<int64_t>(inv_freq.size())});
  std::copy(inv_freq.begin(), inv_freq.end(), frequencies.mutable_data<float>());
  Attrs rotary_attrs;
  rotary_attrs.set("attention_scaling", config.attention_scaling());
  const std::vector<ValueId> tables =
      b.nodes("rotary_embedding", "rotary", std::move(rotary_attrs),
              {b.constant("model.rotary_emb.inv_freq", frequencies), position_ids}, {"rotary.cos", "rotary.sin"});
  const ValueId cos = b.reshape("rotary.cos4", tables[0], {1, 1, d.tokens, d.head_dim});
  const ValueId sin = b.reshape("rotary.sin4", tables[1], {1, 1, d.tokens, d.head_dim});

  std::vector<ValueId> caches;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    const std::string name = "layers." + std::to_string(layer) + ".";
    const ValueId norm_in = b.weight(prefix + "input_layernorm.weight", {d.hidden});
    const ValueId h = b.rms_norm(name + "input_norm", x, norm_in, d.hidden, config.rms_norm_eps);
    const ValueId attn = attention_block(b, config, family, d, layer, h, cos, sin, cache_position, mask, caches);
    x = b.node("add", name + "attn_residual", {}, {x, attn});
    const ValueId norm_post = b.weight(prefix + "post_attention_layernorm.weight", {d.hidden});
    const ValueId m =
        mlp_block(b, d, layer, b.rms_norm(name + "post_norm", x, norm_post, d.hidden, config.rms_norm_eps));
    x = b.node("add", name + "mlp_residual", {}, {x, m});
  }

  if (!options.all_logits && d.tokens > 1) {
    Attrs attrs;
    attrs.set("dim", int64_t{1});
    attrs.set("start", d.tokens - 1);
    attrs.set("end", d.tokens);
    x = b.node("slice", "last_token", std::move(attrs), {x});
  }
  const ValueId final_norm = b.weight("model.norm.weight", {d.hidden});
  const ValueId h = b.rms_norm("final_norm", x, final_norm, d.hidden, config.rms_norm_eps);
  const ValueId head = config.tie_word_embeddings ? embed_weight : b.weight("lm_head.weight", {d.vocab, d.hidden});
  const ValueId logits = b.linear("logits", h, head);

  graph.outputs.push_back(logits);
  graph.outputs.insert(graph.outputs.end(), caches.begin(), caches.end());
  compiler::check_graph(graph, "native builder");
  return graph;
}

Tensor causal_chunk_mask(int64_t start, int64_t tokens, int64_t context) {
  Tensor mask(DType::Float32, {1, 1, tokens, context});
  float* row = mask.mutable_data<float>();
  for (int64_t i = 0; i < tokens; ++i, row += context)
    for (int64_t j = 0; j < context; ++j) row[j] = j <= start + i ? 0.0f : -std::numeric_limits<float>::infinity();
  return mask;
}

}  // namespace npusim
