// Tensor-core helpers shared by the attention kernels: packing fp32 pairs to the 16-bit storage, and one
// m16n8k16 matrix multiply-accumulate with fp32 sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float low, float high);
template <>
__device__ __forceinline__ uint32_t pack_pair<__half>(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
template <>
__device__ __forceinline__ uint32_t pack_pair<__nv_bfloat16>(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// d[0..3] += a (16x16, row-major fragment) * b (16x8, column-major fragment).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The element code (device_kernels.h) of a 16-bit storage type.
template <typename T>
__device__ __forceinline__ int element_code();
template <>
__device__ __forceinline__ int element_code<__half>() {
  return kF16;
}
template <>
__device__ __forceinline__ int element_code<__nv_bfloat16>() {
  return kBF16;
}

}  // namespace npusim::cuda
