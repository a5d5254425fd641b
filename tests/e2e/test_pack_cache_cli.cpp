// npusim run and bench with --pack-cache: the first run saves the packed weights, the next maps them and writes the
// same outputs bit for bit; other weights get a file of their own; a bad directory argument fails naming the flag;
// without the flag the directory comes from the environment.
// Every run reports its start-up: the time from the process's start to its first result.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>

#include "e2e_util.h"

namespace npusim {
namespace {

namespace fs = std::filesystem;
using test::cli;

const std::string kResNet18 = test::kFixtures + "/ir/resnet18_ir.json";

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

size_t files_in(const std::string& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}));
}

test::CommandResult run_resnet(const std::string& cache, const std::string& outputs, int seed) {
  return test::run_command(cli() + " run " + kResNet18 + " --random-weights " + std::to_string(seed) +
                           " --random-inputs 2 --threads 2 --outputs " + outputs + " --pack-cache " + cache);
}

TEST(PackCacheCli, SecondRunMapsThePackedWeightsAndWritesTheSameOutputs) {
  const std::string dir = test::fresh_work_dir();
  const std::string cache = dir + "/packs";
  const auto first = run_resnet(cache, dir + "/first.safetensors", 1);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("pack cache: saved " + cache + "/"), std::string::npos) << first.output;
  ASSERT_EQ(files_in(cache), 1u);

  const auto second = run_resnet(cache, dir + "/second.safetensors", 1);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("pack cache: mapped " + cache + "/"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("MB of them mapped from the pack cache"), std::string::npos) << second.output;
  const std::string expected = file_bytes(dir + "/first.safetensors");
  ASSERT_FALSE(expected.empty());
  EXPECT_TRUE(file_bytes(dir + "/second.safetensors") == expected);

  const auto other = run_resnet(cache, dir + "/other.safetensors", 3);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("pack cache: saved"), std::string::npos) << other.output;
  EXPECT_EQ(files_in(cache), 2u);
  EXPECT_FALSE(file_bytes(dir + "/other.safetensors") == expected);

  const auto bench = test::run_command(cli() + " bench " + kResNet18 +
                                       " --random-weights 1 --random-inputs 2 --threads 2 --iters 1 --warmup 0 "
                                       "--no-probe --json --pack-cache " +
                                       cache);
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  const std::string last = bench.output.substr(bench.output.rfind('{'));
  const nlohmann::json json = nlohmann::json::parse(last, nullptr, false);
  ASSERT_TRUE(json.is_object()) << bench.output;
  EXPECT_GT(json["mapped_mb"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(json["mapped_mb"].get<double>(), json["packed_mb"].get<double>());
  EXPECT_GT(json["prepare_ms"].get<double>(), 0.0);
}

TEST(PackCacheCli, RunReportsTheTimeToItsFirstResult) {
  const std::string dir = test::fresh_work_dir();
  const auto run =
      test::run_command(cli() + " run " + kResNet18 +
                        " --random-weights 1 --random-inputs 2 --threads 2 --iters 3 --pack-cache " + dir + "/packs");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch prepare, startup;
  ASSERT_TRUE(std::regex_search(run.output, prepare, std::regex(R"(prepare: ([0-9.]+) ms)"))) << run.output;
  ASSERT_TRUE(std::regex_search(run.output, startup,
                                std::regex(R"(start-up: first result ([0-9.]+) ms after start, ([0-9.]+) ms beyond)")))
      << run.output;
  const double prepare_ms = std::stod(prepare[1]), first_ms = std::stod(startup[1]), beyond_ms = std::stod(startup[2]);
  // Beyond the first run means preparing and everything before it: never less than the preparation, never more
  // than the whole time to the first result.
  EXPECT_GE(beyond_ms, prepare_ms) << run.output;
  EXPECT_GT(first_ms, beyond_ms) << run.output;
  EXPECT_LT(first_ms, 60000.0) << run.output;
}

TEST(PackCacheCli, BadArgumentsFailNamingTheFlag) {
  const auto empty =
      test::run_command(cli() + " run " + kResNet18 + " --random-weights 1 --random-inputs 2 --pack-cache ''");
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_LT(empty.exit_code, 128) << empty.output;
  EXPECT_NE(empty.output.find("--pack-cache"), std::string::npos) << empty.output;
  const auto model =
      test::run_command(cli() + " bench --model " + test::work_dir() + " --pack-cache " + test::work_dir());
  EXPECT_NE(model.exit_code, 0);
  EXPECT_LT(model.exit_code, 128) << model.output;
  EXPECT_NE(model.output.find("'--pack-cache' applies to graphs"), std::string::npos) << model.output;
}

// Without --pack-cache the packed weights go to $NPUSIM_PACK_CACHE, else $XDG_CACHE_HOME/npusim/packed-weights, else
// ~/.cache/npusim/packed-weights; 'off' (flag or variable) keeps none. They are kept after the first result.
TEST(PackCacheCli, DefaultDirectoryFollowsTheEnvironment) {
  const std::string dir = test::fresh_work_dir();
  const std::string run = cli() + " run " + kResNet18 + " --random-weights 1 --random-inputs 2 --threads 1";
  const auto run_with = [&](const std::string& environment, const std::string& flags = "") {
    return test::run_command("env -u NPUSIM_PACK_CACHE -u XDG_CACHE_HOME " + environment + " " + run + flags);
  };
  struct Case {
    std::string environment, directory;
  };
  const std::vector<Case> cases = {
      {"NPUSIM_PACK_CACHE=" + dir + "/env XDG_CACHE_HOME=" + dir + "/unused", dir + "/env"},
      {"XDG_CACHE_HOME=" + dir + "/xdg HOME=" + dir + "/unused", dir + "/xdg/npusim/packed-weights"},
      {"HOME=" + dir + "/home", dir + "/home/.cache/npusim/packed-weights"},
  };
  for (const Case& c : cases) {
    const auto first = run_with(c.environment);
    ASSERT_EQ(first.exit_code, 0) << c.environment << "\n" << first.output;
    const size_t startup = first.output.find("start-up: first result"),
                 saved = first.output.find("pack cache: saved " + c.directory + "/");
    ASSERT_NE(saved, std::string::npos) << c.environment << "\n" << first.output;
    EXPECT_LT(startup, saved) << "kept before the first result was reported:\n" << first.output;
    EXPECT_EQ(files_in(c.directory), 1u) << c.environment;
    const auto second = run_with(c.environment);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("pack cache: mapped " + c.directory + "/"), std::string::npos) << second.output;
  }
  EXPECT_FALSE(fs::exists(dir + "/unused"));

  for (const std::string& off : {std::string("NPUSIM_PACK_CACHE=off HOME=") + dir + "/off", "HOME=" + dir + "/flag"}) {
    const auto result = run_with(off, off.starts_with("HOME") ? " --pack-cache off" : "");
    ASSERT_EQ(result.exit_code, 0) << off << "\n" << result.output;
    EXPECT_EQ(result.output.find("pack cache"), std::string::npos) << off << "\n" << result.output;
    EXPECT_EQ(result.output.find("mapped from the pack cache"), std::string::npos) << result.output;
  }
  EXPECT_FALSE(fs::exists(dir + "/off"));
  EXPECT_FALSE(fs::exists(dir + "/flag"));

  const auto empty = run_with("NPUSIM_PACK_CACHE=");
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_LT(empty.exit_code, 128) << empty.output;
  EXPECT_NE(empty.output.find("NPUSIM_PACK_CACHE"), std::string::npos) << empty.output;
}

}  // namespace
}  // namespace npusim
