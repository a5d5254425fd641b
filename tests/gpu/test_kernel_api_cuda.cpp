// The kernel API on a CUDA GPU: the cases every device runs (kernel_api_cases.h), plus what only CUDA has: launch
// errors reported by the driver at the launch and at synchronization, and the cubin disk cache.
// Needs a GPU: without one the binary says so and exits with status 1 (ctest -LE gpu skips it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "npusim/kernel_api.h"

namespace npusim::kernels::test {
constexpr Device kTestDevice = Device::Cuda;
}  // namespace npusim::kernels::test

#include "unit/kernel_api_cases.h"

namespace npusim::kernels::test {

// Folders of this process, removed when the tests end.
std::filesystem::path work_folder() {
  return std::filesystem::path(NPUSIM_WORK_DIR) / ("kernel_api_cuda_" + std::to_string(getpid()));
}

TEST(KernelApiCuda, LaunchErrorIsReportedAtTheLaunch) {
  // More threadgroups in y than a CUDA grid holds (65535): the driver refuses the launch itself.
  const Kernel kernel({.name = "too_many_rows", .inputs = {}, .outputs = {"out"}, .body = "out[0] = 1.0f;\n"});
  expect_error(
      [&] {
        kernel({}, launch(Grid{1, 70000, 1}, ThreadGroup{1, 1, 1}, {{"out", {{1}, DType::Float32}}}));
      },
      {"kernel 'too_many_rows' (cuda)", "the launch", "70000", "failed", "CUDA_ERROR_INVALID_VALUE"});
  // The error does not spoil the context: the next launch runs.
  const Tensor out = kernel({}, launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"out", {{1}, DType::Float32}}}))[0];
  EXPECT_EQ(out.data<float>()[0], 1.0f);
}

TEST(KernelApiCuda, FaultIsReportedAtSynchronization) {
  // An illegal address poisons the CUDA context for good, so it runs in a child process of its own.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Kernel kernel({.name = "wild_write",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "reinterpret_cast<float*>(16)[thread_position_in_grid.x] = 1.0f;\nout[0] = 1.0f;\n"});
  EXPECT_EXIT(
      {
        try {
          kernel({}, launch(Grid{256, 1, 1}, ThreadGroup{128, 1, 1}, {{"out", {{1}, DType::Float32}}}));
        } catch (const Error& error) {
          std::fprintf(stderr, "%s\n", error.what());
          std::_Exit(3);
        }
        std::_Exit(4);
      },
      testing::ExitedWithCode(3),
      "kernel 'wild_write' \\(cuda\\): the kernel failed while running \\(reported at "
      "synchronization\\): CUDA_ERROR_ILLEGAL_ADDRESS");
}

TEST(KernelApiCuda, CubinDiskCache) {
  const std::filesystem::path folder = work_folder() / "disk_cache";
  std::filesystem::create_directories(folder);
  const std::string old = std::getenv("NPUSIM_CACHE_DIR") ? std::getenv("NPUSIM_CACHE_DIR") : "";
  setenv("NPUSIM_CACHE_DIR", folder.c_str(), 1);
  const Kernel kernel({.name = "cubin_cached",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "out[thread_position_in_grid.x] = 5 * thread_position_in_grid.x;\n"});
  const LaunchConfig config = launch(Grid{9, 1, 1}, ThreadGroup{4, 1, 1}, {{"out", {{9}, DType::Int32}}});
  auto check = [](const Tensor& out) {
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(out.data<int32_t>()[i], 5 * i);
  };
  clear_memory_cache();
  check(kernel({}, config)[0]);
  EXPECT_EQ(cache_stats().compiled, 1);
  int images = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    images += entry.path().extension() == ".cubin" || entry.path().extension() == ".ptx";
  EXPECT_EQ(images, 1);
  clear_memory_cache();
  check(kernel({}, config)[0]);
  EXPECT_EQ(cache_stats().compiled, 0);
  EXPECT_EQ(cache_stats().disk_hits, 1);
  setenv("NPUSIM_CACHE_DIR", old.c_str(), 1);
}

TEST(KernelApiCuda, StaticSharedMemoryCountsAgainstTheLimit) {
  // 40 KiB the kernel declares itself plus 200 KiB asked at launch: over any current GPU's per-block limit.
  const Kernel kernel({.name = "static_shared",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "__shared__ float table[10240];\ntable[thread_position_in_threadgroup.x] = 1.0f;\n"
                               "shared_memory[0] = 1;\nout[0] = table[0] + shared_memory[0];\n"});
  LaunchConfig config = launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"out", {{1}, DType::Float32}}});
  config.shared_memory_bytes = 200 * 1024;
  expect_error([&] { kernel({}, config); },
               {"kernel 'static_shared' (cuda)", "plus 40960 the kernel declares", "device limit"});
  // Within the limit, dynamic shared memory past the default 48 KiB is opted into.
  config.shared_memory_bytes = 100 * 1024;
  const Tensor out = kernel({}, config)[0];
  EXPECT_EQ(out.data<float>()[0], 2.0f);
}

}  // namespace npusim::kernels::test

int main(int argc, char** argv) {
  using npusim::kernels::test::work_folder;
  testing::InitGoogleTest(&argc, argv);
  if (!testing::GTEST_FLAG(list_tests)) {
    std::string reason;
    if (!npusim::kernels::cuda_available(&reason)) {
      std::fprintf(stderr, "test_kernel_api_cuda: these tests need a CUDA GPU, and none is usable here: %s\n",
                   reason.c_str());
      return 1;
    }
  }
  // Kernels compile into a folder of the build tree; tests that count compilations use folders of their own.
  const std::filesystem::path cache = std::filesystem::path(NPUSIM_WORK_DIR) / "kernel_api_cuda_cache";
  std::filesystem::create_directories(cache);
  setenv("NPUSIM_CACHE_DIR", cache.c_str(), 1);
  const int result = RUN_ALL_TESTS();
  std::error_code ignored;
  std::filesystem::remove_all(work_folder(), ignored);
  return result;
}
