#include "backends/cuda/generated_kernels.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_util.h"
#include "core/nvrtc_compiler.h"

namespace npusim::cuda {

namespace {

std::atomic<size_t> compiled_sources{0};

cudaKernel_t compile_and_load(const std::string& source, const char* name, const std::string& who) {
  int ordinal = 0, major = 0, minor = 0;
  NPUSIM_CUDA_CHECK(cudaGetDevice(&ordinal), who);
  NPUSIM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal), who);
  NPUSIM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal), who);
  const nvrtc::Target target = nvrtc::target_for(major, minor, "cuda backend: " + who);
  const nvrtc::Compiled compiled =
      nvrtc::compile(source, std::string(name) + ".cu", {"--gpu-architecture=" + target.architecture, "-std=c++17"},
                     target.cubin, "cuda backend: " + who);
  if (!compiled.ok)
    fail("cuda backend: " + who + ": the generated kernel does not compile:\n" + compiled.log + "\n--- source ---\n" +
         source);
  cudaLibrary_t library = nullptr;
  NPUSIM_CUDA_CHECK(cudaLibraryLoadData(&library, compiled.image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
                    who);
  cudaKernel_t kernel = nullptr;
  NPUSIM_CUDA_CHECK(cudaLibraryGetKernel(&kernel, library, name), who);
  // Loads the kernel now (loading may be lazy), never at its first launch inside a graph capture.
  cudaFuncAttributes attributes{};
  NPUSIM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)), who);
  ++compiled_sources;
  return kernel;
}

}  // namespace

cudaKernel_t generated_kernel(const std::string& source, const char* name, const std::string& who) {
  static std::mutex mutex;
  static std::map<std::string, cudaKernel_t> kernels;
  int ordinal = 0;
  NPUSIM_CUDA_CHECK(cudaGetDevice(&ordinal), who);
  const std::string key = std::to_string(ordinal) + ":" + name + "\n" + source;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = kernels.find(key);
  if (found != kernels.end()) return found->second;
  const cudaKernel_t kernel = compile_and_load(source, name, who);
  kernels.emplace(key, kernel);
  return kernel;
}

std::optional<Launch> generated_launch(const Node& node, cudaKernel_t kernel, int64_t blocks, int threads,
                                       const std::vector<const void*>& pointers) {
  if (blocks > std::numeric_limits<int32_t>::max() || pointers.size() > kMaxGeneratedPointers) return std::nullopt;
  if (blocks == 0) return Launch([](cudaStream_t) {});
  std::array<const void*, kMaxGeneratedPointers> captured{};
  std::copy(pointers.begin(), pointers.end(), captured.begin());
  return [node = &node, kernel, blocks, threads, captured](cudaStream_t stream) {
    std::array<const void*, kMaxGeneratedPointers> values = captured;
    std::array<void*, kMaxGeneratedPointers> arguments{};
    for (size_t k = 0; k < values.size(); ++k) arguments[k] = &values[k];
    check_launch(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(blocks)),
                                  dim3(static_cast<unsigned>(threads)), arguments.data(), 0, stream),
                 "the generated kernel", *node);
  };
}

size_t generated_kernels_compiled() { return compiled_sources.load(); }

}  // namespace npusim::cuda
