#pragma once
// Shared pieces of the CUDA backend's host code: checked CUDA calls, device memory, the device itself, and
// cuBLAS opened at run time.
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "npusim/error.h"

namespace npusim::cuda {

// Throws npusim::Error naming the call, CUDA's error name and text, and where it happened.
void check_cuda(cudaError_t result, const char* call, const std::string& where);
#define NPUSIM_CUDA_CHECK(call, where) ::npusim::cuda::check_cuda((call), #call, (where))

// Opens the device once ($NPUSIM_CUDA_DEVICE, default 0); fails with "cuda backend: no CUDA device: ..." when
// there is no driver or GPU.
void ensure_device();
std::string device_name();

// One cudaMalloc allocation, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// cuBLAS (libcublas.so), opened at run time: GEMMs use it when it loads, the backend's own kernel otherwise.
class Blas {
 public:
  // The process-wide instance, or null when libcublas cannot be loaded ($NPUSIM_CUDA_NO_CUBLAS=1 also says no).
  static Blas* instance();
  // C[m, n] (row-major) = A[m, k] · B[n, k]ᵀ, all of one float storage type (cuda element code), fp32 compute.
  void linear(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int elem,
              const std::string& where);
  // C[m, n] (row-major) = A[m, k] · B[k, n], all of one float storage type, fp32 compute.
  void matmul(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int elem,
              const std::string& where);

 private:
  Blas() = default;
  struct Api;
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace npusim::cuda
