#pragma once
// Shared by the end-to-end tests: paths, running commands, reading reference files.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace npusim::test {

inline const std::string kData = NPUSIM_TEST_DATA;
inline const std::string kFixtures = kData + "/fixtures";
inline const std::string kPython = "/usr/bin/python3";

// ctest runs each test in its own process, in parallel: each test gets a folder of its own so that no two
// processes ever write the same file.
inline std::string work_dir(const std::string& name) {
  std::filesystem::path dir = NPUSIM_WORK_DIR;
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    dir /= std::string(info->test_suite_name()) + "." + info->name();
  dir /= name;
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string cli() { return NPUSIM_CLI; }

}  // namespace npusim::test
