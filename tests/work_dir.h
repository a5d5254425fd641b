#pragma once
// Where a test writes its files. ctest runs each test in its own process, in parallel: each test gets a folder
// of its own so that no two processes ever write the same file.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace npusim::test {

inline std::string work_dir(const std::string& name = "") {
  std::filesystem::path dir = NPUSIM_WORK_DIR;
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    dir /= std::string(info->test_suite_name()) + "." + info->name();
  if (!name.empty()) dir /= name;
  std::filesystem::create_directories(dir);
  return dir.string();
}

// An empty folder of the current test's own, new on every call (what an earlier run left there is removed). Everything
// stays inside the build tree: nothing is left behind in the system's temporary folder.
inline std::string fresh_work_dir(const std::string& prefix = "scratch") {
  static int calls = 0;
  const std::filesystem::path dir = work_dir() + "/" + prefix + "_" + std::to_string(calls++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace npusim::test
