#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "llm/model_config.h"
#include "npusim/error.h"
#include "unit/error_expectations.h"
#include "work_dir.h"

using namespace npusim;

namespace {

const std::string kQwenTiny = NPUSIM_TEST_DATA "/fixtures/qwen_tiny/config.json";
const std::string kQwen15 = NPUSIM_TEST_DATA "/fixtures/qwen2.5-1.5b-instruct/config.json";

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = npusim::test::fresh_work_dir("config") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A small Llama-style config in the classic layout; `extra` is spliced in as more top-level fields.
std::string llama_config(const std::string& extra) {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 1000,
             "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16")" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

void expect_inv_freq(const std::vector<float>& actual, const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-6 * std::abs(expected[i])) << "index " << i;
}

using npusim::test::expect_error;

// torch 1.13: 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), then the scaling
// formulas of transformers' modeling_rope_utils, evaluated with torch tensors.
const std::vector<float> kQwenTinyInvFreq = {1.0f,           0.177827939f,   0.0316227786f,   0.00562341325f,
                                             0.00100000005f, 0.00017782794f, 3.16227743e-05f, 5.62341347e-06f};
// theta 500000, head_dim 32, factor 8, low 1, high 4, original context 8192: indices 0-7 are high frequency
// (kept), 8 is smoothed, 9-15 are divided by 8.
const std::vector<float> kLlama3InvFreq = {1.0f,
                                           0.440366626f,
                                           0.193922758f,
                                           0.0853971019f,
                                           0.0376060307f,
                                           0.0165604409f,
                                           0.00729266508f,
                                           0.00321144611f,
                                           0.000524846022f,
                                           7.78465546e-05f,
                                           3.42810235e-05f,
                                           1.50962178e-05f,
                                           6.64786967e-06f,
                                           2.92749974e-06f,
                                           1.28917316e-06f,
                                           5.6770881e-07f};

}  // namespace

TEST(ModelConfig, ReadsTheTransformers5Layout) {
  const ModelConfig config = ModelConfig::load(kQwenTiny);
  EXPECT_EQ(config.source, kQwenTiny);
  EXPECT_EQ(config.model_type, "qwen2");
  EXPECT_TRUE(config.architectures.empty());  // null in the file
  EXPECT_EQ(config.hidden_size, 64);
  EXPECT_EQ(config.num_hidden_layers, 2);
  EXPECT_EQ(config.num_attention_heads, 4);
  EXPECT_EQ(config.num_key_value_heads, 2);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.intermediate_size, 176);
  EXPECT_EQ(config.vocab_size, 512);
  EXPECT_EQ(config.max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(config.partial_rotary_factor, 1.0);
  EXPECT_EQ(config.rope_scaling.type, "default");
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_TRUE(config.attention_bias);
  EXPECT_EQ(config.dtype, DType::Float32);
  EXPECT_TRUE(config.bos_token_ids.empty());
  EXPECT_TRUE(config.eos_token_ids.empty());
  EXPECT_EQ(config.rotary_dim(), 16);
  EXPECT_DOUBLE_EQ(config.attention_scaling(), 1.0);
}

TEST(ModelConfig, ReadsTheClassicLayout) {
  const ModelConfig config = ModelConfig::load(kQwen15);
  EXPECT_EQ(config.model_type, "qwen2");
  EXPECT_EQ(config.architectures, (std::vector<std::string>{"Qwen2ForCausalLM"}));
  EXPECT_EQ(config.hidden_size, 1536);
  EXPECT_EQ(config.num_hidden_layers, 28);
  EXPECT_EQ(config.num_attention_heads, 12);
  EXPECT_EQ(config.num_key_value_heads, 2);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.intermediate_size, 8960);
  EXPECT_EQ(config.vocab_size, 151936);
  EXPECT_EQ(config.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(config.rope_theta, 1e6);
  EXPECT_EQ(config.rope_scaling.type, "default");
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_TRUE(config.attention_bias);
  EXPECT_EQ(config.dtype, DType::BFloat16);
  EXPECT_EQ(config.bos_token_ids, (std::vector<int64_t>{151643}));
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{151645}));

  const std::vector<float> inv_freq = config.rope_inv_freq();
  ASSERT_EQ(inv_freq.size(), 64u);
  EXPECT_EQ(inv_freq[0], 1.0f);
  EXPECT_NEAR(inv_freq[1], 0.8058422207832336f, 1e-6 * 0.806);
  EXPECT_NEAR(inv_freq[2], 0.6493816375732422f, 1e-6 * 0.649);
  EXPECT_NEAR(inv_freq[63], 1.2409377632138785e-06f, 1e-6 * 1.241e-06);
}

TEST(ModelConfig, DefaultInvFreqMatchesHuggingFace) {
  expect_inv_freq(ModelConfig::load(kQwenTiny).rope_inv_freq(), kQwenTinyInvFreq);
}

TEST(ModelConfig, AppliesDefaultsForAbsentFields) {
  const ModelConfig config = ModelConfig::parse(llama_config(""), "inline");
  EXPECT_EQ(config.num_key_value_heads, 4);
  EXPECT_EQ(config.head_dim, 32);
  EXPECT_DOUBLE_EQ(config.rope_theta, 10000.0);
  EXPECT_EQ(config.rope_scaling.type, "default");
  EXPECT_FALSE(config.attention_bias);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);
  EXPECT_EQ(config.dtype, DType::BFloat16);
  // theta 10000 over 32 channels: 10000^(-i/16).
  const std::vector<float> inv_freq = config.rope_inv_freq();
  ASSERT_EQ(inv_freq.size(), 16u);
  EXPECT_EQ(inv_freq[0], 1.0f);
  EXPECT_NEAR(inv_freq[4], 0.1f, 1e-7);
  EXPECT_NEAR(inv_freq[8], 0.01f, 1e-8);
  EXPECT_NEAR(inv_freq[12], 0.001f, 1e-9);
}

TEST(ModelConfig, ExplicitHeadDimAndPartialRotary) {
  const ModelConfig config = ModelConfig::parse(
      llama_config(R"("head_dim": 16, "partial_rotary_factor": 0.5, "num_key_value_heads": 2, "attention_bias": true)"),
      "inline");
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.num_key_value_heads, 2);
  EXPECT_TRUE(config.attention_bias);
  EXPECT_EQ(config.rotary_dim(), 8);
  // 10000^(-i/4) for i = 0..3.
  expect_inv_freq(config.rope_inv_freq(), {1.0f, 0.1f, 0.01f, 0.001f});
}

TEST(ModelConfig, Llama3ScalingClassicLayout) {
  const std::string path = write_config("config.json", llama_config(R"(
      "rope_theta": 500000.0, "eos_token_id": [128001, 128008, 128009], "bos_token_id": 128000,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"})"));
  const ModelConfig config = ModelConfig::load(path);
  EXPECT_EQ(config.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(config.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(config.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(config.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(config.bos_token_ids, (std::vector<int64_t>{128000}));
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  expect_inv_freq(config.rope_inv_freq(), kLlama3InvFreq);
  EXPECT_DOUBLE_EQ(config.attention_scaling(), 1.0);
}

TEST(ModelConfig, Llama3ScalingTransformers5Layout) {
  const ModelConfig config = ModelConfig::parse(llama_config(R"(
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                                                "inline");
  EXPECT_DOUBLE_EQ(config.rope_theta, 500000.0);
  expect_inv_freq(config.rope_inv_freq(), kLlama3InvFreq);
}

TEST(ModelConfig, LinearScalingDividesByTheFactor) {
  // The old spelling "type" is accepted too.
  const ModelConfig config = ModelConfig::parse(
      llama_config(R"("head_dim": 16, "rope_scaling": {"type": "linear", "factor": 4.0})"), "inline");
  EXPECT_EQ(config.rope_scaling.type, "linear");
  expect_inv_freq(config.rope_inv_freq(), {0.25f, 0.079056941f, 0.0250000004f, 0.00790569466f, 0.00249999994f,
                                           0.000790569466f, 0.000250000012f, 7.90569466e-05f});
}

TEST(ModelConfig, DynamicScalingGrowsThetaPastTheTrainedLength) {
  const ModelConfig config = ModelConfig::parse(llama_config(R"("head_dim": 16, "max_position_embeddings": 256,
                      "rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"),
                                                "inline");
  // Up to max_position_embeddings it is the default RoPE.
  const std::vector<float> at_init = config.rope_inv_freq();
  ASSERT_EQ(at_init.size(), 8u);
  EXPECT_NEAR(at_init[4], 0.01f, 1e-8);
  EXPECT_EQ(config.rope_inv_freq(200), at_init);
  // theta * (2 * 1024 / 256 - 1)^(16 / 14)
  expect_inv_freq(config.rope_inv_freq(1024), {1.0f, 0.239481375f, 0.057351321f, 0.0137345716f, 0.00328917382f,
                                               0.00078769587f, 0.000188638471f, 4.51753949e-05f});
}

TEST(ModelConfig, YarnScaling) {
  const std::string rope = R"("head_dim": 64, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0,
                              "factor": 4.0, "original_max_position_embeddings": 2048)";
  const ModelConfig config = ModelConfig::parse(llama_config(rope + "}"), "inline");
  // Correction range [8, 21]: below 8 extrapolated (default), above 21 interpolated (default / 4).
  expect_inv_freq(config.rope_inv_freq(), {1.0f,
                                           0.749894202f,
                                           0.562341332f,
                                           0.421696514f,
                                           0.316227764f,
                                           0.237137362f,
                                           0.177827939f,
                                           0.133352146f,
                                           0.100000001f,
                                           0.070663102f,
                                           0.0497455746f,
                                           0.0348710567f,
                                           0.0243252143f,
                                           0.0168732349f,
                                           0.0116272122f,
                                           0.00794983935f,
                                           0.00538461516f,
                                           0.00360526075f,
                                           0.00237913639f,
                                           0.00154081406f,
                                           0.000973008573f,
                                           0.000592843455f,
                                           0.000444569858f,
                                           0.000333380362f,
                                           0.000250000012f,
                                           0.000187473546f,
                                           0.000140585325f,
                                           0.000105424122f,
                                           7.90569466e-05f,
                                           5.92843462e-05f,
                                           4.44569851e-05f,
                                           3.33380376e-05f});
  EXPECT_NEAR(config.attention_scaling(), 0.1 * std::log(4.0) + 1.0, 1e-12);

  const ModelConfig given = ModelConfig::parse(llama_config(rope + R"(, "attention_factor": 1.5})"), "inline");
  EXPECT_DOUBLE_EQ(given.attention_scaling(), 1.5);
  const ModelConfig mscaled =
      ModelConfig::parse(llama_config(rope + R"(, "mscale": 2.0, "mscale_all_dim": 1.0})"), "inline");
  EXPECT_NEAR(mscaled.attention_scaling(), (0.2 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0), 1e-12);
}

TEST(ModelConfig, ErrorsNameTheFileAndField) {
  const std::string missing = write_config("missing.json", R"({"model_type": "llama", "num_hidden_layers": 2})");
  expect_error([&] { ModelConfig::load(missing); }, {missing, "'hidden_size'", "missing"});
  expect_error([&] { ModelConfig::parse(llama_config(R"("hidden_size": "128")"), "cfg.json"); },
               {"cfg.json", "'hidden_size'", "must be an integer"});
  expect_error([&] { ModelConfig::parse(llama_config(R"("num_key_value_heads": 3)"), "cfg.json"); },
               {"cfg.json", "'num_key_value_heads'"});
  expect_error([&] { ModelConfig::parse(llama_config(R"("torch_dtype": "float8")"), "cfg.json"); },
               {"cfg.json", "'torch_dtype'", "float8"});
  expect_error(
      [&] {
        ModelConfig::parse(llama_config(R"("rope_scaling": {"rope_type": "longrope", "factor": 2.0})"), "cfg.json");
      },
      {"cfg.json", "rope_scaling.rope_type", "'longrope'"});
  expect_error(
      [&] {
        ModelConfig::parse(llama_config(R"("rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                           "cfg.json");
      },
      {"cfg.json", "'rope_parameters.low_freq_factor'", "llama3"});
  expect_error([&] { ModelConfig::parse(llama_config(R"("rope_scaling": {"rope_type": "linear"})"), "cfg.json"); },
               {"cfg.json", "'rope_scaling.factor'", "required"});
  expect_error([&] { ModelConfig::parse("{\"hidden_size\": ", "cfg.json"); }, {"cfg.json", "not valid JSON"});
  expect_error([&] { ModelConfig::parse("[1]", "cfg.json"); }, {"cfg.json", "JSON object"});
  expect_error([&] { ModelConfig::load("/nonexistent/config.json"); }, {"/nonexistent/config.json", "cannot open"});

  ModelConfig bogus = ModelConfig::load(kQwenTiny);
  bogus.rope_scaling.type = "su";
  expect_error([&] { bogus.rope_inv_freq(); }, {kQwenTiny, "'su'"});
}
