#include "backends/cuda/cuda_util.h"

#include <cstdlib>
#include <mutex>
#include <utility>

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

bool environment_is(const char* name, const char* value) {
  const char* text = std::getenv(name);
  return text && std::string(text) == value;
}

uint32_t address_alignment(const void* pointer, int64_t stride_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(pointer) | 256u;
  if (stride_bytes != 0) bits |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(bits & (~bits + 1));
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

void SharedScratch::reserve(size_t bytes, const std::string& what) {
  if (bytes > buffer_.size()) buffer_ = DeviceBuffer(bytes, what);
}

}  // namespace npusim::cuda
