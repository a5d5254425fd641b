// Device helpers shared by the CUDA backend's kernel files: element loads and stores through run-time element
// codes, typed conversions, block reductions and programmatic dependent launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

// Programmatic dependent launch (sm_90): a kernel launched with the attribute may start while the kernel before it
// in the stream finishes; it must wait for that kernel before reading what it writes. Without the attribute both
// are no-ops.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void wait_for_producer() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ bool is_float_code(int elem) { return elem <= kBF16; }

__device__ __forceinline__ float load_f(const void* p, int elem, int64_t i) {
  switch (elem) {
    case kF32:
      return static_cast<const float*>(p)[i];
    case kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kI64:
      return static_cast<float>(static_cast<const long long*>(p)[i]);
    default:
      return static_cast<const uint8_t*>(p)[i] ? 1.0f : 0.0f;
  }
}

// Float to int64 without undefined behaviour: NaN is 0, out-of-range values saturate (as the CPU backend does).
__device__ __forceinline__ long long float_to_int64(float value) {
  if (isnan(value)) return 0;
  if (value >= 9.2233720368547758e18f) return LLONG_MAX;
  if (value <= -9.2233720368547758e18f) return LLONG_MIN;
  return static_cast<long long>(value);
}

__device__ __forceinline__ long long load_i(const void* p, int elem, int64_t i) {
  switch (elem) {
    case kI64:
      return static_cast<const long long*>(p)[i];
    case kBool:
      return static_cast<const uint8_t*>(p)[i] ? 1 : 0;
    default:
      return float_to_int64(load_f(p, elem, i));
  }
}

__device__ __forceinline__ void store_f(void* p, int elem, int64_t i, float v) {
  switch (elem) {
    case kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case kI64:
      static_cast<long long*>(p)[i] = float_to_int64(v);
      break;
    default:
      static_cast<uint8_t*>(p)[i] = v != 0.0f ? 1 : 0;
      break;
  }
}

__device__ __forceinline__ void store_i(void* p, int elem, int64_t i, long long v) {
  switch (elem) {
    case kI64:
      static_cast<long long*>(p)[i] = v;
      break;
    case kBool:
      static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0;
      break;
    default:
      store_f(p, elem, i, static_cast<float>(v));
      break;
  }
}

// One element converted between any two element types (floats via fp32, integers exactly).
__device__ __forceinline__ void convert_element(void* dst, int dst_elem, int64_t di, const void* src, int src_elem,
                                                int64_t si) {
  if (is_float_code(dst_elem) && is_float_code(src_elem)) {
    store_f(dst, dst_elem, di, load_f(src, src_elem, si));
  } else if (dst_elem == kBool && is_float_code(src_elem)) {
    static_cast<uint8_t*>(dst)[di] = load_f(src, src_elem, si) != 0.0f ? 1 : 0;
  } else {
    store_i(dst, dst_elem, di, load_i(src, src_elem, si));
  }
}

// Sum over the block; every thread gets the result. `shared` holds 32 floats.
__device__ inline float block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += shared[w];
  return total;
}

__device__ inline float block_max(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  float total = -INFINITY;
  for (int w = 0; w < warps; ++w) total = fmaxf(total, shared[w]);
  return total;
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) {
  return __float2bfloat16_rn(v);
}

// Lets `Kernel` launch with `bytes` of dynamic shared memory: its limit is raised past the default 48 KiB the first
// time a launch needs more (never lowered, whichever thread asks first).
template <auto Kernel>
cudaError_t allow_shared_bytes(int64_t bytes) {
  static std::atomic<int64_t> allowed{48 * 1024};
  if (bytes <= allowed.load()) return cudaSuccess;
  static std::mutex raising;
  std::lock_guard<std::mutex> lock(raising);
  if (bytes <= allowed.load()) return cudaSuccess;
  const cudaError_t error =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error == cudaSuccess) allowed.store(bytes);
  return error;
}

// Launches `kernel` with programmatic dependent launch allowed, so that it can start while the previous kernel of
// the stream finishes (the kernel waits for it with wait_for_producer()).
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, unsigned threads, size_t shared_bytes,
                             cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace npusim::cuda
