// npusim bench from the command line: the JSON summary on the last line, graphs, programs and model directories,
// and bad flags that fail naming the flag. Times are only checked for order, never for speed.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e_util.h"

namespace npusim {
namespace {

using test::cli;
using test::kFixtures;

// x [3, 5] -> linear(fc.weight [4, 5], no bias) -> relu -> [3, 4]: 2 * 3 * 4 * 5 = 120 FLOPs.
constexpr const char* kTinyGraph = R"({
  "model_name": "tiny_linear", "pytorch_version": "2.11.0",
  "graph_inputs": [{"name": "x", "shape": [3, 5], "dtype": "float32"}],
  "graph_outputs": [{"name": "relu", "shape": [3, 4], "dtype": "float32"}],
  "weights": [{"name": "fc.weight", "shape": [4, 5], "dtype": "float32"}],
  "weight_name_mapping": {"p_fc_weight": "fc.weight"},
  "nodes": [
    {"name": "linear", "op_type": "aten.linear.default",
     "inputs": [{"name": "x", "shape": [3, 5], "dtype": "float32", "producer_node": "x", "producer_output_idx": 0},
                {"name": "p_fc_weight", "shape": [4, 5], "dtype": "float32"}],
     "outputs": [{"name": "linear", "shape": [3, 4], "dtype": "float32"}], "attrs": {}},
    {"name": "relu", "op_type": "aten.relu.default",
     "inputs": [{"name": "linear", "shape": [3, 4], "dtype": "float32", "producer_node": "linear",
                 "producer_output_idx": 0}],
     "outputs": [{"name": "relu", "shape": [3, 4], "dtype": "float32"}], "attrs": {}}
  ]
})";

std::string tiny_graph() {
  const std::string path = test::work_dir("bench_cli") + "/tiny_linear.json";
  std::ofstream(path) << kTinyGraph;
  return path;
}

std::string last_line(const std::string& output) {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const size_t newline = text.rfind('\n');
  return newline == std::string::npos ? text : text.substr(newline + 1);
}

nlohmann::json bench_json(const std::string& arguments) {
  const auto result = test::run_command(cli() + " bench " + arguments + " --json");
  EXPECT_EQ(result.exit_code, 0) << arguments << "\n" << result.output;
  const nlohmann::json json = nlohmann::json::parse(last_line(result.output), nullptr, false);
  EXPECT_TRUE(json.is_object()) << "last line is not a JSON object:\n" << result.output;
  return json.is_object() ? json : nlohmann::json::object();
}

bool finite_number(const nlohmann::json& json, const std::string& key) {
  return json.contains(key) && json[key].is_number() && std::isfinite(json[key].get<double>());
}

void expect_ordered_times(const nlohmann::json& json) {
  for (const char* key : {"min_ms", "median_ms", "max_ms", "gflops", "gbps"})
    ASSERT_TRUE(finite_number(json, key)) << key << " in " << json.dump();
  EXPECT_GT(json["min_ms"].get<double>(), 0.0);
  EXPECT_LE(json["min_ms"].get<double>(), json["median_ms"].get<double>());
  EXPECT_LE(json["median_ms"].get<double>(), json["max_ms"].get<double>());
}

void expect_clean_failure(const std::string& arguments, const std::string& fragment) {
  const auto result = test::run_command(cli() + " bench " + arguments);
  EXPECT_NE(result.exit_code, 0) << arguments << "\n" << result.output;
  EXPECT_LT(result.exit_code, 128) << "crashed: " << arguments << "\n" << result.output;
  EXPECT_NE(result.output.find(fragment), std::string::npos) << arguments << "\n" << result.output;
}

TEST(BenchCli, JsonSummaryOfSmallGraph) {
  const nlohmann::json json =
      bench_json(tiny_graph() + " --random-weights 1 --random-inputs 2 --iters 7 --warmup 1 --threads 1 --no-probe");
  expect_ordered_times(json);
  EXPECT_EQ(json["threads"], 1);
  EXPECT_EQ(json["iters"], 7);
  EXPECT_EQ(json["warmup"], 1);
  EXPECT_EQ(json["dtype"], "float32");
  EXPECT_NEAR(json["gflop"].get<double>(), 120e-9, 1e-15);
  EXPECT_GT(json["gflops"].get<double>(), 0.0);
  // Every kernel reads its inputs and writes its output: at least x, the weight and the result (60 + 80 + 48).
  EXPECT_GE(json["bytes"].get<int64_t>(), 188);
  EXPECT_GT(json["gbps"].get<double>(), 0.0);
  EXPECT_FALSE(json.contains("peak_gbps")) << "--no-probe still probed";
}

TEST(BenchCli, EfficiencyAgainstTheProbe) {
  const nlohmann::json json =
      bench_json(tiny_graph() + " --random-weights 1 --random-inputs 2 --iters 3 --warmup 0 --threads 2");
  expect_ordered_times(json);
  EXPECT_EQ(json["threads"], 2);
  for (const char* key : {"peak_gbps", "peak_gflops", "gbps_efficiency", "gflops_efficiency"}) {
    ASSERT_TRUE(finite_number(json, key)) << key << " in " << json.dump();
    EXPECT_GT(json[key].get<double>(), 0.0) << key;
  }
  EXPECT_NEAR(json["gbps_efficiency"].get<double>(), json["gbps"].get<double>() / json["peak_gbps"].get<double>(),
              1e-9);
  EXPECT_NEAR(json["gflops_efficiency"].get<double>(), json["gflops"].get<double>() / json["peak_gflops"].get<double>(),
              1e-9);
}

TEST(BenchCli, CompiledProgram) {
  const std::string program = test::work_dir("bench_cli") + "/tiny_linear.npubin";
  const auto compiled = test::run_command(cli() + " compile " + tiny_graph() + " -o " + program);
  ASSERT_EQ(compiled.exit_code, 0) << compiled.output;
  const nlohmann::json json =
      bench_json(program + " --random-weights 1 --random-inputs 2 --iters 4 --warmup 0 --threads 1 --no-probe");
  expect_ordered_times(json);
  EXPECT_EQ(json["file"], program);
  EXPECT_NEAR(json["gflop"].get<double>(), 120e-9, 1e-15);
}

TEST(BenchCli, ModelDirectory) {
  const nlohmann::json json = bench_json("--model " + kFixtures +
                                         "/qwen_tiny --prompt-tokens 9 --gen-tokens 5 --iters 2 --warmup 1 "
                                         "--threads 1 --no-probe");
  expect_ordered_times(json);
  EXPECT_EQ(json["prompt_tokens"], 9);
  EXPECT_EQ(json["gen_tokens"], 5);
  EXPECT_EQ(json["iters"], 2);
  EXPECT_EQ(json["threads"], 1);
  for (const char* key : {"prompt_ms", "prompt_tok_s", "decode_tok_s", "decode_gbps", "prompt_gflops"}) {
    ASSERT_TRUE(finite_number(json, key)) << key << " in " << json.dump();
    EXPECT_GT(json[key].get<double>(), 0.0) << key;
  }
  EXPECT_NEAR(json["prompt_tok_s"].get<double>(), 9.0 / (json["prompt_ms"].get<double>() / 1e3), 1e-6);
  EXPECT_DOUBLE_EQ(json["gbps"].get<double>(), json["decode_gbps"].get<double>());
  ASSERT_TRUE(finite_number(json, "weight_mb") && finite_number(json, "peak_memory_mb")) << json.dump();
  EXPECT_GT(json["peak_memory_mb"].get<double>(), json["weight_mb"].get<double>());
  EXPECT_EQ(json["linear_weights"], "float32");
}

// The JSON says which form the linear weights were read in, so that a table can set each against its peer.
TEST(BenchCli, ModelDirectoryNamesItsLinearWeights) {
  const std::string common = "--model " + kFixtures +
                             "/qwen_tiny --prompt-tokens 3 --gen-tokens 2 --iters 1 "
                             "--warmup 0 --threads 1 --no-probe ";
  EXPECT_EQ(bench_json(common + "--quantize int8")["linear_weights"], "int8");
  EXPECT_EQ(bench_json(common + "--dtype bfloat16")["linear_weights"], "bfloat16 (12-bit compact)");
  EXPECT_EQ(bench_json(common + "--dtype bfloat16 --compact-bf16 off")["linear_weights"], "bfloat16");
}

TEST(BenchCli, ModelDirectoryThroughExportedGraphs) {
  const std::string tiny = kFixtures + "/qwen_tiny";
  const nlohmann::json json =
      bench_json("--model " + tiny + " --prefill-ir " + tiny + "/prefill_ir.json --decode-ir " + tiny +
                 "/decode_ir.json --prompt-tokens 4 --gen-tokens 3 --iters 1 " + "--warmup 1 --threads 1 --no-probe");
  expect_ordered_times(json);
  EXPECT_NE(json["session"].get<std::string>().find("exported"), std::string::npos) << json.dump();
  EXPECT_GT(json["decode_tok_s"].get<double>(), 0.0);
}

// NPUSIM_CPU_ISA caps the kernels' instruction sets: the probe reports the capped features and a graph still runs.
TEST(BenchCli, IsaCapChoosesOlderKernels) {
  for (const std::string isa : {"portable", "avx2", "avx512"}) {
    const auto probe = test::run_command("NPUSIM_CPU_ISA=" + isa + " " + cli() + " probe --json");
    ASSERT_EQ(probe.exit_code, 0) << probe.output;
    const nlohmann::json json = nlohmann::json::parse(last_line(probe.output), nullptr, false);
    ASSERT_TRUE(json.is_object() && json.contains("features")) << probe.output;
    if (isa != "avx512") {
      EXPECT_FALSE(json["features"]["avx512f"].get<bool>()) << isa;
      EXPECT_FALSE(json["features"]["avx512bf16"].get<bool>()) << isa;
    }
    if (isa == "portable") EXPECT_FALSE(json["features"]["avx2"].get<bool>());
    const auto run = test::run_command("NPUSIM_CPU_ISA=" + isa + " " + cli() + " bench " + tiny_graph() +
                                       " --random-weights 1 --random-inputs 2 --iters 2 --warmup 0 --no-probe");
    EXPECT_EQ(run.exit_code, 0) << isa << "\n" << run.output;
  }
  const auto bad = test::run_command("NPUSIM_CPU_ISA=sse9 " + cli() + " bench " + tiny_graph() +
                                     " --random-weights 1 --random-inputs 2");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("NPUSIM_CPU_ISA must be portable, avx2, avx512 or amx, got 'sse9'"), std::string::npos)
      << bad.output;
}

TEST(BenchCli, ProfileGivesEachKernelsFastestTime) {
  const auto result = test::run_command(cli() + " bench " + tiny_graph() +
                                        " --random-weights 1 --random-inputs 2 --iters 3 --warmup 0 --threads 1"
                                        " --no-probe --profile --json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("per kernel, its fastest of 3 profiled runs"), std::string::npos) << result.output;
  for (const char* row : {"linear ", "relu ", "total "})
    EXPECT_NE(result.output.find(std::string("\n") + row), std::string::npos) << row << "\n" << result.output;
  const nlohmann::json json = nlohmann::json::parse(last_line(result.output), nullptr, false);
  ASSERT_TRUE(json.is_object()) << "the JSON object is no longer the last line:\n" << result.output;
  expect_ordered_times(json);
}

TEST(BenchCli, BadFlagsNameTheFlag) {
  const std::string graph = tiny_graph();
  expect_clean_failure(graph + " --random-weights 1 --random-inputs 2 --frobnicate", "unknown option '--frobnicate'");
  expect_clean_failure(graph + " --random-weights 1 --random-inputs 2 --iters 0", "'--iters'");
  expect_clean_failure(graph + " --random-weights 1 --random-inputs 2 --iters many", "'--iters'");
  expect_clean_failure(graph + " --random-weights 1 --random-inputs 2 --warmup -1", "'--warmup'");
  expect_clean_failure(graph + " --random-weights 1 --random-inputs 2 --threads", "'--threads'");
  expect_clean_failure(graph + " --random-weights 1 --random-inputs 2 --gen-tokens 4", "'--gen-tokens' needs --model");
  expect_clean_failure("", "expected one graph or program file");
  expect_clean_failure(graph + " " + graph, "expected one graph or program file");
  const std::string tiny_model = kFixtures + "/qwen_tiny";
  expect_clean_failure("--model " + tiny_model + " --weights w.safetensors", "'--weights' applies to graphs");
  expect_clean_failure("--model " + tiny_model + " " + graph, "--model takes no graph");
  expect_clean_failure("--model " + tiny_model + " --profile", "'--profile' applies to graphs");
  expect_clean_failure("--model " + tiny_model + " --prompt-tokens 0", "'--prompt-tokens'");
  expect_clean_failure("--model " + tiny_model + " --dtype int8", "--dtype must be");
  expect_clean_failure("--model " + tiny_model + " --ctx 16 --prompt-tokens 12 --gen-tokens 8", "--ctx");
  expect_clean_failure("--model /nonexistent/model_dir", "/nonexistent/model_dir");
}

}  // namespace
}  // namespace npusim
