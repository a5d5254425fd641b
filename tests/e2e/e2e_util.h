#pragma once
// Shared by the end-to-end tests: paths, running commands, reading reference files.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "work_dir.h"

namespace npusim::test {

inline const std::string kData = NPUSIM_TEST_DATA;
inline const std::string kFixtures = kData + "/fixtures";
inline const std::string kPython = "/usr/bin/python3";

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
