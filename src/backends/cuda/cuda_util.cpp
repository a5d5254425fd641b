#include "backends/cuda/cuda_util.h"

#include <cublas_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <utility>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

void check_cuda(cudaError_t result, const char* call, const std::string& where) {
  if (result == cudaSuccess) return;
  fail("cuda backend: " + where + ": " + call + " failed: " + cudaGetErrorName(result) + " (" +
       cudaGetErrorString(result) + ")");
}

namespace {

int chosen_ordinal() {
  const char* text = std::getenv("NPUSIM_CUDA_DEVICE");
  return text ? std::atoi(text) : 0;
}

}  // namespace

void ensure_device() {
  static std::once_flag once;
  static std::string problem;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t result = cudaGetDeviceCount(&count);
    if (result != cudaSuccess) {
      problem = std::string(cudaGetErrorName(result)) + " (" + cudaGetErrorString(result) + ")";
      cudaGetLastError();  // clears the sticky "no device" state for later calls
      return;
    }
    const int ordinal = chosen_ordinal();
    if (ordinal < 0 || ordinal >= count) {
      problem = "device " + std::to_string(ordinal) + " asked for ($NPUSIM_CUDA_DEVICE), " + std::to_string(count) +
                " present";
      return;
    }
    const cudaError_t set = cudaSetDevice(ordinal);
    if (set != cudaSuccess) problem = std::string("cudaSetDevice: ") + cudaGetErrorString(set);
  });
  if (!problem.empty()) fail("cuda backend: no CUDA device: " + problem);
  // Threads other than the one that opened it start on device 0.
  NPUSIM_CUDA_CHECK(cudaSetDevice(chosen_ordinal()), "selecting the device");
}

std::string device_name() {
  ensure_device();
  cudaDeviceProp properties{};
  NPUSIM_CUDA_CHECK(cudaGetDeviceProperties(&properties, chosen_ordinal()), "reading the device properties");
  return std::string(properties.name) + " (sm_" + std::to_string(properties.major) + std::to_string(properties.minor) +
         ")";
}

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string& what) : size_(bytes) {
  if (bytes == 0) return;
  void* pointer = nullptr;
  NPUSIM_CUDA_CHECK(cudaMalloc(&pointer, bytes), "allocating " + std::to_string(bytes) + " bytes for " + what);
  data_ = static_cast<std::byte*>(pointer);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---- cuBLAS ----

struct Blas::Api {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t);
  const char* (*status_string)(cublasStatus_t);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
};

namespace {

constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

template <typename Fn>
bool resolve(void* library, const char* symbol, Fn& function) {
  function = reinterpret_cast<Fn>(dlsym(library, symbol));
  return function != nullptr;
}

cudaDataType data_type(int elem) {
  switch (elem) {
    case kF16:
      return CUDA_R_16F;
    case kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace

Blas* Blas::instance() {
  static std::once_flag once;
  static Blas* blas = nullptr;
  std::call_once(once, [] {
    const char* off = std::getenv("NPUSIM_CUDA_NO_CUBLAS");
    if (off && std::string(off) == "1") return;
    void* library = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!library) library = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!library) return;
    auto api = std::make_unique<Api>();
    const bool complete =
        resolve(library, "cublasCreate_v2", api->create) && resolve(library, "cublasSetStream_v2", api->set_stream) &&
        resolve(library, "cublasSetWorkspace_v2", api->set_workspace) &&
        resolve(library, "cublasGetStatusString", api->status_string) && resolve(library, "cublasGemmEx", api->gemm_ex);
    if (!complete) return;
    cublasHandle_t handle = nullptr;
    if (api->create(&handle) != CUBLAS_STATUS_SUCCESS) return;
    void* workspace = nullptr;
    if (cudaMalloc(&workspace, kBlasWorkspaceBytes) != cudaSuccess) return;
    // A fixed workspace keeps cuBLAS from allocating while a CUDA graph is being captured.
    if (api->set_workspace(handle, workspace, kBlasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS) return;
    blas = new Blas();  // lives for the whole process, like the CUDA context
    blas->api_ = std::move(api);
    blas->handle_ = handle;
    blas->workspace_ = workspace;
  });
  return blas;
}

void Blas::linear(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int elem,
                  const std::string& where) {
  auto handle = static_cast<cublasHandle_t>(handle_);
  auto check = [&](cublasStatus_t status, const char* call) {
    if (status != CUBLAS_STATUS_SUCCESS)
      fail("cuda backend: " + where + ": " + call + " failed: " + api_->status_string(status));
  };
  check(api_->set_stream(handle, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType type = data_type(elem);
  // Row-major C = A·Bᵀ is column-major Cᵀ[n, m] = B[k, n]ᵀ · A[k, m].
  check(api_->gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                      &one, b, type, static_cast<int>(k), a, type, static_cast<int>(k), &zero, c, type,
                      static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

void Blas::matmul(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int elem,
                  const std::string& where) {
  auto handle = static_cast<cublasHandle_t>(handle_);
  auto check = [&](cublasStatus_t status, const char* call) {
    if (status != CUBLAS_STATUS_SUCCESS)
      fail("cuda backend: " + where + ": " + call + " failed: " + api_->status_string(status));
  };
  check(api_->set_stream(handle, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType type = data_type(elem);
  // Row-major C = A·B is column-major Cᵀ[n, m] = Bᵀ[n, k] · Aᵀ[k, m].
  check(api_->gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                      &one, b, type, static_cast<int>(n), a, type, static_cast<int>(k), &zero, c, type,
                      static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace npusim::cuda
