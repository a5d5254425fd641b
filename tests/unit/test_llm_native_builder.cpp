// The native graph of the Qwen2 and Llama families: inputs, outputs, weights by Hugging Face name (biases, tied
// or separate head), rotary frequencies from the configuration, the chunk mask, and what it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "llm/model_dir.h"
#include "llm/native_builder.h"
#include "unit/error_expectations.h"

namespace npusim {
namespace {

std::string config_json(const std::string& fields) {
  return R"({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 48, "vocab_size": 40, "max_position_embeddings": 128, "rms_norm_eps": 1e-5)" +
         fields + "}";
}

ModelConfig qwen2() {
  return ModelConfig::parse(config_json(R"(, "model_type": "qwen2", "tie_word_embeddings": true,
                                           "rope_theta": 1000000.0)"),
                            "qwen2.json");
}

ModelConfig llama(const std::string& extra = "") {
  return ModelConfig::parse(
      config_json(R"(, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0)" + extra),
      "llama.json");
}

std::set<std::string> weight_keys(const Graph& graph) {
  std::set<std::string> keys;
  for (ValueId id : graph.weights) keys.insert(graph.value(id).weight_key);
  return keys;
}

const Node& node_named(const Graph& graph, const std::string& name) {
  for (const Node& node : graph.nodes)
    if (node.name == name) return node;
  throw std::runtime_error("no node " + name);
}

using npusim::test::expect_error;

TEST(NativeBuilder, DecodeStepInputsOutputsAndCaches) {
  const Graph graph = build_native_graph(qwen2(), {.tokens = 1, .context = 16});
  std::vector<std::pair<std::string, Shape>> inputs;
  for (ValueId id : graph.inputs) inputs.emplace_back(graph.value(id).name, graph.value(id).meta.shape);
  const std::vector<std::pair<std::string, Shape>> expected{
      {"input_ids", {1, 1}},   {"position_ids", {1, 1}}, {"cache_position", {1}}, {"kv_0", {1, 2, 16, 8}},
      {"kv_1", {1, 2, 16, 8}}, {"kv_2", {1, 2, 16, 8}},  {"kv_3", {1, 2, 16, 8}}};
  EXPECT_EQ(inputs, expected);
  ASSERT_EQ(graph.outputs.size(), 5u);
  EXPECT_EQ(graph.value(graph.outputs[0]).meta.shape, (Shape{1, 1, 40}));
  const auto pairs = native_cache_pairs(qwen2());
  ASSERT_EQ(pairs.size(), 4u);
  for (size_t i = 0; i < pairs.size(); ++i) {
    EXPECT_EQ(pairs[i].first, "kv_" + std::to_string(i));
    const Value& out = graph.value(graph.outputs[1 + i]);
    EXPECT_EQ(out.name, pairs[i].second);
    EXPECT_EQ(out.meta.shape, (Shape{1, 2, 16, 8}));
    const Node& update = graph.nodes[static_cast<size_t>(out.producer)];
    EXPECT_EQ(update.op, "index_copy");
    EXPECT_EQ(graph.value(update.inputs[0]).name, pairs[i].first);
    EXPECT_EQ(update.attrs.get_int("dim"), 2);
  }
  // Attention reads the updated caches, bounded by cache_position, without a mask for one token.
  const Node& attention = node_named(graph, "layers.1.attn.sdpa");
  EXPECT_FALSE(attention.attrs.get_bool("has_mask"));
  EXPECT_TRUE(attention.attrs.get_bool("has_cache_position"));
  EXPECT_DOUBLE_EQ(attention.attrs.get_float("scale"), 1.0 / std::sqrt(8.0));
  EXPECT_EQ(graph.value(attention.inputs[1]).name, "kv_2_out");
  EXPECT_EQ(graph.value(attention.inputs[3]).name, "cache_position");
}

TEST(NativeBuilder, PrefillChunksTakeAMaskAndReturnTheLastLogits) {
  const Graph chunk = build_native_graph(qwen2(), {.tokens = 5, .context = 16});
  EXPECT_EQ(chunk.value(*chunk.find_value("attention_mask")).meta.shape, (Shape{1, 1, 5, 16}));
  EXPECT_TRUE(node_named(chunk, "layers.0.attn.sdpa").attrs.get_bool("has_mask"));
  EXPECT_EQ(chunk.value(chunk.outputs[0]).meta.shape, (Shape{1, 1, 40}));
  const Graph all = build_native_graph(qwen2(), {.tokens = 5, .context = 16, .all_logits = true});
  EXPECT_EQ(all.value(all.outputs[0]).meta.shape, (Shape{1, 5, 40}));
}

TEST(NativeBuilder, Qwen2HasQkvBiasesAndATiedHead) {
  const std::set<std::string> keys = weight_keys(build_native_graph(qwen2(), {.tokens = 1, .context = 4}));
  for (const char* key : {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.self_attn.q_proj.bias",
                          "model.layers.1.self_attn.k_proj.bias", "model.layers.1.self_attn.v_proj.bias",
                          "model.layers.0.mlp.down_proj.weight", "model.layers.0.post_attention_layernorm.weight"})
    EXPECT_TRUE(keys.count(key)) << key;
  EXPECT_FALSE(keys.count("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(keys.count("lm_head.weight"));
  // Every layer's 9 matrices and vectors + 3 biases, the embedding, the final norm and the rotary constant.
  EXPECT_EQ(keys.size(), 2u * 12u + 3u);
}

TEST(NativeBuilder, LlamaBiasesFollowAttentionBiasAndTheHeadIsSeparate) {
  std::set<std::string> keys = weight_keys(build_native_graph(llama(), {.tokens = 1, .context = 4}));
  EXPECT_TRUE(keys.count("lm_head.weight"));
  EXPECT_FALSE(keys.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(keys.count("model.layers.0.self_attn.o_proj.bias"));
  keys = weight_keys(build_native_graph(llama(R"(, "attention_bias": true)"), {.tokens = 1, .context = 4}));
  EXPECT_TRUE(keys.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(keys.count("model.layers.0.self_attn.o_proj.bias"));
}

TEST(NativeBuilder, RotaryFrequenciesComeFromTheConfiguration) {
  const ModelConfig scaled = llama(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16})");
  const Graph graph = build_native_graph(scaled, {.tokens = 1, .context = 4});
  const Tensor& frequencies = graph.constants.at("model.rotary_emb.inv_freq");
  const std::vector<float> expected = scaled.rope_inv_freq();
  ASSERT_EQ(frequencies.numel(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(frequencies.data<float>()[i], expected[static_cast<size_t>(i)]);
  // With this short original context every wavelength exceeds the high-frequency one: all are scaled down.
  const std::vector<float> plain = llama().rope_inv_freq();
  for (size_t i = 0; i < 4; ++i) EXPECT_LT(expected[i], plain[i]) << i;
  EXPECT_FLOAT_EQ(expected[3], plain[3] / 8.0f);  // the lowest frequency is divided by the factor

  const ModelConfig yarn = llama(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 32})");
  const Graph yarn_graph = build_native_graph(yarn, {.tokens = 1, .context = 4});
  EXPECT_DOUBLE_EQ(node_named(yarn_graph, "rotary").attrs.get_float("attention_scaling"), 0.1 * std::log(4.0) + 1.0);
}

TEST(NativeBuilder, ChunkMaskShowsEachRowItsPast) {
  const Tensor mask = causal_chunk_mask(2, 3, 6);
  ASSERT_EQ(mask.shape(), (Shape{1, 1, 3, 6}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      const float value = mask.data<float>()[i * 6 + j];
      if (j <= 2 + i)
        EXPECT_EQ(value, 0.0f) << i << "," << j;
      else
        EXPECT_EQ(value, -INFINITY) << i << "," << j;
    }
}

TEST(NativeBuilder, RefusesWhatItDoesNotBuild) {
  expect_error(
      [] {
        build_native_graph(ModelConfig::parse(config_json(R"(, "architectures": ["MambaForCausalLM"])"), "mamba.json"),
                           {.tokens = 1, .context = 4});
      },
      {"mamba.json", "unknown architecture MambaForCausalLM", "Qwen2ForCausalLM (qwen2)", "LlamaForCausalLM (llama)",
       "--prefill-ir"});
  expect_error([] { check_native_support(ModelConfig::parse(config_json(R"(, "model_type": "phi3")"), "phi.json")); },
               {"unknown model_type 'phi3'"});
  expect_error([] { check_native_support(llama(R"(, "partial_rotary_factor": 0.5)")); }, {"partial_rotary_factor"});
  expect_error([] { build_native_graph(qwen2(), {.tokens = 0, .context = 4}); }, {"at least 1"});
  expect_error([] { build_native_graph(qwen2(), {.tokens = 8, .context = 4}); }, {"cannot hold 8 tokens"});
}

TEST(GenerationConfig, ReadsSamplingDefaultsAndEosLists) {
  const GenerationConfig config = GenerationConfig::parse(
      R"({"do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.1,
          "eos_token_id": [151645, 151643], "bos_token_id": 151643})",
      "generation_config.json");
  EXPECT_EQ(config.do_sample, true);
  EXPECT_EQ(config.temperature, 0.7);
  EXPECT_EQ(config.top_k, 20);
  EXPECT_EQ(config.top_p, 0.8);
  EXPECT_FALSE(config.min_p.has_value());
  EXPECT_EQ(config.repetition_penalty, 1.1);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(config.bos_token_ids, (std::vector<int64_t>{151643}));
  expect_error([] { GenerationConfig::parse(R"({"top_k": 1.5})", "g.json"); },
               {"g.json", "'top_k' must be an integer"});
  expect_error([] { GenerationConfig::parse(R"({"temperature": "hot"})", "g.json"); },
               {"'temperature' must be a number"});
  expect_error([] { GenerationConfig::parse(R"({"eos_token_id": ["</s>"]})", "g.json"); }, {"token ids"});
  expect_error([] { GenerationConfig::parse("[1]", "g.json"); }, {"must be a JSON object"});
  expect_error([] { GenerationConfig::parse("{", "g.json"); }, {"not valid JSON"});
}

}  // namespace
}  // namespace npusim
