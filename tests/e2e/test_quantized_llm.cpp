// Int8 weight-only quantization on the qwen_tiny fixture: logits of every step against the unquantized session in the
// same storage dtype (Pearson r > 0.999, same argmax), through the native builder (prefill on the GEMM, decode on the
// GEMV) and the exported graphs, and the `--quantize` option of `npusim generate`.
#include <gtest/gtest.h>

#include "llm/model_dir.h"
#include "llm/sampler.h"
#include "llm/session.h"
#include "qwen_tiny.h"
#include "runtime/compare.h"

namespace npusim {
namespace {

const std::string kTiny = test::kQwenTiny;

const ModelDir& tiny() {
  static const ModelDir model = test::copy_of_qwen_tiny("quantized/qwen_tiny");
  return model;
}

SessionOptions with_int8(SessionOptions options, int64_t group = 0) {
  options.quantize = WeightQuantization::Int8;
  options.quantization_group = group;
  return options;
}

// The prompt, then greedy steps that follow the unquantized logits; both sessions see the same tokens.
void expect_logits_follow(const SessionOptions& plain_options, const SessionOptions& int8_options,
                          const std::string& what) {
  Session plain(tiny(), plain_options), quantized(tiny(), int8_options);
  const std::vector<int32_t> tokens = test::qwen_tiny_prompt();
  std::vector<float> expected = plain.feed(tokens), actual = quantized.feed(tokens);
  for (int step = 0; step < 6; ++step) {
    const Comparison c = compare_tensors(test::logits_tensor(actual), test::logits_tensor(expected));
    EXPECT_GT(c.pearson, 0.999) << what << ", step " << step << ": " << c.summary();
    EXPECT_TRUE(c.all_argmax_match()) << what << ", step " << step << ": " << c.summary();
    EXPECT_GT(c.max_abs_diff, 0.0) << what << ": the int8 session gave the unquantized logits exactly";
    const int32_t next = argmax(expected);
    expected = plain.feed(std::span<const int32_t>(&next, 1));
    actual = quantized.feed(std::span<const int32_t>(&next, 1));
  }
}

TEST(QuantizedLlm, NativeInt8LogitsFollowBf16) {
  const SessionOptions bf16{.context = 64, .dtype = DType::BFloat16, .threads = 2};
  expect_logits_follow(bf16, with_int8(bf16), "bf16, int8 per channel");
  expect_logits_follow(bf16, with_int8(bf16, 32), "bf16, int8 in groups of 32");
}

TEST(QuantizedLlm, NativeInt8LogitsFollowFp32WithSmallPrefillChunks) {
  const SessionOptions fp32{.context = 64, .prefill_chunk = 4, .dtype = DType::Float32, .threads = 1};
  expect_logits_follow(fp32, with_int8(fp32), "fp32, chunks of 4");
}

TEST(QuantizedLlm, ExportedGraphsQuantizeToo) {
  const SessionOptions bf16{
      .dtype = DType::BFloat16, .prefill_ir = kTiny + "/prefill_ir.json", .decode_ir = kTiny + "/decode_ir.json"};
  expect_logits_follow(bf16, with_int8(bf16), "exported graphs");
}

TEST(QuantizedLlm, DescribesAndChecksTheQuantization) {
  const SessionOptions bf16{.context = 64, .dtype = DType::BFloat16};
  EXPECT_NE(Session(tiny(), with_int8(bf16)).describe().find("int8"), std::string::npos);
  EXPECT_NE(Session(tiny(), with_int8(bf16, 16)).describe().find("groups of 16"), std::string::npos);
  EXPECT_EQ(Session(tiny(), bf16).describe().find("int8"), std::string::npos);
  EXPECT_THROW(Session(tiny(), with_int8(bf16, 12)), Error);
  EXPECT_THROW(Session(tiny(), with_int8(bf16, -8)), Error);
}

TEST(QuantizedLlm, GenerateCommandTakesQuantize) {
  std::string ids;
  for (int32_t id : test::qwen_tiny_prompt()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string base = test::cli() + " generate --model " + tiny().path() + " --prompt-ids " + ids +
                           " --ids -n 4 --greedy --dtype bfloat16";
  // stdout only: the token ids
  const auto ids_of = [&](const std::string& options) {
    return test::run_command("{ " + base + options + " 2>/dev/null; }");
  };
  const test::CommandResult plain = ids_of("");
  const test::CommandResult int8 = ids_of(" --quantize int8");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(int8.exit_code, 0) << int8.output;
  EXPECT_EQ(int8.output, plain.output);  // greedy tokens survive the quantization on this fixture
  EXPECT_EQ(ids_of(" --quantize int8 --quantize-group 32").output, plain.output);
  for (const std::string bad : {" --quantize int4", " --quantize-group 12 --quantize int8", " --quantize-group 32"}) {
    const test::CommandResult result = test::run_command(base + bad);
    EXPECT_NE(result.exit_code, 0) << bad;
    EXPECT_NE(result.output.find("quantize"), std::string::npos) << bad << ": " << result.output;
  }
}

}  // namespace
}  // namespace npusim
