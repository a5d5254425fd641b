// ResNet-18 and ResNet-50 from the exported graphs against PyTorch: seeded weights (fp32, bf16, fp16 storage),
// non-trivial BatchNorm statistics, a synthetic image; the reference logits come from torchvision.
#include <gtest/gtest.h>

#include "compiler/compile.h"
#include "e2e_util.h"
#include "ir/torch_ir_reader.h"
#include "runtime/backend.h"
#include "runtime/compare.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "vision_case.h"

namespace npusim {
namespace {

using test::kFixtures;

struct ResNetCase {
  const char* arch;
  const char* weight_dtype;
};

// Each test gets its own directory (`label`): ctest runs tests in parallel.
std::string make_case(const ResNetCase& c, const Graph& graph, const std::string& label) {
  const std::string dir = test::work_dir(std::string(c.arch) + "_" + c.weight_dtype + "_" + label);
  const std::string command = test::kPython + " " + NPUSIM_PYTHON_DIR + "/make_resnet_case.py --arch " + c.arch +
                              " --seed 7 --weight-dtype " + c.weight_dtype + " --out " + dir + " --output-name " +
                              graph.value(graph.outputs[0]).name;
  const auto result = test::run_command(command);
  EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
  return dir;
}

class ResNetAgainstPyTorch : public ::testing::TestWithParam<ResNetCase> {};

TEST_P(ResNetAgainstPyTorch, LogitsAndTop5Match) {
  const ResNetCase c = GetParam();
  const Graph graph = read_torch_ir(kFixtures + "/ir/" + c.arch + "_ir.json");
  const std::string dir = make_case(c, graph, "reference");

  WeightStore store;
  store.add_file(dir + "/weights.safetensors");
  const WeightBinding binding = store.bind(graph);
  const SafetensorsFile inputs = SafetensorsFile::open(dir + "/inputs.safetensors");
  const SafetensorsFile reference = SafetensorsFile::open(dir + "/reference.safetensors");

  const ReferenceExecutor executor(graph, binding.tensors);
  const NamedTensors outputs = executor.run({{"x", inputs.get("x")}});
  ASSERT_EQ(outputs.size(), 1u);
  const Comparison comparison = compare_tensors(outputs[0].second, reference.get(outputs[0].first), 5);
  EXPECT_GT(comparison.pearson, 0.9999) << comparison.summary();
  EXPECT_TRUE(comparison.all_topk_match()) << comparison.summary();
  EXPECT_TRUE(comparison.all_argmax_match()) << comparison.summary();
  EXPECT_LT(comparison.max_abs_diff, 1e-3 * std::max(1.0, comparison.max_abs_reference)) << comparison.summary();
}

INSTANTIATE_TEST_SUITE_P(Models, ResNetAgainstPyTorch,
                         ::testing::Values(ResNetCase{"resnet18", "float32"}, ResNetCase{"resnet18", "bfloat16"},
                                           ResNetCase{"resnet18", "float16"}, ResNetCase{"resnet50", "float32"},
                                           ResNetCase{"resnet50", "bfloat16"}, ResNetCase{"resnet50", "float16"}),
                         [](const auto& info) { return std::string(info.param.arch) + "_" + info.param.weight_dtype; });

// The compiled program on the CPU backend, with activations and weights stored in fp32, fp16 or bf16.
struct CompiledCase {
  const char* arch;
  DType storage;
};

class CompiledResNetAgainstPyTorch : public ::testing::TestWithParam<CompiledCase> {};

TEST_P(CompiledResNetAgainstPyTorch, LogitsAndTop5Match) {
  const CompiledCase c = GetParam();
  const Graph graph = read_torch_ir(kFixtures + "/ir/" + c.arch + "_ir.json");
  const std::string dir =
      make_case({c.arch, "float32"}, graph, std::string("compiled_") + std::string(dtype_name(c.storage)));
  const Comparison comparison = test::compiled_on_cpu_against_reference(graph, c.storage, dir);
  const bool exact = c.storage == DType::Float32;
  EXPECT_GT(comparison.pearson, exact ? 0.99999 : 0.999) << comparison.summary();
  EXPECT_TRUE(comparison.all_topk_match()) << comparison.summary();
  EXPECT_TRUE(comparison.all_argmax_match()) << comparison.summary();
}

INSTANTIATE_TEST_SUITE_P(
    Storage, CompiledResNetAgainstPyTorch,
    ::testing::Values(CompiledCase{"resnet18", DType::Float32}, CompiledCase{"resnet18", DType::BFloat16},
                      CompiledCase{"resnet18", DType::Float16}, CompiledCase{"resnet50", DType::Float32},
                      CompiledCase{"resnet50", DType::BFloat16}),
    [](const auto& info) { return std::string(info.param.arch) + "_" + std::string(dtype_name(info.param.storage)); });

// The same check through the command line: run writes the outputs, verify compares them with the reference.
TEST(ResNetCli, RunThenVerify) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  const std::string dir = make_case({"resnet18", "float32"}, graph, "cli");
  const auto run = test::run_command(test::cli() + " run " + kFixtures + "/ir/resnet18_ir.json --weights " + dir +
                                     "/weights.safetensors --inputs " + dir + "/inputs.safetensors --outputs " + dir +
                                     "/cli_out.safetensors --top 5");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("top-5"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("latency"), std::string::npos) << run.output;
  // The pre-packing cost: time and the packed weights (ResNet-18's convolutions and classifier, never none).
  EXPECT_NE(run.output.find("MB of weights packed for the kernels"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(", 0.00 MB of weights packed"), std::string::npos) << run.output;
  const auto verify = test::run_command(test::cli() + " verify " + dir + "/cli_out.safetensors " + dir +
                                        "/reference.safetensors --min-pearson 0.9999");
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("OK"), std::string::npos) << verify.output;
}

}  // namespace
}  // namespace npusim
