#pragma once
// Kernels generated at prepare time: NVRTC compiles the source for the current device and the CUDA runtime loads it
// (cudaLibraryLoadData). Each distinct source compiles once per process and stays loaded for its lifetime.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace npusim::cuda {

// The kernel `name` of `source`; throws npusim::Error naming `who` with NVRTC's log when the source does not compile.
cudaKernel_t generated_kernel(const std::string& source, const char* name, const std::string& who);

// How many sources this process compiled (not those found already compiled).
size_t generated_kernels_compiled();

}  // namespace npusim::cuda
