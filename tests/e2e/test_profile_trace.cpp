// Mixed execution from the command line: `compile --report` shows the partitions and transfers before anything
// runs, `--no-fallback` lists the ops the target lacks, `run --profile` prints kernels, partitions and transfers,
// and `run --trace` writes a Chrome trace that parses as JSON with one event per kernel of the program.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "compiler/compile.h"
#include "e2e_util.h"
#include "ir/torch_ir_reader.h"
#include "npusim/error.h"
#include "runtime/dag_executor.h"
#include "runtime/profiler.h"
#include "runtime/random_fill.h"

namespace npusim {
namespace {

using test::cli;
using test::kFixtures;

std::string tensor_meta(const std::string& name, const std::string& shape, const std::string& producer = "") {
  std::string meta = R"({"name": ")" + name + R"(", "shape": )" + shape + R"(, "dtype": "float32")";
  if (!producer.empty()) meta += R"(, "producer_node": ")" + producer + R"(", "producer_output_idx": 0)";
  return meta + "}";
}

// x [3, 4] -> linear -> relu -> cumsum along 1 -> mul(cumsum, relu) -> softmax along 1.
std::string small_model_ir() {
  const std::string x = tensor_meta("x", "[3, 4]", "x");
  auto node = [](const std::string& name, const std::string& op, const std::string& inputs, const std::string& attrs) {
    return R"({"name": ")" + name + R"(", "op_type": ")" + op + R"(", "inputs": [)" + inputs + R"(], "outputs": [)" +
           tensor_meta(name, op == "aten.linear.default" ? "[3, 5]" : "[3, 5]") + R"(], "attrs": )" + attrs + "}";
  };
  return R"({"model_name": "Small", "graph_inputs": [)" + tensor_meta("x", "[3, 4]") + R"(],
    "graph_outputs": [)" +
         tensor_meta("softmax", "[3, 5]") + R"(],
    "weights": [)" +
         tensor_meta("fc.weight", "[5, 4]") + ", " + tensor_meta("fc.bias", "[5]") + R"(],
    "weight_name_mapping": {"p_fc_weight": "fc.weight", "p_fc_bias": "fc.bias"},
    "nodes": [)" +
         node("linear", "aten.linear.default",
              x + ", " + tensor_meta("p_fc_weight", "[5, 4]") + ", " + tensor_meta("p_fc_bias", "[5]"), "{}") +
         ", " + node("relu", "aten.relu.default", tensor_meta("linear", "[3, 5]", "linear"), "{}") + ", " +
         node("cumsum", "aten.cumsum.default", tensor_meta("relu", "[3, 5]", "relu"), R"({"dim": 1})") + ", " +
         node("mul", "aten.mul.Tensor",
              tensor_meta("cumsum", "[3, 5]", "cumsum") + ", " + tensor_meta("relu", "[3, 5]", "relu"), "{}") +
         ", " + node("softmax", "aten.softmax.int", tensor_meta("mul", "[3, 5]", "mul"), R"({"dim": 1})") + "]}";
}

struct Files {
  std::string dir, model, target, strict;
};

Files write_files() {
  Files f;
  f.dir = test::work_dir("profile_trace");
  f.model = f.dir + "/small.json";
  f.target = f.dir + "/npu_lite.json";
  f.strict = f.dir + "/npu_strict.json";
  std::ofstream(f.model) << small_model_ir();
  std::ofstream(f.target) << R"({"name": "npu-lite", "backend": "cpu", "ops": ["linear", "relu", "mul", "softmax"],
                                 "fallback": "cpu"})";
  std::ofstream(f.strict) << R"({"name": "npu-strict", "backend": "cpu", "ops": ["linear", "relu", "mul", "softmax"],
                                 "fallback": ""})";
  return f;
}

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << path;
  std::stringstream text;
  text << file.rdbuf();
  return nlohmann::json::parse(text.str());  // throws, failing the test, when the trace is not valid JSON
}

// The checks a trace viewer relies on: complete events with numeric ts and dur in microseconds, and tracks.
struct TraceSummary {
  std::map<std::string, int> events_by_category;
  std::set<int> kernel_tracks;
  std::set<std::string> kernel_names;
  std::map<int, std::string> track_names;
};

TraceSummary check_trace(const nlohmann::json& trace) {
  TraceSummary summary;
  EXPECT_TRUE(trace.is_object());
  EXPECT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());
  for (const auto& event : trace["traceEvents"]) {
    EXPECT_TRUE(event.contains("ph") && event.contains("pid") && event.contains("tid") && event.contains("name"))
        << event.dump();
    if (event["ph"] == "M") {
      if (event["name"] == "thread_name") summary.track_names[event["tid"].get<int>()] = event["args"]["name"];
      continue;
    }
    EXPECT_EQ(event["ph"], "X") << event.dump();
    EXPECT_TRUE(event["ts"].is_number() && event["dur"].is_number()) << event.dump();
    EXPECT_GE(event["ts"].get<double>(), 0.0);
    EXPECT_GE(event["dur"].get<double>(), 0.0);
    const std::string category = event["cat"];
    ++summary.events_by_category[category];
    if (category == "kernel") {
      summary.kernel_tracks.insert(event["tid"].get<int>());
      EXPECT_TRUE(summary.kernel_names.insert(event["name"].get<std::string>()).second) << event.dump();
      EXPECT_TRUE(event["args"].contains("op") && event["args"].contains("bytes")) << event.dump();
    }
  }
  return summary;
}

TEST(ProfileTrace, ReportShowsPartitionsAndTransfersBeforeRunning) {
  const Files f = write_files();
  const auto report = test::run_command(cli() + " compile " + f.model + " --target " + f.target + " --report");
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_TRUE(contains(report.output, "cumsum                           1  on FALLBACK cpu")) << report.output;
  EXPECT_TRUE(contains(report.output, "partitions: 3 (2 on npu-lite, 1 on the fallback cpu), 2 transfers of 120 B"))
      << report.output;
  EXPECT_TRUE(contains(report.output, "#0 npu-lite (cpu): 2 ops: linear x1, relu x1")) << report.output;
  EXPECT_TRUE(contains(report.output, "#1 fallback (cpu): 1 op: cumsum x1\n      nodes: cumsum")) << report.output;
  EXPECT_TRUE(contains(report.output, "#2 npu-lite (cpu): 2 ops: mul x1, softmax x1")) << report.output;
  EXPECT_TRUE(std::regex_search(report.output, std::regex(R"(relu +\[3, 5\] float32  #0 -> #1 \(fallback\)  60 B)")))
      << report.output;
  EXPECT_TRUE(std::regex_search(report.output, std::regex(R"(cumsum +\[3, 5\] float32  #1 -> #2 \(target\)  60 B)")))
      << report.output;

  const auto strict =
      test::run_command(cli() + " compile " + f.model + " --target " + f.target + " --report --no-fallback");
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_TRUE(contains(strict.output, "without fallback (ops it cannot run: cumsum)")) << strict.output;
  EXPECT_TRUE(contains(strict.output, "node 'cumsum' (cumsum)")) << strict.output;
  const auto none = test::run_command(cli() + " compile " + f.model + " --target " + f.strict + " --report");
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_TRUE(contains(none.output, "node 'cumsum' (cumsum)")) << none.output;

  // Columns: cpu, cuda, reference, then the target.
  const auto table = test::run_command(cli() + " ops --target " + f.target);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_TRUE(std::regex_search(table.output,
                                std::regex(R"(\ncumsum +(kernel|generic) +(kernel|generic) +kernel +fallback cpu\n)")))
      << table.output;
  EXPECT_TRUE(
      std::regex_search(table.output, std::regex(R"(\nrelu +(kernel|generic) +(kernel|generic) +kernel +yes\n)")));
}

TEST(ProfileTrace, RunSplitProfilesAndTracesEveryKernel) {
  const Files f = write_files();
  const std::string trace_path = f.dir + "/small_trace.json";
  std::remove(trace_path.c_str());
  const std::string common = " --random-weights 3 --random-inputs 4 --outputs ";
  const auto split = test::run_command(cli() + " run " + f.model + " --target " + f.target + common + f.dir +
                                       "/split.safetensors --profile --trace " + trace_path);
  ASSERT_EQ(split.exit_code, 0) << split.output;
  for (const std::string& fragment :
       std::vector<std::string>{"kernel (op)", "linear", "cumsum", "softmax", "total", "npu-lite (cpu)",
                                "fallback (cpu)", "transfer (value)", "#0 -> #1", "#1 -> #2", "GB/s",
                                "npu-lite on cpu, float32, 3 partitions, 1 of 5 nodes on the fallback cpu",
                                "wrote trace " + trace_path + " (5 kernels)"})
    EXPECT_TRUE(contains(split.output, fragment)) << fragment << "\n" << split.output;

  const TraceSummary trace = check_trace(read_json(trace_path));
  EXPECT_EQ(trace.events_by_category.at("kernel"), 5);  // linear, relu, cumsum, mul, softmax
  EXPECT_EQ(trace.kernel_names, (std::set<std::string>{"linear", "relu", "cumsum", "mul", "softmax"}));
  EXPECT_EQ(trace.events_by_category.at("partition"), 3);
  EXPECT_EQ(trace.events_by_category.at("transfer"), 2);
  EXPECT_EQ(trace.kernel_tracks, (std::set<int>{1, 2, 3}));  // one track per partition
  EXPECT_EQ(trace.track_names.at(2), "#1 fallback (cpu)");
  EXPECT_EQ(trace.track_names.at(4), "transfers");

  // The same outputs as the single-backend run and as the reference.
  const auto single = test::run_command(cli() + " run " + f.model + common + f.dir + "/single.safetensors");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const auto reference =
      test::run_command(cli() + " run " + f.model + " --reference" + common + f.dir + "/reference.safetensors");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto same =
      test::run_command(cli() + " verify " + f.dir + "/split.safetensors " + f.dir + "/single.safetensors");
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_TRUE(contains(same.output, "max|diff| 0 ")) << same.output;
  const auto close =
      test::run_command(cli() + " verify " + f.dir + "/split.safetensors " + f.dir + "/reference.safetensors");
  EXPECT_EQ(close.exit_code, 0) << close.output;
}

TEST(ProfileTrace, CompiledProgramRunsSplitWithItsTargetFile) {
  const Files f = write_files();
  const std::string program = f.dir + "/small.npubin";
  const auto compiled = test::run_command(cli() + " compile " + f.model + " --target " + f.target + " -o " + program);
  ASSERT_EQ(compiled.exit_code, 0) << compiled.output;
  const auto run = test::run_command(cli() + " run " + program + " --target " + f.target +
                                     " --random-weights 3 --random-inputs 4 --profile");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "3 partitions")) << run.output;
  const auto without = test::run_command(cli() + " run " + program + " --random-weights 3 --random-inputs 4");
  EXPECT_EQ(without.exit_code, 1) << without.output;
  EXPECT_TRUE(contains(without.output, "compiled for target 'npu-lite'; give its target file with --target"))
      << without.output;
  const auto trace_reference = test::run_command(cli() + " run " + f.model +
                                                 " --reference --random-weights 3 "
                                                 "--random-inputs 4 --trace " +
                                                 f.dir + "/no.json");
  EXPECT_EQ(trace_reference.exit_code, 1) << trace_reference.output;
  EXPECT_TRUE(contains(trace_reference.output, "leave out --reference")) << trace_reference.output;
}

// ResNet-18 on the CPU target: one partition; the trace has exactly one kernel event per kernel of the program.
TEST(ProfileTrace, ResNetTraceHasOneEventPerKernel) {
  const std::string dir = test::work_dir("profile_trace");
  const std::string model = kFixtures + "/ir/resnet18_ir.json";
  const std::string trace_path = dir + "/resnet18_trace.json";
  const auto compiled = test::run_command(cli() + " compile " + model + " -o " + dir + "/resnet18.npubin");
  ASSERT_EQ(compiled.exit_code, 0) << compiled.output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(compiled.output, match, std::regex(R"(\((\d+) kernels)"))) << compiled.output;
  const int kernels = std::stoi(match[1]);
  EXPECT_GT(kernels, 20);
  const auto run = test::run_command(cli() + " run " + dir +
                                     "/resnet18.npubin --random-weights 1 --random-inputs 2 "
                                     "--profile --trace " +
                                     trace_path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "(" + std::to_string(kernels) + " kernels)")) << run.output;
  const TraceSummary trace = check_trace(read_json(trace_path));
  EXPECT_EQ(trace.events_by_category.at("kernel"), kernels);
  EXPECT_EQ(trace.events_by_category.at("partition"), 1);
  EXPECT_EQ(trace.events_by_category.count("transfer"), 0u);
  EXPECT_EQ(trace.kernel_tracks, (std::set<int>{1}));
}

// The trace written from a profile directly: kernel events nest inside their partition's event.
TEST(ProfileTrace, KernelEventsNestInTheirPartition) {
  const Graph graph = parse_torch_ir(small_model_ir(), "small.json");
  compiler::CompileOptions options;
  options.target = write_files().target;
  compiler::CompileReport report;
  const Program program = compiler::compile_graph(graph, options, &report);
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (ValueId id : program.graph.weights) weights.emplace_back(id, random_weight(program.graph.value(id), 5));
  DagExecutor executor(program, report.partitions, weights);
  executor.set_profiling(true);
  executor.run({{"x", random_input(program.graph.value(program.graph.inputs[0]), 6)}});
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace(executor.last_profile()));
  std::map<int, std::pair<double, double>> partitions;  // track -> [start, end]
  for (const auto& event : trace["traceEvents"])
    if (event.value("cat", "") == "partition")
      partitions[event["tid"]] = {event["ts"].get<double>(), event["ts"].get<double>() + event["dur"].get<double>()};
  ASSERT_EQ(partitions.size(), 3u);
  int kernels = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event.value("cat", "") != "kernel") continue;
    ++kernels;
    const auto [start, end] = partitions.at(event["tid"]);
    EXPECT_GE(event["ts"].get<double>(), start) << event.dump();
    EXPECT_LE(event["ts"].get<double>() + event["dur"].get<double>(), end + 1e-6) << event.dump();
  }
  EXPECT_EQ(kernels, static_cast<int>(program.graph.nodes.size()));
}

}  // namespace
}  // namespace npusim

namespace npusim {
namespace {

RunProfile two_kernels(double first_us, double second_us, double transfer_us) {
  RunProfile profile;
  profile.partitions = {
      {.label = "p0", .backend = "cpu", .duration_us = first_us + second_us + transfer_us, .kernels = 2}};
  profile.kernels = {{.node = "conv", .op = "conv2d", .duration_us = first_us},
                     {.node = "relu", .op = "relu", .start_us = first_us, .duration_us = second_us}};
  profile.transfers = {{.value = "x", .duration_us = transfer_us}};
  profile.total_us = first_us + second_us + transfer_us;
  return profile;
}

TEST(ProfileTrace, FastestOfKeepsEachKernelsShorterTime) {
  const RunProfile fastest = fastest_of(two_kernels(10.0, 3.0, 2.0), two_kernels(7.0, 5.0, 1.0));
  ASSERT_EQ(fastest.kernels.size(), 2u);
  EXPECT_EQ(fastest.kernels[0].duration_us, 7.0);
  EXPECT_EQ(fastest.kernels[1].duration_us, 3.0);
  EXPECT_EQ(fastest.kernels[1].node, "relu");
  EXPECT_EQ(fastest.transfers[0].duration_us, 1.0);
  EXPECT_EQ(fastest.partitions[0].duration_us, 13.0);
  EXPECT_EQ(fastest.total_us, 13.0);
}

TEST(ProfileTrace, FastestOfRefusesProfilesOfOtherPrograms) {
  RunProfile other = two_kernels(1.0, 1.0, 1.0);
  other.kernels[1].node = "sigmoid";
  EXPECT_THROW(fastest_of(two_kernels(1.0, 1.0, 1.0), other), Error);
  other.kernels.pop_back();
  EXPECT_THROW(fastest_of(two_kernels(1.0, 1.0, 1.0), other), Error);
}

}  // namespace
}  // namespace npusim
