#pragma once
// Shared pieces of the CUDA backend's host code: checked CUDA calls, device memory and the device itself.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/shared_library.h"
#include "npusim/error.h"

namespace npusim::cuda {

// Throws npusim::Error naming the call, CUDA's error name and text, and where it happened.
void check_cuda(cudaError_t result, const char* call, const std::string& where);
#define NPUSIM_CUDA_CHECK(call, where) ::npusim::cuda::check_cuda((call), #call, (where))

// Opens the device once ($NPUSIM_CUDA_DEVICE, default 0); fails with "cuda backend: no CUDA device: ..." when
// there is no driver or GPU.
void ensure_device();
std::string device_name();

// Whether environment variable `name` is set to exactly `value`.
bool environment_is(const char* name, const char* value);

// Fails naming the variable when one of the backend's switches ($NPUSIM_CUDA_GRAPHS, _FUSE, _CONV, _IM2COL_BYTES, ...)
// holds a value it does not take, rather than running as if it were unset.
void check_environment();

// The largest power of two up to 256 that divides the address and, for a batch walking it, the stride in bytes.
uint32_t address_alignment(const void* pointer, int64_t stride_bytes = 0);

// Milliseconds per replay of `replays` back-to-back launches of a CUDA graph on `stream`, timed with CUDA events.
double replay_milliseconds(cudaGraphExec_t graph, cudaStream_t stream, int replays, const std::string& where);

// One CUDA allocation, freed with the object: device memory (cudaMalloc) or page-locked host memory (cudaHostAlloc,
// which copies to and from the device read and write as DMA).
enum class MemoryKind { Device, PinnedHost };
template <MemoryKind Kind>
class CudaAllocation {
 public:
  CudaAllocation() = default;
  CudaAllocation(size_t bytes, const std::string& what);
  ~CudaAllocation();
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  CudaAllocation(CudaAllocation&& other) noexcept;
  CudaAllocation& operator=(CudaAllocation&& other) noexcept;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;
};
using DeviceBuffer = CudaAllocation<MemoryKind::Device>;
using PinnedBuffer = CudaAllocation<MemoryKind::PinnedHost>;

// Tuning choices (algorithms timed at prepare) kept process-wide by problem key, safe to share between threads.
template <typename Choice>
class ChoiceCache {
 public:
  std::optional<Choice> find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = choices_.find(key);
    if (found == choices_.end()) return std::nullopt;
    return found->second;
  }
  void store(const std::string& key, const Choice& choice) {
    std::lock_guard<std::mutex> lock(mutex_);
    choices_[key] = choice;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Choice> choices_;
};

// Device memory that the launches of one program share (they run one after another on its stream), e.g. im2col's
// columns: grown at prepare time to the largest request, never while the program runs. Launches read data() when
// they run, since a later request may move it.
class SharedScratch {
 public:
  void reserve(size_t bytes, const std::string& what);
  std::byte* data() const { return buffer_.data(); }
  size_t size() const { return buffer_.size(); }

 private:
  DeviceBuffer buffer_;
};

}  // namespace npusim::cuda
