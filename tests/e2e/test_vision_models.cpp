// Torchvision models without a torch_ir fixture (MobileNetV2: depthwise convolutions, ReLU6, inverted residuals;
// ConvNeXt-T: 7x7 depthwise convolutions, permutes to channels-last and back, layer norms, GELU, layer scales)
// against PyTorch: make_resnet_case.py writes seeded weights, a synthetic image, PyTorch's logits and the graph in
// torch_ir's format from a torch.fx trace; the compiled program runs on the CPU backend in fp32, fp16 and bf16
// storage.
#include <gtest/gtest.h>

#include "e2e_util.h"
#include "ir/torch_ir_reader.h"
#include "vision_case.h"

namespace npusim {
namespace {

struct VisionCase {
  const char* arch;
  DType storage;
  double min_pearson;
  const char* output = "linear";  // the classifier's node name in the traced graph
};

class VisionModelAgainstPyTorch : public ::testing::TestWithParam<VisionCase> {};

TEST_P(VisionModelAgainstPyTorch, LogitsAndTop5Match) {
  const VisionCase c = GetParam();
  const std::string dir = test::work_dir(std::string(c.arch) + "_" + std::string(dtype_name(c.storage)));
  const std::string command = test::kPython + " " + NPUSIM_PYTHON_DIR + "/make_resnet_case.py --arch " + c.arch +
                              " --seed 7 --out " + dir + " --output-name " + c.output + " --ir " + dir + "/ir.json";
  const auto made = test::run_command(command);
  ASSERT_EQ(made.exit_code, 0) << command << "\n" << made.output;

  const Comparison comparison =
      test::compiled_on_cpu_against_reference(read_torch_ir(dir + "/ir.json"), c.storage, dir);
  EXPECT_GT(comparison.pearson, c.min_pearson) << comparison.summary();
  EXPECT_TRUE(comparison.all_topk_match()) << comparison.summary();
  EXPECT_TRUE(comparison.all_argmax_match()) << comparison.summary();
}

// PyTorch's own bf16 forward of the same model reaches Pearson r 0.9975 against its fp32 logits.
INSTANTIATE_TEST_SUITE_P(Models, VisionModelAgainstPyTorch,
                         ::testing::Values(VisionCase{"mobilenet_v2", DType::Float32, 0.99999},
                                           VisionCase{"mobilenet_v2", DType::Float16, 0.9999},
                                           VisionCase{"mobilenet_v2", DType::BFloat16, 0.995},
                                           VisionCase{"convnext_tiny", DType::Float32, 0.99999, "linear_36"}),
                         [](const auto& info) {
                           return std::string(info.param.arch) + "_" + std::string(dtype_name(info.param.storage));
                         });

}  // namespace
}  // namespace npusim
