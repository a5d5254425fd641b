// Compact bf16 linear weights (12 bits per value, lossless) on the qwen_tiny fixture: every linear weight of the
// fixture takes the compact form; sessions with it follow the sessions without it (the prompt's logits exactly: its
// products read the bf16 weights on the GEMM; the decode steps' within summation-order rounding), through the native
// builder and the exported graphs; and the `--compact-bf16` option of `npusim generate` and `npusim bench`.
#include <gtest/gtest.h>

#include "backends/cpu/compact_bf16.h"
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/packed_gemm.h"
#include "llm/model_dir.h"
#include "llm/sampler.h"
#include "llm/session.h"
#include "qwen_tiny.h"
#include "runtime/compare.h"
#include "runtime/safetensors.h"

namespace npusim {
namespace {

const std::string kTiny = test::kQwenTiny;

const ModelDir& tiny() {
  static const ModelDir model = test::copy_of_qwen_tiny("compact/qwen_tiny");
  return model;
}

SessionOptions plain(SessionOptions options) {
  options.compact_bf16 = false;
  return options;
}

TEST(CompactLlm, EveryLinearWeightOfTheFixtureIsCompact) {
  const SafetensorsFile& file = tiny().weights().files().at(0);
  int compacted = 0;
  for (const std::string& name : file.names()) {
    const Tensor weight = file.get(name).to(DType::BFloat16);
    if (weight.rank() != 2 || name.find("embed") != std::string::npos) continue;
    const auto compact = cpu::compact_bf16(weight.data<uint16_t>(), weight.dim(0), weight.dim(1));
    EXPECT_NE(compact, nullptr) << name;
    ++compacted;
  }
  EXPECT_GT(compacted, 10);
}

// The prompt, then greedy steps that follow the plain session's logits; both sessions see the same tokens.
void expect_logits_follow(const SessionOptions& options, const std::string& what, bool exact_prompt) {
  ASSERT_TRUE(compact_weights(options, DType::BFloat16)) << what;
  Session expected_session(tiny(), plain(options)), compact_session(tiny(), options);
  EXPECT_NE(compact_session.describe().find("12 bits"), std::string::npos) << compact_session.describe();
  EXPECT_EQ(expected_session.describe().find("12 bits"), std::string::npos) << expected_session.describe();
  const std::vector<int32_t> tokens = test::qwen_tiny_prompt();
  std::vector<float> expected = expected_session.feed(tokens), actual = compact_session.feed(tokens);
  if (exact_prompt) EXPECT_EQ(actual, expected) << what << ": the prompt's logits";
  for (int step = 0; step < 6; ++step) {
    const Comparison c = compare_tensors(test::logits_tensor(actual), test::logits_tensor(expected));
    EXPECT_GT(c.pearson, 0.99999) << what << ", step " << step << ": " << c.summary();
    EXPECT_TRUE(c.all_argmax_match()) << what << ", step " << step << ": " << c.summary();
    const int32_t next = argmax(expected);
    expected = expected_session.feed(std::span<const int32_t>(&next, 1));
    actual = compact_session.feed(std::span<const int32_t>(&next, 1));
  }
}

TEST(CompactLlm, NativeLogitsFollowThePlainSession) {
  expect_logits_follow({.context = 64, .dtype = DType::BFloat16, .threads = 2}, "native, whole prompt", true);
  expect_logits_follow({.context = 64, .prefill_chunk = 3, .dtype = DType::BFloat16, .threads = 1},
                       "native, chunks of 3", false);
}

TEST(CompactLlm, ExportedGraphsAreCompactToo) {
  expect_logits_follow(
      {.dtype = DType::BFloat16, .prefill_ir = kTiny + "/prefill_ir.json", .decode_ir = kTiny + "/decode_ir.json"},
      "exported graphs", true);
}

TEST(CompactLlm, AppliesToBf16WeightsOnTheCpuOnly) {
  const SessionOptions bf16{.dtype = DType::BFloat16};
  EXPECT_TRUE(compact_weights(bf16, DType::BFloat16));
  EXPECT_FALSE(compact_weights(bf16, DType::Float32));
  EXPECT_FALSE(compact_weights(plain(bf16), DType::BFloat16));
  EXPECT_FALSE(compact_weights({.backend = "cuda"}, DType::BFloat16));
  EXPECT_FALSE(compact_weights({.quantize = WeightQuantization::Int8}, DType::BFloat16));
  EXPECT_EQ(Session(tiny(), {.context = 64, .dtype = DType::Float32}).describe().find("12 bits"), std::string::npos);
}

// On the AVX2 tile the prompt's products read bf16 weights packed once, while a session holds them: its logits are
// those of the portable kernel's session within summation-order rounding.
TEST(CompactLlm, PromptsReadWeightsPrepackedForTheAvx2Tile) {
  if (!cpu::gemm_kernel_supported(cpu::GemmKernelChoice::Avx2)) GTEST_SKIP() << "needs AVX2";
  const SessionOptions options{.context = 64, .dtype = DType::BFloat16, .threads = 2};
  const std::vector<int32_t> tokens = test::qwen_tiny_prompt();
  ASSERT_GT(tokens.size(), cpu::kGemvMaxRows);  // the prompt's linear layers run on the GEMM
  cpu::set_gemm_kernel_choice(cpu::GemmKernelChoice::Portable);
  const std::vector<float> expected = Session(tiny(), options).feed(tokens);
  EXPECT_EQ(cpu::prepacked_weight_bytes(), 0);
  cpu::set_gemm_kernel_choice(cpu::GemmKernelChoice::Avx2);
  std::vector<float> actual;
  {
    Session session(tiny(), options);
    actual = session.feed(tokens);
    EXPECT_GT(cpu::prepacked_weight_bytes(), 0);
  }
  EXPECT_EQ(cpu::prepacked_weight_bytes(), 0);  // released with the session
  cpu::set_gemm_kernel_choice(cpu::GemmKernelChoice::Best);
  const Comparison c = compare_tensors(test::logits_tensor(actual), test::logits_tensor(expected));
  EXPECT_GT(c.pearson, 0.99999) << c.summary();
  EXPECT_TRUE(c.all_argmax_match()) << c.summary();
}

TEST(CompactLlm, CommandsTakeTheOption) {
  std::string ids;
  for (int32_t id : test::qwen_tiny_prompt()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string base = test::cli() + " generate --model " + tiny().path() + " --prompt-ids " + ids +
                           " --ids -n 4 --greedy --dtype bfloat16";
  const auto ids_of = [&](const std::string& options) {
    return test::run_command("{ " + base + options + " 2>/dev/null; }");
  };
  const test::CommandResult on = ids_of(""), off = ids_of(" --compact-bf16 off");
  ASSERT_EQ(on.exit_code, 0) << on.output;
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(on.output, off.output);
  EXPECT_EQ(ids_of(" --compact-bf16 on").output, on.output);
  for (const std::string bad : {" --compact-bf16 yes", " --compact-bf16 on --target cuda"}) {
    const test::CommandResult result = test::run_command(base + bad);
    EXPECT_NE(result.exit_code, 0) << bad;
    EXPECT_NE(result.output.find("--compact-bf16"), std::string::npos) << bad << ": " << result.output;
  }
  const test::CommandResult bench = test::run_command(test::cli() + " bench --model " + tiny().path() +
                                                      " --dtype bfloat16 --prompt-tokens 4 --gen-tokens 2 --no-probe");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("12 bits"), std::string::npos) << bench.output;
  const test::CommandResult misplaced =
      test::run_command(test::cli() + " bench " + kTiny + "/decode_ir.json --compact-bf16 off --no-probe");
  EXPECT_NE(misplaced.exit_code, 0);
  EXPECT_NE(misplaced.output.find("needs --model"), std::string::npos) << misplaced.output;
}

}  // namespace
}  // namespace npusim
