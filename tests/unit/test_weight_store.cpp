#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "npusim/error.h"
#include "npusim/graph.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "work_dir.h"

using namespace npusim;

namespace {

const std::string kTiny = NPUSIM_TEST_DATA "/fixtures/qwen_tiny/";

std::string fresh_dir() { return npusim::test::fresh_work_dir("weights") + "/"; }

std::map<std::string, Tensor> by_key(const Graph& graph, const WeightBinding& binding) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [id, tensor] : binding.tensors) tensors[graph.value(id).weight_key] = tensor;
  return tensors;
}

bool has_note(const WeightBinding& binding, const std::vector<std::string>& parts) {
  for (const std::string& note : binding.notes) {
    bool all = true;
    for (const std::string& part : parts) all = all && note.find(part) != std::string::npos;
    if (all) return true;
  }
  return false;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << "expected '" << part << "' in: " << text;
}

Tensor filled(DType dtype, Shape shape, float first) {
  Tensor tensor(DType::Float32, std::move(shape));
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.mutable_data<float>()[i] = first + static_cast<float>(i);
  return tensor.to(dtype);
}

// A hand-made graph whose weights are consumed by one opaque node each (unless `used` is false).
struct GraphBuilder {
  Graph graph;

  GraphBuilder() { graph.source = "test_graph.json"; }

  ValueId weight(const std::string& placeholder, const std::string& key, Shape shape, bool used = true,
                 DType dtype = DType::Float32) {
    Value value;
    value.name = placeholder;
    value.weight_key = key;
    value.meta = {std::move(shape), dtype};
    value.kind = ValueKind::Weight;
    const auto id = static_cast<ValueId>(graph.values.size());
    graph.values.push_back(value);
    graph.weights.push_back(id);
    if (used) {
      Node node;
      node.name = "use_" + placeholder;
      node.op = "opaque";
      node.inputs = {id};
      graph.nodes.push_back(node);
    }
    return id;
  }
};

const std::vector<float> kQwenTinyInvFreq = {1.0f,           0.177827939f,   0.0316227786f,   0.00562341325f,
                                             0.00100000005f, 0.00017782794f, 3.16227743e-05f, 5.62341347e-06f};

}  // namespace

TEST(WeightStore, BindsTheQwenTinyPrefillGraph) {
  const Graph graph = read_torch_ir(kTiny + "prefill_ir.json");
  WeightStore store;
  store.add_file(kTiny + "model.safetensors");
  store.set_config(ModelConfig::load(kTiny + "config.json"));
  const WeightBinding binding = store.bind(graph);
  const auto tensors = by_key(graph, binding);

  // 34 weights; the embedding (the tied head is used instead) and original_inv_freq are consumed by no node.
  EXPECT_EQ(binding.tensors.size(), 32u);
  EXPECT_EQ(tensors.count("model.model.embed_tokens.weight"), 0u);
  EXPECT_EQ(tensors.count("model.model.rotary_emb.original_inv_freq"), 0u);
  for (size_t i = 1; i < binding.tensors.size(); ++i)  // graph.weights order
    EXPECT_LT(binding.tensors[i - 1].first, binding.tensors[i].first);

  // Prefix stripping: model.model.layers.0... is found as model.layers.0..., borrowed from the mapping.
  const SafetensorsFile file = SafetensorsFile::open(kTiny + "model.safetensors");
  const Tensor up = tensors.at("model.model.layers.0.mlp.up_proj.weight");
  const Tensor expected_up = file.get("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.shape(), (Shape{176, 64}));
  EXPECT_EQ(std::memcmp(up.bytes(), expected_up.bytes(), expected_up.nbytes()), 0);
  EXPECT_THROW(Tensor(up).mutable_bytes(), Error);
  const Tensor bias = tensors.at("model.model.layers.1.self_attn.q_proj.bias");
  EXPECT_EQ(std::memcmp(bias.bytes(), file.get("model.layers.1.self_attn.q_proj.bias").bytes(), 64 * 4), 0);

  // The tied LM head is the embedding.
  const Tensor head = tensors.at("model.lm_head.weight");
  const Tensor embed = file.get("model.embed_tokens.weight");
  EXPECT_EQ(head.shape(), (Shape{512, 64}));
  EXPECT_EQ(std::memcmp(head.bytes(), embed.bytes(), embed.nbytes()), 0);
  EXPECT_TRUE(
      has_note(binding, {"model.lm_head.weight", "p_model_lm_head_weight", "tied", "model.embed_tokens.weight"}));

  // inv_freq comes from config.json and matches Hugging Face's fp32 computation.
  const Tensor inv_freq = tensors.at("model.model.rotary_emb.inv_freq");
  ASSERT_EQ(inv_freq.dtype(), DType::Float32);
  ASSERT_EQ(inv_freq.shape(), (Shape{8}));
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(inv_freq.data<float>()[i], kQwenTinyInvFreq[i], 1e-6 * kQwenTinyInvFreq[i]) << i;
  EXPECT_TRUE(has_note(binding, {"model.model.rotary_emb.inv_freq", "config.json"}));

  // The exported mask's lifted 0.0 scalar is zero-filled with a note; the empty KV-cache seeds are empty.
  const Tensor scalar = tensors.at("model.model.lifted_tensor_0");
  EXPECT_EQ(scalar.shape(), Shape{});
  EXPECT_EQ(scalar.data<float>()[0], 0.0f);
  EXPECT_TRUE(has_note(binding, {"c_model_model_lifted_tensor_0", "zeros"}));
  const Tensor seed = tensors.at("model.model.layers.1.self_attn.lifted_tensor_4");
  EXPECT_EQ(seed.shape(), (Shape{0}));
  EXPECT_EQ(seed.numel(), 0);
  EXPECT_EQ(binding.notes.size(), 3u);
}

TEST(WeightStore, ListsEveryMissingWeightInOneError) {
  const Graph graph = read_torch_ir(kTiny + "prefill_ir.json");
  const std::string partial = fresh_dir() + "partial.safetensors";
  SafetensorsFile full = SafetensorsFile::open(kTiny + "model.safetensors");
  write_safetensors(partial, {{"model.embed_tokens.weight", full.get("model.embed_tokens.weight")},
                              {"model.norm.weight", full.get("model.norm.weight")}});
  WeightStore store;
  store.add_file(partial);  // and no config
  const std::string message = error_of([&] { store.bind(graph); });
  expect_contains(message,
                  {kTiny + "prefill_ir.json", "25 weights were not found", partial,
                   "'model.model.layers.0.mlp.up_proj.weight' (placeholder "
                   "p_model_model_layers_0_mlp_up_proj_weight) [176, 64] float32",
                   "'model.model.layers.1.self_attn.v_proj.bias'", "p_model_model_layers_1_self_attn_v_proj_bias",
                   "'model.model.rotary_emb.inv_freq'", "--config"});
  // Found ones are not listed.
  EXPECT_EQ(message.find("'model.model.norm.weight'"), std::string::npos) << message;
  EXPECT_EQ(message.find("'model.lm_head.weight'"), std::string::npos) << message;

  const std::string no_files = error_of([&] { WeightStore().bind(graph); });
  expect_contains(no_files, {"no weight files were given", "'model.model.norm.weight'"});
}

TEST(WeightStore, ResolutionOrder) {
  const std::string dir = fresh_dir();
  write_safetensors(dir + "a.safetensors", {{"enc.w", filled(DType::Float32, {2}, 10)},
                                            {"p_raw", filled(DType::Float32, {3}, 20)},
                                            {"layers.0.w", filled(DType::Float32, {2}, 30)},
                                            {"shared", filled(DType::Float32, {2}, 40)},
                                            {"conflict", filled(DType::Float32, {2}, 50)}});
  write_safetensors(dir + "b.safetensors", {{"shared", filled(DType::Float32, {2}, 60)},
                                            {"model.layers.0.w", filled(DType::Float32, {2}, 70)},
                                            {"only_b", filled(DType::BFloat16, {2}, 80)},
                                            {"conflict", filled(DType::Float32, {4}, 90)}});
  GraphBuilder builder;
  const ValueId from_constant = builder.weight("p_enc_w", "enc.w", {2});
  builder.graph.constants["enc.w"] = filled(DType::Float32, {2}, 1);
  const ValueId by_placeholder = builder.weight("p_raw", "wrapper.raw", {3});
  const ValueId stripped = builder.weight("p_model_model_layers_0_w", "model.model.layers.0.w", {2});
  const ValueId first_file = builder.weight("p_shared", "shared", {2});
  const ValueId keeps_dtype = builder.weight("p_only_b", "only_b", {2});
  builder.weight("p_conflict", "conflict", {2}, /*used=*/false);

  WeightStore store;
  store.add_file(dir + "a.safetensors");
  store.add_file(dir + "b.safetensors");
  const WeightBinding binding = store.bind(builder.graph);
  std::map<ValueId, Tensor> tensors(binding.tensors.begin(), binding.tensors.end());
  ASSERT_EQ(tensors.size(), 5u);
  EXPECT_EQ(tensors.at(from_constant).data<float>()[0], 1.0f);    // IR constants beat the files
  EXPECT_EQ(tensors.at(by_placeholder).data<float>()[2], 22.0f);  // found by placeholder name
  // "model.model.layers.0.w" -> "model.layers.0.w" (file b) is tried before "layers.0.w" (file a).
  EXPECT_EQ(tensors.at(stripped).data<float>()[0], 70.0f);
  EXPECT_EQ(tensors.at(first_file).data<float>()[0], 40.0f);  // first file added wins
  EXPECT_EQ(tensors.at(keeps_dtype).dtype(), DType::BFloat16);
  EXPECT_EQ(tensors.at(keeps_dtype).to(DType::Float32).data<float>()[1], 81.0f);
  EXPECT_TRUE(binding.notes.empty());

  // The conflicting name is an error once a node uses it.
  Node use_conflict;
  use_conflict.name = "use_conflict";
  use_conflict.inputs = {builder.graph.weights.back()};
  builder.graph.nodes.push_back(use_conflict);
  expect_contains(error_of([&] { store.bind(builder.graph); }),
                  {"'conflict'", "[2]", dir + "a.safetensors", "[4]", dir + "b.safetensors"});
}

TEST(WeightStore, ShapeMismatchNamesWeightFileAndShapes) {
  const std::string path = fresh_dir() + "w.safetensors";
  write_safetensors(path, {{"fc.weight", filled(DType::Float32, {3, 4}, 0)}});
  GraphBuilder builder;
  builder.weight("p_fc_weight", "fc.weight", {4, 3});
  WeightStore store;
  store.add_file(path);
  expect_contains(error_of([&] { store.bind(builder.graph); }),
                  {"test_graph.json", "'fc.weight'", "p_fc_weight", path, "[3, 4]", "graph expects [4, 3]"});
}

TEST(WeightStore, SkipsUnusedWeightsAndBindsGraphOutputs) {
  const std::string path = fresh_dir() + "w.safetensors";
  write_safetensors(path, {{"out", filled(DType::Float32, {2}, 5)}});
  GraphBuilder builder;
  builder.weight("p_unused", "unused", {7}, /*used=*/false);  // absent from the file, but nobody needs it
  const ValueId output = builder.weight("p_out", "out", {2}, /*used=*/false);
  builder.graph.outputs.push_back(output);
  WeightStore store;
  store.add_file(path);
  const WeightBinding binding = store.bind(builder.graph);
  ASSERT_EQ(binding.tensors.size(), 1u);
  EXPECT_EQ(binding.tensors[0].first, output);
  EXPECT_EQ(binding.tensors[0].second.data<float>()[1], 6.0f);
}

TEST(WeightStore, BindsTheSourcesOfDerivedWeights) {
  const std::string path = fresh_dir() + "w.safetensors";
  write_safetensors(
      path, {{"conv.weight", filled(DType::Float32, {2, 1}, 1)}, {"bn.running_var", filled(DType::Float32, {2}, 3)}});
  GraphBuilder builder;
  const ValueId conv = builder.weight("p_conv_weight", "conv.weight", {2, 1}, /*used=*/false);
  const ValueId var = builder.weight("b_bn_running_var", "bn.running_var", {2}, /*used=*/false);
  builder.weight("p_bn_weight", "bn.weight", {2}, /*used=*/false);  // not a source, not in the file
  const ValueId folded = builder.weight("folded_conv_weight", "folded_conv_weight", {2, 1});
  builder.graph.value(folded).transform = WeightTransform{"bn_fold_weight", {conv, kNoValue, var}, {}};
  WeightStore store;
  store.add_file(path);
  const WeightBinding binding = store.bind(builder.graph);
  ASSERT_EQ(binding.tensors.size(), 3u);
  EXPECT_EQ(binding.tensors[0].first, conv);
  EXPECT_EQ(binding.tensors[0].second.data<float>()[1], 2.0f);
  EXPECT_EQ(binding.tensors[1].first, var);
  EXPECT_EQ(binding.tensors[1].second.data<float>()[0], 3.0f);
  // The derived weight itself, computed at bind time: W * 1 / sqrt(var + eps).
  EXPECT_EQ(binding.tensors[2].first, folded);
  EXPECT_NEAR(binding.tensors[2].second.data<float>()[0], 1.0 / std::sqrt(3.0 + 1e-5), 1e-6);
  EXPECT_NEAR(binding.tensors[2].second.data<float>()[1], 2.0 / std::sqrt(4.0 + 1e-5), 1e-6);
}

TEST(WeightStore, TiesGpt2StyleHeadAndPrefersStoredInvFreq) {
  const std::string path = fresh_dir() + "w.safetensors";
  write_safetensors(path, {{"transformer.wte.weight", filled(DType::Float32, {4, 2}, 0)},
                           {"model.rotary_emb.inv_freq", filled(DType::Float32, {8}, 100)}});
  GraphBuilder builder;
  const ValueId head = builder.weight("p_lm_head_weight", "lm_head.weight", {4, 2});
  const ValueId inv_freq = builder.weight("b_model_rotary_emb_inv_freq", "model.rotary_emb.inv_freq", {8});
  WeightStore store;
  store.add_file(path);
  store.set_config(ModelConfig::load(kTiny + "config.json"));
  const WeightBinding binding = store.bind(builder.graph);
  std::map<ValueId, Tensor> tensors(binding.tensors.begin(), binding.tensors.end());
  EXPECT_EQ(tensors.at(head).data<float>()[7], 7.0f);
  EXPECT_EQ(tensors.at(inv_freq).data<float>()[0], 100.0f);  // the file wins over the config
  ASSERT_EQ(binding.notes.size(), 1u);
  expect_contains(binding.notes[0], {"'lm_head.weight'", "tied", "'transformer.wte.weight'", path});
}

TEST(WeightStore, ComputedInvFreqMustMatchTheGraphShape) {
  GraphBuilder builder;
  builder.weight("b_rotary_emb_inv_freq", "rotary_emb.inv_freq", {32});
  WeightStore store;
  expect_contains(error_of([&] { store.bind(builder.graph); }), {"'rotary_emb.inv_freq'", "--config"});
  store.set_config(ModelConfig::load(kTiny + "config.json"));  // head_dim 16: 8 frequencies
  expect_contains(error_of([&] { store.bind(builder.graph); }),
                  {"'rotary_emb.inv_freq'", "config.json", "[8]", "graph expects [32]"});
}

TEST(WeightStore, LiftedConstantsWithoutData) {
  GraphBuilder builder;
  const ValueId empty = builder.weight("c_lifted_tensor_0", "lifted_tensor_0", {0}, true, DType::BFloat16);
  const ValueId mask = builder.weight("c_lifted_tensor_1", "lifted_tensor_1", {2, 3}, true, DType::Int64);
  const ValueId regular = builder.weight("p_missing", "missing", {2});
  WeightStore store;
  expect_contains(error_of([&] { store.bind(builder.graph); }), {"1 weight was not found", "'missing'"});

  builder.graph.nodes.pop_back();  // drop the consumer of p_missing
  const WeightBinding binding = store.bind(builder.graph);
  std::map<ValueId, Tensor> tensors(binding.tensors.begin(), binding.tensors.end());
  EXPECT_EQ(tensors.count(regular), 0u);
  EXPECT_EQ(tensors.at(empty).dtype(), DType::BFloat16);
  EXPECT_EQ(tensors.at(empty).shape(), (Shape{0}));
  EXPECT_EQ(tensors.at(mask).dtype(), DType::Int64);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(tensors.at(mask).data<int64_t>()[i], 0);
  ASSERT_EQ(binding.notes.size(), 1u);
  expect_contains(binding.notes[0], {"'lifted_tensor_1'", "c_lifted_tensor_1", "zeros"});
}
