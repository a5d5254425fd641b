// Bad command lines and bad files given to the CLI: a non-zero exit and one clear line, never a crash.
#include <gtest/gtest.h>

#include <fstream>

#include "e2e_util.h"

namespace npusim {
namespace {

using test::cli;
using test::kFixtures;

const std::string kResNet = kFixtures + "/ir/resnet18_ir.json";

void expect_clean_failure(const std::string& arguments, const std::string& fragment) {
  const auto result = test::run_command(cli() + " " + arguments);
  EXPECT_NE(result.exit_code, 0) << arguments << "\n" << result.output;
  EXPECT_LT(result.exit_code, 128) << "crashed: " << arguments << "\n" << result.output;
  EXPECT_NE(result.output.find(fragment), std::string::npos) << arguments << "\n" << result.output;
}

std::string write_file(const std::string& name, const std::string& content) {
  const std::string path = test::work_dir("cli_errors") + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(CliErrors, UnknownCommandAndOptions) {
  expect_clean_failure("frobnicate", "unknown command 'frobnicate'");
  expect_clean_failure("run " + kResNet + " --frobnicate", "unknown option '--frobnicate'");
  expect_clean_failure("run " + kResNet + " --iters", "needs a value");
  expect_clean_failure("run " + kResNet + " --random-weights 0 --random-inputs 0 --iters zero", "needs an integer");
  expect_clean_failure("run " + kResNet + " --random-weights 0 --random-inputs 0 --iters 0", "between 1 and");
  expect_clean_failure("run", "expected one graph or program file");
  expect_clean_failure("verify a.safetensors", "expected two");
}

TEST(CliErrors, MissingAndMalformedFiles) {
  expect_clean_failure("run /nonexistent/model.json --random-weights 0", "/nonexistent/model.json: cannot open");
  const std::string truncated = write_file("truncated.json", "{\"graph_inputs\": [");
  expect_clean_failure("run " + truncated + " --random-weights 0", "not valid JSON");
  expect_clean_failure("run " + kResNet + " --weights /nonexistent/w.safetensors", "/nonexistent/w.safetensors");
  const std::string garbage = write_file("garbage.safetensors", "not a safetensors file at all");
  expect_clean_failure("run " + kResNet + " --weights " + garbage, garbage);
}

TEST(CliErrors, MissingWeightsAreListed) {
  const std::string empty = test::work_dir("cli_errors") + "/empty.safetensors";
  // A valid file that holds no tensor the graph needs.
  write_file("empty.safetensors", std::string("\x02\x00\x00\x00\x00\x00\x00\x00{}", 10));
  expect_clean_failure("run " + kResNet + " --weights " + empty + " --random-inputs 0", "conv1.weight");
}

TEST(CliErrors, WrongInputs) {
  const std::string base = "run " + kResNet + " --random-weights 0 ";
  expect_clean_failure(base, "missing input 'x'");
  const std::string dir = test::work_dir("cli_errors");
  const auto made = test::run_command(test::kPython + " -c \"import numpy as np; np.save('" + dir +
                                      "/small.npy', np.zeros((1,3,8,8), np.float32)); np.save('" + dir +
                                      "/ints.npy', np.zeros((1,3,224,224), np.int64))\"");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  expect_clean_failure(base + "--input x=" + dir + "/small.npy", "has shape [1, 3, 8, 8]");
  expect_clean_failure(base + "--input x=" + dir + "/ints.npy", "has dtype int64");
  expect_clean_failure(base + "--input y=" + dir + "/small.npy", "'y' is not an input");
  expect_clean_failure(base + "--input x", "NAME=FILE.npy");
}

TEST(CliErrors, UnsupportedOpsAreListedBeforeRunning) {
  std::ifstream in(kResNet);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t pos; (pos = text.find("aten.relu_.default")) != std::string::npos;)
    text.replace(pos, 18, "aten.frobnicate.default");
  const std::string path = write_file("unsupported.json", text);
  expect_clean_failure("run " + path + " --random-weights 0 --random-inputs 0", "aten.frobnicate.default (17 nodes");
}

}  // namespace
}  // namespace npusim
