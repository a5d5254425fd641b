#include "backends/cuda/cuda_util.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace npusim::cuda {

void check_cuda(cudaError_t result, const char* call, const std::string& where) {
  if (result == cudaSuccess) return;
  fail("cuda backend: " + where + ": " + call + " failed: " + cudaGetErrorName(result) + " (" +
       cudaGetErrorString(result) + ")");
}

namespace {

// The whole of `text` as a decimal number, or -1.
long long environment_number(const char* text) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  return errno != 0 || end == text || *end != '\0' ? -1 : value;
}

int chosen_ordinal() {
  const char* text = std::getenv("NPUSIM_CUDA_DEVICE");
  if (!text || !*text) return 0;
  const long long ordinal = environment_number(text);
  if (ordinal < 0 || ordinal > 1024)
    fail(std::string("NPUSIM_CUDA_DEVICE must be a device number, got '") + text + "'");
  return static_cast<int>(ordinal);
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

bool environment_is(const char* name, const char* value) {
  const char* text = std::getenv(name);
  return text && std::string(text) == value;
}

void check_environment() {
  static const std::vector<std::pair<const char*, std::vector<std::string>>> kSwitches = {
      {"NPUSIM_CUDA_GRAPHS", {"0", "1"}},        {"NPUSIM_CUDA_FUSE", {"0", "1"}},
      {"NPUSIM_CUDA_GEMM_TUNE", {"0", "1"}},     {"NPUSIM_CUDA_GEMM_EPILOGUE", {"0", "1"}},
      {"NPUSIM_CUDA_GEMM_LOG", {"0", "1"}},      {"NPUSIM_CUDA_NO_CUBLAS", {"0", "1"}},
      {"NPUSIM_CUDA_NO_CUDNN", {"0", "1"}},      {"NPUSIM_CUDA_CONV_LOG", {"0", "1"}},
      {"NPUSIM_CUDA_MMA_ATTENTION", {"0", "1"}}, {"NPUSIM_CUDA_CONV", {"lt", "cudnn"}},
      {"NPUSIM_CUDA_CACHE_PREFETCH", {"0", "1"}}};
  for (const auto& [name, values] : kSwitches) {
    const char* text = std::getenv(name);
    if (!text || !*text || std::find(values.begin(), values.end(), text) != values.end()) continue;
    std::string allowed;
    for (const std::string& value : values) allowed += (allowed.empty() ? "" : " or ") + value;
    fail(std::string(name) + " must be " + allowed + ", got '" + text + "'");
  }
  if (const char* text = std::getenv("NPUSIM_CUDA_IM2COL_BYTES"); text && *text && environment_number(text) <= 0)
    fail(std::string("NPUSIM_CUDA_IM2COL_BYTES must be a positive number of bytes, got '") + text + "'");
}

uint32_t address_alignment(const void* pointer, int64_t stride_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(pointer) | 256u;
  if (stride_bytes != 0) bits |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

template <MemoryKind Kind>
CudaAllocation<Kind>::CudaAllocation(size_t bytes, const std::string& what) : size_(bytes) {
  if (bytes == 0) return;
  void* pointer = nullptr;
  if constexpr (Kind == MemoryKind::Device)
    NPUSIM_CUDA_CHECK(cudaMalloc(&pointer, bytes), "allocating " + std::to_string(bytes) + " bytes for " + what);
  else
    NPUSIM_CUDA_CHECK(cudaHostAlloc(&pointer, bytes, cudaHostAllocDefault),
                      "allocating " + std::to_string(bytes) + " bytes of page-locked host memory for " + what);
  data_ = static_cast<std::byte*>(pointer);
}

template <MemoryKind Kind>
void CudaAllocation<Kind>::release() noexcept {
  if (!data_) return;
  if constexpr (Kind == MemoryKind::Device)
    cudaFree(data_);
  else
    cudaFreeHost(data_);
}

template <MemoryKind Kind>
CudaAllocation<Kind>::~CudaAllocation() {
  release();
}

template <MemoryKind Kind>
CudaAllocation<Kind>::CudaAllocation(CudaAllocation&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

template <MemoryKind Kind>
CudaAllocation<Kind>& CudaAllocation<Kind>::operator=(CudaAllocation&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

template class CudaAllocation<MemoryKind::Device>;
template class CudaAllocation<MemoryKind::PinnedHost>;

void SharedScratch::reserve(size_t bytes, const std::string& what) {
  if (bytes > buffer_.size()) buffer_ = DeviceBuffer(bytes, what);
}

double replay_milliseconds(cudaGraphExec_t graph, cudaStream_t stream, int replays, const std::string& where) {
  cudaEvent_t start = nullptr, stop = nullptr;
  NPUSIM_CUDA_CHECK(cudaEventCreate(&start), where);
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> start_owner(start, cudaEventDestroy);
  NPUSIM_CUDA_CHECK(cudaEventCreate(&stop), where);
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> stop_owner(stop, cudaEventDestroy);
  NPUSIM_CUDA_CHECK(cudaEventRecord(start, stream), where);
  for (int i = 0; i < replays; ++i) NPUSIM_CUDA_CHECK(cudaGraphLaunch(graph, stream), where);
  NPUSIM_CUDA_CHECK(cudaEventRecord(stop, stream), where);
  NPUSIM_CUDA_CHECK(cudaEventSynchronize(stop), where);
  float milliseconds = 0.0f;
  NPUSIM_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop), where);
  return static_cast<double>(milliseconds) / std::max(replays, 1);
}

}  // namespace npusim::cuda
