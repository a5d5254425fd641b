// The small Qwen2 fixture: prefill logits and one decode step (logits and updated caches) against the
// Hugging Face reference outputs shipped with it.
#include <gtest/gtest.h>

#include "e2e_util.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "runtime/compare.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"

namespace npusim {
namespace {

const std::string kTiny = test::kFixtures + "/qwen_tiny";

WeightBinding bind_tiny(const Graph& graph) {
  WeightStore store;
  store.add_file(kTiny + "/model.safetensors");
  store.set_config(ModelConfig::load(kTiny + "/config.json"));
  return store.bind(graph);
}

Tensor int64_tensor(Shape shape, const std::vector<int64_t>& values) {
  Tensor t(DType::Int64, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.mutable_data<int64_t>()[i] = values[i];
  return t;
}

TEST(QwenTiny, PrefillLogitsMatchReference) {
  const Graph graph = read_torch_ir(kTiny + "/prefill_ir.json");
  const WeightBinding binding = bind_tiny(graph);
  const SafetensorsFile reference = SafetensorsFile::open(kTiny + "/reference.safetensors");
  const Tensor ids = reference.get("input_ids");
  const int64_t length = ids.shape().back();
  std::vector<int64_t> positions(static_cast<size_t>(length)), ones(static_cast<size_t>(length), 1);
  for (int64_t i = 0; i < length; ++i) positions[static_cast<size_t>(i)] = i;

  const ReferenceExecutor executor(graph, binding.tensors);
  const NamedTensors outputs = executor.run({{"input_ids", ids},
                                             {"attention_mask", int64_tensor({1, length}, ones)},
                                             {"position_ids", int64_tensor({1, length}, positions)},
                                             {"cache_position", int64_tensor({length}, positions)}});
  const Comparison logits = compare_tensors(outputs[0].second, reference.get("logits"));
  EXPECT_LT(logits.max_abs_diff, 1e-4) << logits.summary();
  EXPECT_TRUE(logits.all_argmax_match()) << logits.summary();
}

TEST(QwenTiny, DecodeLogitsAndCachesMatchReference) {
  const Graph graph = read_torch_ir(kTiny + "/decode_ir.json");
  const WeightBinding binding = bind_tiny(graph);
  const SafetensorsFile reference = SafetensorsFile::open(kTiny + "/decode_reference.safetensors");
  std::map<std::string, Tensor> inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = reference.get(graph.value(id).name);

  const ReferenceExecutor executor(graph, binding.tensors);
  const NamedTensors outputs = executor.run(inputs);
  ASSERT_EQ(outputs.size(), graph.outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string name = "out_" + std::to_string(i);
    ASSERT_TRUE(reference.contains(name)) << name;
    const Comparison c = compare_tensors(outputs[i].second, reference.get(name));
    EXPECT_LT(c.max_abs_diff, 1e-4) << name << " (" << outputs[i].first << "): " << c.summary();
  }
}

TEST(QwenTiny, MissingWeightsAreListedByName) {
  const Graph graph = read_torch_ir(kTiny + "/decode_ir.json");
  WeightStore store;
  store.set_config(ModelConfig::load(kTiny + "/config.json"));
  try {
    store.bind(graph);
    FAIL() << "binding without weight files must fail";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("q_proj.weight"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace npusim
