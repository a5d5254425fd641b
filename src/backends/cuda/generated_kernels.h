#pragma once
// Kernels generated at prepare time: NVRTC compiles the source for the current device and the CUDA runtime loads it
// (cudaLibraryLoadData). Each distinct source compiles once per process and stays loaded for its lifetime.
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace npusim::cuda {

// The kernel `name` of `source`; throws npusim::Error naming `who` with NVRTC's log when the source does not compile.
cudaKernel_t generated_kernel(const std::string& source, const char* name, const std::string& who);

// Kernel parameters a generated launch passes at most: device pointers, the output's first.
inline constexpr size_t kMaxGeneratedPointers = 9;

// The launch of a generated kernel in `blocks` blocks of `threads`, its parameters `pointers` in order (nothing is
// enqueued when blocks is 0); nothing when there are too many blocks or pointers.
std::optional<Launch> generated_launch(const Node& node, cudaKernel_t kernel, int64_t blocks, int threads,
                                       const std::vector<const void*>& pointers);

// How many sources this process compiled (not those found already compiled).
size_t generated_kernels_compiled();

}  // namespace npusim::cuda
