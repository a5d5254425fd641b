// The CUDA backend's kernels. Generic ones take every element type through run-time element codes, compute in
// fp32 and loop grid-stride; the decode GEMV is specialized by storage type for 16-byte loads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <utility>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

namespace {

constexpr int kThreads = 256;

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

// Element offsets of the first `operands` operands for linear index i of the indexer's shape.
template <int Operands>
__device__ __forceinline__ void offsets_of(const Indexer& ix, int64_t i, int64_t (&offset)[Operands]) {
  if (ix.rank <= 1) {  // the common case once contiguous dims are merged: no division
    for (int o = 0; o < Operands; ++o) offset[o] = ix.rank == 0 ? 0 : i * ix.strides[o][0];
    return;
  }
  for (int o = 0; o < Operands; ++o) offset[o] = 0;
  for (int d = ix.rank - 1; d >= 0; --d) {
    const int64_t size = ix.sizes[d];
    const int64_t coordinate = i % size;
    i /= size;
    for (int o = 0; o < Operands; ++o) offset[o] += coordinate * ix.strides[o][d];
  }
}

int64_t indexer_count(const Indexer& ix) {
  int64_t n = 1;
  for (int d = 0; d < ix.rank; ++d) n *= ix.sizes[d];
  return n;
}

unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 16 ? 65535 * 16 : blocks));
}

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__device__ __forceinline__ float relu_f(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float apply_unary(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::Relu:
      return relu_f(x);
    case UnaryOp::Silu:
      return silu_f(x);
    case UnaryOp::Sigmoid:
      return sigmoid_f(x);
    case UnaryOp::Tanh:
      return tanhf(x);
    case UnaryOp::Gelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case UnaryOp::GeluTanh:
      return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Exp:
      return expf(x);
    default:
      return x;
  }
}

// ---- copy, binary, unary, where ----

__global__ void copy_kernel(Indexer ix, int64_t n, void* dst, int dst_elem, Operand src) {
  GRID_STRIDE(i, n) {
    int64_t o[2];
    offsets_of<2>(ix, i, o);
    convert_element(dst, dst_elem, o[0], src.data, src.elem, o[1]);
  }
}

__device__ __forceinline__ float nan_max(float a, float b) { return (isnan(a) || isnan(b)) ? NAN : fmaxf(a, b); }
__device__ __forceinline__ float nan_min(float a, float b) { return (isnan(a) || isnan(b)) ? NAN : fminf(a, b); }

__device__ __forceinline__ bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le || op == BinaryOp::Gt ||
         op == BinaryOp::Ge || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr;
}

template <typename T>
__device__ __forceinline__ bool compare(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Eq:
      return a == b;
    case BinaryOp::Ne:
      return a != b;
    case BinaryOp::Lt:
      return a < b;
    case BinaryOp::Le:
      return a <= b;
    case BinaryOp::Gt:
      return a > b;
    case BinaryOp::Ge:
      return a >= b;
    case BinaryOp::LogicalAnd:
      return a != T(0) && b != T(0);
    default:
      return a != T(0) || b != T(0);
  }
}

__device__ __forceinline__ float binary_float(BinaryOp op, float a, float b, float alpha) {
  switch (op) {
    case BinaryOp::Add:
      return a + alpha * b;
    case BinaryOp::Sub:
      return a - alpha * b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
    case BinaryOp::Maximum:
      return nan_max(a, b);
    case BinaryOp::Minimum:
      return nan_min(a, b);
    case BinaryOp::AddRelu:
      return relu_f(a + b);
    case BinaryOp::SiluMul:
      return silu_f(a) * b;
    default:
      return NAN;
  }
}

__device__ __forceinline__ long long binary_int(BinaryOp op, long long a, long long b, long long alpha) {
  switch (op) {
    case BinaryOp::Add:
      return a + alpha * b;
    case BinaryOp::Sub:
      return a - alpha * b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Maximum:
      return a > b ? a : b;
    case BinaryOp::Minimum:
      return a < b ? a : b;
    case BinaryOp::BitwiseAnd:
      return a & b;
    case BinaryOp::BitwiseOr:
      return a | b;
    case BinaryOp::BitwiseXor:
      return a ^ b;
    case BinaryOp::AddRelu:
      return a + b < 0 ? 0 : a + b;
    default:
      return 0;
  }
}

__global__ void binary_kernel(BinaryOp op, Indexer ix, int64_t n, void* out, int out_elem, Operand a, Operand b,
                              double scalar, long long int_scalar, double alpha, long long int_alpha) {
  const bool b_float = b.data ? is_float_code(b.elem) : false;
  const bool float_math = is_comparison(op) ? (is_float_code(a.elem) || b_float || (!b.data && scalar != int_scalar))
                                            : is_float_code(out_elem);
  GRID_STRIDE(i, n) {
    int64_t o[3];
    offsets_of<3>(ix, i, o);
    if (float_math) {
      const float x = load_f(a.data, a.elem, o[1]);
      const float y = b.data ? load_f(b.data, b.elem, o[2]) : static_cast<float>(scalar);
      if (is_comparison(op))
        static_cast<uint8_t*>(out)[o[0]] = compare(op, x, y) ? 1 : 0;
      else
        store_f(out, out_elem, o[0], binary_float(op, x, y, static_cast<float>(alpha)));
    } else {
      const long long x = load_i(a.data, a.elem, o[1]);
      const long long y = b.data ? load_i(b.data, b.elem, o[2]) : int_scalar;
      if (is_comparison(op))
        static_cast<uint8_t*>(out)[o[0]] = compare(op, x, y) ? 1 : 0;
      else
        store_i(out, out_elem, o[0], binary_int(op, x, y, int_alpha));
    }
  }
}

__global__ void unary_kernel(UnaryOp op, int64_t n, void* out, int out_elem, Operand in) {
  GRID_STRIDE(i, n) store_f(out, out_elem, i, apply_unary(op, load_f(in.data, in.elem, i)));
}

__global__ void where_kernel(Indexer ix, int64_t n, void* out, int out_elem, Operand cond, Operand a, Operand b,
                             double other) {
  GRID_STRIDE(i, n) {
    int64_t o[4];
    offsets_of<4>(ix, i, o);
    const bool take_a = load_i(cond.data, cond.elem, o[1]) != 0;
    if (is_float_code(out_elem)) {
      const float value =
          take_a ? load_f(a.data, a.elem, o[2]) : (b.data ? load_f(b.data, b.elem, o[3]) : static_cast<float>(other));
      store_f(out, out_elem, o[0], value);
    } else {
      const long long value = take_a ? load_i(a.data, a.elem, o[2])
                                     : (b.data ? load_i(b.data, b.elem, o[3]) : static_cast<long long>(other));
      store_i(out, out_elem, o[0], value);
    }
  }
}

// ---- LLM ops ----

// out = x * cos + rotate_half(x) * sin at element i of the indexer (operands: out, x, cos, sin); x is contiguous in
// its last dim. Leaves the output offset in o[0].
__device__ __forceinline__ float rope_element(const Indexer& ix, int64_t i, int64_t width, Operand x, Operand cos,
                                              Operand sin, int64_t (&o)[4]) {
  const int64_t half = width / 2;
  offsets_of<4>(ix, i, o);
  const int64_t column = i % width;
  const float value = load_f(x.data, x.elem, o[1]);
  const float rotated = column < half ? -load_f(x.data, x.elem, o[1] + half) : load_f(x.data, x.elem, o[1] - half);
  const float direct = __fmul_rn(value, load_f(cos.data, cos.elem, o[2]));
  const float turned = __fmul_rn(rotated, load_f(sin.data, sin.elem, o[3]));
  return __fadd_rn(direct, turned);
}

__global__ void rope_kernel(Indexer ix, int64_t n, int64_t width, void* out, int out_elem, Operand x, Operand cos,
                            Operand sin) {
  GRID_STRIDE(i, n) {
    int64_t o[4];
    const float value = rope_element(ix, i, width, x, cos, sin, o);
    store_f(out, out_elem, o[0], value);
  }
}

// Where element i of an index_copy's source lands in the cache, or -1 (and *error set) for an index out of range.
__device__ __forceinline__ int64_t cache_slot(int64_t i, int64_t dim_size, int64_t inner, int64_t index_count,
                                              const int64_t* index, int* error) {
  const int64_t e = i % inner, j = (i / inner) % index_count, outer = i / (inner * index_count);
  int64_t target = index[j];
  if (target < 0) target += dim_size;
  if (target < 0 || target >= dim_size) {
    *error = 1;
    return -1;
  }
  return (outer * dim_size + target) * inner + e;
}

__global__ void rope_cache_kernel(RopeCacheBatch batch) {
  const RopeCacheJob& job = batch.jobs[blockIdx.y];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < job.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (job.kind == RopeCacheKind::CopyToCache) {
      const int64_t slot = cache_slot(i, job.dim_size, job.inner, job.index_count, job.index, job.error);
      if (slot >= 0) convert_element(job.out, job.out_elem, slot, job.x.data, job.x.elem, i);
      continue;
    }
    int64_t o[4];
    const float value = rope_element(job.ix, i, job.width, job.x, job.cos, job.sin, o);
    if (job.kind == RopeCacheKind::RopeToOutput) {
      store_f(job.out, job.out_elem, o[0], value);
    } else if (const int64_t slot = cache_slot(i, job.dim_size, job.inner, job.index_count, job.index, job.error);
               slot >= 0) {
      store_f(job.out, job.out_elem, slot, value);
    }
  }
}

// Sum over the block; every thread gets the result. `shared` holds 32 floats.
__device__ float block_sum(float value, float* shared) {
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

__device__ float block_max(float value, float* shared) {
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

__global__ void rms_norm_kernel(int64_t row_size, double eps, void* out, int out_elem, Operand x, Operand weight) {
  __shared__ float reduce[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * row_size;
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < row_size; c += blockDim.x) {
    const float v = load_f(x.data, x.elem, base + c);
    squares += v * v;
  }
  const float total = block_sum(squares, reduce);
  const double mean = row_size > 0 ? static_cast<double>(total) / static_cast<double>(row_size) : 0.0;
  const float scale = static_cast<float>(1.0 / sqrt(mean + eps));
  for (int64_t c = threadIdx.x; c < row_size; c += blockDim.x) {
    float v = load_f(x.data, x.elem, base + c) * scale;
    if (weight.data) v *= load_f(weight.data, weight.elem, c);
    store_f(out, out_elem, base + c, v);
  }
}

__global__ void embedding_kernel(int64_t n, int64_t vocab, int64_t width, void* out, int out_elem, Operand table,
                                 const int64_t* indices, int* error) {
  GRID_STRIDE(i, n) {
    const int64_t row = i / width, column = i % width;
    const int64_t index = indices[row];
    if (index < 0 || index >= vocab) {
      *error = 1;
      store_f(out, out_elem, i, 0.0f);
      continue;
    }
    convert_element(out, out_elem, i, table.data, table.elem, index * width + column);
  }
}

__global__ void index_copy_kernel(int64_t n, int64_t dim_size, int64_t inner, int64_t index_count, void* out,
                                  int out_elem, Operand source, const int64_t* index, int* error) {
  GRID_STRIDE(i, n) {
    const int64_t slot = cache_slot(i, dim_size, inner, index_count, index, error);
    if (slot >= 0) convert_element(out, out_elem, slot, source.data, source.elem, i);
  }
}

__global__ void index_kernel(Indexer broadcast, int64_t n, GatherParams g, void* out, int out_elem, Operand self,
                             int* error) {
  GRID_STRIDE(i, n) {
    const int64_t position = i / g.inner;
    int64_t o[4];
    offsets_of<4>(broadcast, position, o);
    int64_t source = i % g.inner;
    bool valid = true;
    for (int t = 0; t < g.count; ++t) {
      int64_t value = g.index[t][o[t + 1]];
      if (value < 0) value += g.dim_size[t];
      if (value < 0 || value >= g.dim_size[t]) valid = false;
      source += value * g.dim_stride[t];
    }
    if (!valid) {
      *error = 1;
      store_i(out, out_elem, i, 0);
      continue;
    }
    convert_element(out, out_elem, i, self.data, self.elem, source);
  }
}

__global__ void rotary_kernel(int64_t n, int64_t half, float scaling, void* cos, void* sin, int out_elem,
                              Operand inv_freq, const int64_t* positions) {
  GRID_STRIDE(i, n) {
    const int64_t row = i / half, f = i % half;
    const float angle = static_cast<float>(positions[row]) * load_f(inv_freq.data, inv_freq.elem, f);
    const float c = cosf(angle) * scaling, s = sinf(angle) * scaling;
    const int64_t at = row * 2 * half + f;
    store_f(cos, out_elem, at, c);
    store_f(cos, out_elem, at + half, c);
    store_f(sin, out_elem, at, s);
    store_f(sin, out_elem, at + half, s);
  }
}

__global__ void softmax_kernel(int64_t width, void* out, int out_elem, Operand x) {
  __shared__ float reduce[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  float peak = -INFINITY;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) peak = fmaxf(peak, load_f(x.data, x.elem, base + c));
  peak = block_max(peak, reduce);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) sum += expf(load_f(x.data, x.elem, base + c) - peak);
  sum = block_sum(sum, reduce);
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
    store_f(out, out_elem, base + c, expf(load_f(x.data, x.elem, base + c) - peak) / sum);
}

// ---- GEMM ----

constexpr int kTile = 16;

__global__ void linear_kernel(int64_t m, int64_t n, int64_t k, void* c, int c_elem, Operand a, Operand b,
                              Operand bias) {
  __shared__ float a_tile[kTile][kTile + 1];
  __shared__ float b_tile[kTile][kTile + 1];
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  const int64_t b_row = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.y;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    const int64_t ka = k0 + threadIdx.x;
    a_tile[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? load_f(a.data, a.elem, row * k + ka) : 0.0f;
    b_tile[threadIdx.y][threadIdx.x] = (b_row < n && ka < k) ? load_f(b.data, b.elem, b_row * k + ka) : 0.0f;
    __syncthreads();
    for (int kk = 0; kk < kTile; ++kk) acc += a_tile[threadIdx.y][kk] * b_tile[threadIdx.x][kk];
    __syncthreads();
  }
  if (row < m && column < n) {
    if (bias.data) acc += load_f(bias.data, bias.elem, column);
    store_f(c, c_elem, row * n + column, acc);
  }
}

__global__ void bias_activation_kernel(int64_t count, int64_t n, void* c, int c_elem, Operand bias,
                                       UnaryOp activation) {
  GRID_STRIDE(i, count) {
    float v = load_f(c, c_elem, i);
    if (bias.data) v += load_f(bias.data, bias.elem, i % n);
    store_f(c, c_elem, i, apply_unary(activation, v));
  }
}

// ---- CNN ----

__global__ void conv2d_kernel(ConvParams p, int64_t n, void* out, int out_elem, Operand x, Operand w, Operand bias,
                              Operand residual) {
  const int64_t in_group = p.in_channels / p.groups, out_group = p.out_channels / p.groups;
  GRID_STRIDE(i, n) {
    const int64_t ow = i % p.out_w, oh = (i / p.out_w) % p.out_h, co = (i / (p.out_w * p.out_h)) % p.out_channels,
                  b = i / (p.out_w * p.out_h * p.out_channels);
    const int64_t first_channel = (co / out_group) * in_group;
    float acc = 0.0f;
    for (int64_t ci = 0; ci < in_group; ++ci) {
      const int64_t plane = (b * p.in_channels + first_channel + ci) * p.in_h;
      const int64_t weights = (co * in_group + ci) * p.kernel_h;
      for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
        const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
        if (ih < 0 || ih >= p.in_h) continue;
        for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
          const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
          if (iw < 0 || iw >= p.in_w) continue;
          acc += load_f(x.data, x.elem, (plane + ih) * p.in_w + iw) *
                 load_f(w.data, w.elem, (weights + kh) * p.kernel_w + kw);
        }
      }
    }
    if (bias.data) acc += load_f(bias.data, bias.elem, co);
    if (residual.data) acc += load_f(residual.data, residual.elem, i);
    acc = apply_unary(p.activation, acc);
    if (p.use_clamp) acc = fminf(fmaxf(acc, p.min_val), p.max_val);
    store_f(out, out_elem, i, acc);
  }
}

__global__ void max_pool_kernel(PoolParams p, int64_t n, void* out, int out_elem, Operand x) {
  GRID_STRIDE(i, n) {
    const int64_t ow = i % p.out_w, oh = (i / p.out_w) % p.out_h, plane = i / (p.out_w * p.out_h);
    float best = -INFINITY;
    for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
      const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
      if (ih < 0 || ih >= p.in_h) continue;
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
        if (iw < 0 || iw >= p.in_w) continue;
        const float v = load_f(x.data, x.elem, (plane * p.in_h + ih) * p.in_w + iw);
        if (v > best || isnan(v)) best = v;
      }
    }
    store_f(out, out_elem, i, best);
  }
}

__global__ void adaptive_avg_pool_kernel(int64_t n, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w, void* out,
                                         int out_elem, Operand x) {
  GRID_STRIDE(i, n) {
    const int64_t ow = i % out_w, oh = (i / out_w) % out_h, plane = i / (out_w * out_h);
    const int64_t h0 = oh * in_h / out_h, h1 = ((oh + 1) * in_h + out_h - 1) / out_h;
    const int64_t w0 = ow * in_w / out_w, w1 = ((ow + 1) * in_w + out_w - 1) / out_w;
    float sum = 0.0f;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) sum += load_f(x.data, x.elem, (plane * in_h + h) * in_w + w);
    store_f(out, out_elem, i, sum / static_cast<float>((h1 - h0) * (w1 - w0)));
  }
}

__global__ void im2col_kernel(ConvParams p, int64_t n, void* col, Operand x) {
  const int64_t pixels = p.out_h * p.out_w, taps = p.kernel_h * p.kernel_w;
  GRID_STRIDE(i, n) {
    const int64_t pixel = i % pixels, row = i / pixels;
    const int64_t ci = row / taps, kh = (row / p.kernel_w) % p.kernel_h, kw = row % p.kernel_w;
    const int64_t ih = (pixel / p.out_w) * p.stride_h - p.pad_h + kh * p.dilation_h;
    const int64_t iw = (pixel % p.out_w) * p.stride_w - p.pad_w + kw * p.dilation_w;
    if (ih < 0 || ih >= p.in_h || iw < 0 || iw >= p.in_w)
      store_f(col, x.elem, i, 0.0f);
    else
      convert_element(col, x.elem, i, x.data, x.elem, (ci * p.in_h + ih) * p.in_w + iw);
  }
}

__global__ void conv_epilogue_kernel(ConvParams p, int64_t n, void* out, int out_elem, Operand bias, Operand residual) {
  const int64_t pixels = p.out_h * p.out_w;
  GRID_STRIDE(i, n) {
    float acc = load_f(out, out_elem, i);
    if (bias.data) acc += load_f(bias.data, bias.elem, (i / pixels) % p.out_channels);
    if (residual.data) acc += load_f(residual.data, residual.elem, i);
    acc = apply_unary(p.activation, acc);
    if (p.use_clamp) acc = fminf(fmaxf(acc, p.min_val), p.max_val);
    store_f(out, out_elem, i, acc);
  }
}

// ---- decode GEMV: one warp (or `parts` warps) per output, 16-byte loads of the weight row and of the (cached)
// activation row ----

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;

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

struct GemvBatch {
  GemvSegment segments[kGemvMaxSegments];
  int64_t first[kGemvMaxSegments + 1];  // task index where each segment starts
  int count;                            // a gated batch has one segment of tasks, its up rows in segments[1]
  GemvNorm norm;
};

template <typename T>
__device__ __forceinline__ float dot_vector(uint4 a, uint4 b) {
  constexpr int kPerVector = 16 / sizeof(T);
  const T* x = reinterpret_cast<const T*>(&a);
  const T* w = reinterpret_cast<const T*>(&b);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerVector; ++e) sum += to_float(x[e]) * to_float(w[e]);
  return sum;
}

// The activation vector `at`, normalized as the fused RMSNorm writes it: x * inv_rms * weight, rounded to T.
template <typename T>
__device__ __forceinline__ uint4 activation_vector(const uint4* x, const uint4* norm_weight, float inv_rms,
                                                   int64_t at) {
  uint4 v = __ldg(x + at);
  if (!norm_weight) return v;
  constexpr int kPerVector = 16 / sizeof(T);
  const uint4 g = __ldg(norm_weight + at);
  T* values = reinterpret_cast<T*>(&v);
  const T* scales = reinterpret_cast<const T*>(&g);
#pragma unroll
  for (int e = 0; e < kPerVector; ++e) values[e] = from_float<T>(to_float(values[e]) * inv_rms * to_float(scales[e]));
  return v;
}

// 1 / sqrt(mean(x^2) + eps) over the k elements of x, computed by the whole block (as rms_norm_kernel does).
template <typename T>
__device__ float block_inverse_rms(const uint4* x, int64_t vectors, int64_t k, double eps) {
  __shared__ float reduce[32];
  constexpr int kPerVector = 16 / sizeof(T);
  float squares = 0.0f;
  for (int64_t at = threadIdx.x; at < vectors; at += blockDim.x) {
    const uint4 v = __ldg(x + at);
    const T* values = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) squares += to_float(values[e]) * to_float(values[e]);
  }
  const float total = block_sum(squares, reduce);
  return static_cast<float>(1.0 / sqrt(static_cast<double>(total) / static_cast<double>(k) + eps));
}

// `parts` warps share a task (each a slice of its vectors), so that short outputs still fill the GPU; a task is one
// row of one segment, or a gate row and its up row (R = 2, loaded together). The first weights are loaded before
// waiting for the kernel that writes the activations (programmatic dependent launch), and U vectors of each row
// are in flight per lane.
template <typename T, int R, int U>
__global__ void __launch_bounds__(kGemvThreads) gemv_batch_kernel(GemvBatch batch, int64_t k, int parts, const T* x) {
  __shared__ float partial[R][kGemvWarps];
  allow_dependent_launch();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % parts;
  const int64_t tasks = batch.first[batch.count];
  const int64_t task = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / parts) + warp / parts;
  const bool active = task < tasks;
  int segment = 0;
  while (segment + 1 < batch.count && task >= batch.first[segment + 1]) ++segment;
  const int64_t row = active ? task - batch.first[segment] : 0;
  const int64_t vectors = k / (16 / sizeof(T));
  const uint4* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = reinterpret_cast<const uint4*>(static_cast<const T*>(batch.segments[segment + r].w) + row * k);
  const int64_t stride = 32 * int64_t{parts} * U;
  int64_t base = part * 32 + lane;
  uint4 weights[R][U];
  auto load_weights = [&]() {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t at = base + 32 * int64_t{parts} * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        weights[r][u] = active && at < vectors ? __ldcs(rows[r] + at) : make_uint4(0, 0, 0, 0);
    }
  };
  load_weights();  // weights are constants: safe before the producer of x has finished
  wait_for_producer();
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const auto* norm_weight = static_cast<const uint4*>(batch.norm.weight);
  const float inv_rms = batch.norm.enabled ? block_inverse_rms<T>(xv, vectors, k, batch.norm.eps) : 1.0f;
  float acc[R] = {};
  while (true) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t at = base + 32 * int64_t{parts} * u;
      if (!active || at >= vectors) break;
      const uint4 input = batch.norm.enabled ? activation_vector<T>(xv, norm_weight, inv_rms, at) : __ldg(xv + at);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += dot_vector<T>(input, weights[r][u]);
    }
    base += stride;
    if (!active || base >= vectors) break;
    load_weights();
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  if (parts > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) partial[r][warp] = acc[r];
    __syncthreads();
    if (part == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
        for (int p = 1; p < parts; ++p) acc[r] += partial[r][warp + p];
  }
  if (!active || part != 0 || lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const Operand bias = batch.segments[segment + r].bias;
    if (bias.data) acc[r] += load_f(bias.data, bias.elem, row);
  }
  const GemvSegment& out = batch.segments[segment];
  float result = acc[0];
  if constexpr (R == 2) result = acc[0] / (1.0f + __expf(-acc[0])) * acc[1];
  if (out.residual.data) result += load_f(out.residual.data, out.residual.elem, row);
  static_cast<T*>(out.y)[row] = from_float<T>(result);
}

// ---- attention: one block per (batch, query head, query row); a warp per key for the scores, a warp per key
// and a lane per value feature for the weighted sum, the scores in shared memory ----

constexpr int kAttentionWarps = 8;
constexpr int kAttentionThreads = kAttentionWarps * 32;
constexpr int64_t kAttentionChunk = 128;               // value features summed per pass: 4 per lane
constexpr int64_t kAttentionSharedFloats = 12 * 1024;  // 48 KB

// Key positions a query reads: all of them, or 0..max(cache_position) (read on the device, so that a replayed
// CUDA graph follows the position).
__device__ int64_t attended_keys(const AttentionParams& p) {
  if (!p.cache_position || p.cache_position_count == 0) return p.source;
  int64_t last = p.cache_position[0];
  for (int64_t j = 1; j < p.cache_position_count; ++j) last = max(last, p.cache_position[j]);
  return min(max(last + 1, int64_t{0}), p.source);
}

// What the mask adds to the score of query row `row` against key j: 0 without a mask, -inf where a bool mask is
// false, else the mask's value.
__device__ __forceinline__ float mask_term(const AttentionParams& p, int64_t b, int64_t head, int64_t row, int64_t j) {
  if (!p.mask) return 0.0f;
  const int64_t at =
      b * p.mask_batch_stride + head * p.mask_head_stride + row * p.mask_row_stride + j * p.mask_column_stride;
  if (p.mask_elem == kBool) return static_cast<const uint8_t*>(p.mask)[at] ? 0.0f : -INFINITY;
  return load_f(p.mask, p.mask_elem, at);
}

// The score from the dot product and the mask's term: scaled, causal limit and mask applied.
__device__ __forceinline__ float masked_score(const AttentionParams& p, float dot, float mask, int64_t row, int64_t j) {
  float s = __fmul_rn(dot, p.scale);
  if (p.causal && j > row) s = -INFINITY;
  if (p.mask) s = __fadd_rn(s, mask);
  return s;
}

// Scores of keys [begin, end) for one query row, a warp per group of kKeysPerWarp keys (their loads in flight
// together): scale, causal limit and mask applied, written to scores[j - begin]. Returns this thread's maximum.
constexpr int kKeysPerWarp = 4;

__device__ float score_keys(const AttentionParams& p, const float* query, Operand k, int64_t k_base, int64_t b,
                            int64_t head, int64_t row, int64_t begin, int64_t end, float* scores) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float peak = -INFINITY;
  for (int64_t j0 = begin + warp * kKeysPerWarp; j0 < end; j0 += kAttentionWarps * kKeysPerWarp) {
    float dot[kKeysPerWarp] = {};
    for (int64_t e = lane; e < p.embed; e += 32) {
      const float qe = query[e];
#pragma unroll
      for (int u = 0; u < kKeysPerWarp; ++u)
        if (j0 + u < end) dot[u] += qe * load_f(k.data, k.elem, k_base + (j0 + u) * p.embed + e);
    }
#pragma unroll
    for (int u = 0; u < kKeysPerWarp; ++u) {
      for (int offset = 16; offset > 0; offset /= 2) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], offset);
      const int64_t j = j0 + u;
      if (j >= end) continue;
      const float s = masked_score(p, dot[u], mask_term(p, b, head, row, j), row, j);
      if (lane == 0) scores[j - begin] = s;
      peak = fmaxf(peak, s);
    }
  }
  return peak;
}

// Sums weights[j - begin] * v[j, first + lane + 32 t] over keys [begin, end) into `partial` [warps][chunk], then
// over the warps: every thread then reads the totals for features first .. first + kAttentionChunk from
// partial[0..chunk). Synchronizes the block.
__device__ void sum_values(const AttentionParams& p, Operand v, int64_t v_base, int64_t begin, int64_t end,
                           const float* weights, int64_t first, float* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[kAttentionChunk / 32] = {};
  for (int64_t j0 = begin + warp * kKeysPerWarp; j0 < end; j0 += kAttentionWarps * kKeysPerWarp) {
#pragma unroll
    for (int u = 0; u < kKeysPerWarp; ++u) {
      const int64_t j = j0 + u;
      if (j >= end) break;
      const float weight = weights[j - begin];
      const int64_t at = v_base + j * p.value_embed + first;
#pragma unroll
      for (int t = 0; t < kAttentionChunk / 32; ++t) {
        const int64_t e = lane + 32 * t;
        if (first + e < p.value_embed) acc[t] += weight * load_f(v.data, v.elem, at + e);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kAttentionChunk / 32; ++t) partial[warp * kAttentionChunk + lane + 32 * t] = acc[t];
  __syncthreads();
  for (int64_t e = threadIdx.x; e < kAttentionChunk; e += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) total += partial[w * kAttentionChunk + e];
    partial[e] = total;  // each thread reads only its own features of the other warps before this write
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kAttentionThreads, 4)
    attention_kernel(AttentionParams p, void* out, int out_elem, Operand q, Operand k, Operand v) {
  extern __shared__ float shared[];
  __shared__ float reduce[32];
  const int64_t row = blockIdx.x % p.length, head = (blockIdx.x / p.length) % p.q_heads,
                b = blockIdx.x / (p.length * p.q_heads);
  const int64_t reads = attended_keys(p);
  float* query = shared;
  float* scores = query + p.embed;
  float* partial = scores + p.source;  // [warps][kAttentionChunk]
  const int64_t q_base = ((b * p.q_heads + head) * p.length + row) * p.embed;
  const int64_t k_base = (b * p.k_heads + head / (p.q_heads / p.k_heads)) * p.source * p.embed;
  const int64_t v_base = (b * p.v_heads + head / (p.q_heads / p.v_heads)) * p.source * p.value_embed;
  for (int64_t e = threadIdx.x; e < p.embed; e += blockDim.x) query[e] = load_f(q.data, q.elem, q_base + e);
  __syncthreads();
  float peak = score_keys(p, query, k, k_base, b, head, row, 0, reads, scores);
  peak = block_max(peak, reduce);  // synchronizes, so every score is written
  const int64_t out_base = ((b * p.q_heads + head) * p.length + row) * p.value_embed;
  if (p.zero_masked_rows && peak == -INFINITY) {
    for (int64_t e = threadIdx.x; e < p.value_embed; e += blockDim.x) store_f(out, out_elem, out_base + e, 0.0f);
    return;
  }
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < reads; j += blockDim.x) {
    const float weight = expf(scores[j] - peak);
    scores[j] = weight;
    sum += weight;
  }
  sum = block_sum(sum, reduce);  // synchronizes, so every weight is written
  for (int64_t first = 0; first < p.value_embed; first += kAttentionChunk) {
    sum_values(p, v, v_base, 0, reads, scores, first, partial);
    for (int64_t e = threadIdx.x; e < kAttentionChunk && first + e < p.value_embed; e += blockDim.x)
      store_f(out, out_elem, out_base + first + e, partial[e] / sum);
    __syncthreads();
  }
}

// ---- flash-decoding: the keys of a query row split over blocks, each leaving its maximum, its sum of weights
// and its unnormalized weighted values; a second kernel combines them ----

constexpr int64_t kSplitKeys = 64;

__global__ void __launch_bounds__(kAttentionThreads, 4)
    attention_split_kernel(AttentionParams p, int64_t splits, float* stats, float* values, Operand q, Operand k,
                           Operand v) {
  extern __shared__ float shared[];
  __shared__ float reduce[32];
  const int64_t r = blockIdx.x, split = blockIdx.y;
  const int64_t row = r % p.length, head = (r / p.length) % p.q_heads, b = r / (p.length * p.q_heads);
  const int64_t reads = attended_keys(p);
  const int64_t begin = split * kSplitKeys, end = min(begin + kSplitKeys, reads);
  if (begin >= end) return;  // past the attended keys: the combination reads only the splits before
  float* stat = stats + (r * splits + split) * 2;
  float* result = values + (r * splits + split) * p.value_embed;
  float* query = shared;
  float* scores = query + p.embed;
  float* partial = scores + kSplitKeys;  // [warps][kAttentionChunk]
  const int64_t q_base = ((b * p.q_heads + head) * p.length + row) * p.embed;
  const int64_t k_base = (b * p.k_heads + head / (p.q_heads / p.k_heads)) * p.source * p.embed;
  const int64_t v_base = (b * p.v_heads + head / (p.q_heads / p.v_heads)) * p.source * p.value_embed;
  for (int64_t e = threadIdx.x; e < p.embed; e += blockDim.x) query[e] = load_f(q.data, q.elem, q_base + e);
  __syncthreads();
  float peak = score_keys(p, query, k, k_base, b, head, row, begin, end, scores);
  peak = block_max(peak, reduce);
  if (peak == -INFINITY) {  // no keys here, or all masked out
    for (int64_t e = threadIdx.x; e < p.value_embed; e += blockDim.x) result[e] = 0.0f;
    if (threadIdx.x == 0) {
      stat[0] = -INFINITY;
      stat[1] = 0.0f;
    }
    return;
  }
  float sum = 0.0f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float weight = expf(scores[j - begin] - peak);
    scores[j - begin] = weight;
    sum += weight;
  }
  sum = block_sum(sum, reduce);
  for (int64_t first = 0; first < p.value_embed; first += kAttentionChunk) {
    sum_values(p, v, v_base, begin, end, scores, first, partial);
    for (int64_t e = threadIdx.x; e < kAttentionChunk && first + e < p.value_embed; e += blockDim.x)
      result[first + e] = partial[e];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stat[0] = peak;
    stat[1] = sum;
  }
}

// ---- decode attention (one query row per head against a cache, 16-byte loads): each block takes the query heads
// that share one key/value head (grouped-query attention reads each cache row once for all of them) and a split of
// kSplitKeys keys; groups of lanes share a key row, then a value row. The combine kernel below merges the splits ----

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeRowsInFlight = 8;  // key (or value) rows each lane group loads before using them
constexpr int kDecodeMaxHeads = 8;      // query heads one block takes
constexpr int64_t kDecodeSharedFloats = 2048;

// Lanes sharing one row of `vectors` 16-byte vectors: the largest power of two up to min(vectors, 32), so that a
// lane holds at most two of the row's vectors.
__host__ __device__ inline int lanes_per_row(int64_t vectors) {
  int lanes = 1;
  while (lanes < 32 && lanes * 2 <= vectors) lanes *= 2;
  return lanes;
}
__host__ __device__ inline int vectors_per_lane(int64_t vectors) {
  return static_cast<int>((vectors + lanes_per_row(vectors) - 1) / lanes_per_row(vectors));
}

template <typename T>
__device__ __forceinline__ float dot_shared(uint4 keys, const float* query) {
  constexpr int kPerVector = 16 / sizeof(T);
  const T* values = reinterpret_cast<const T*>(&keys);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerVector; ++e) sum += to_float(values[e]) * query[e];
  return sum;
}

// Loops over the heads of a block stay rolled: each block runs its code once, so a long unrolled body would be
// fetched from memory rather than from the instruction cache.
template <typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_attention_split_kernel(AttentionParams p, int heads, int64_t splits, float* stats, float* values, Operand q,
                                  const T* k, const T* v) {
  constexpr int kPerVector = 16 / sizeof(T);
  __shared__ float query[kDecodeSharedFloats];  // [heads][embed]
  __shared__ float scores[kDecodeMaxHeads][kSplitKeys];
  __shared__ float partial[kDecodeWarps][kDecodeSharedFloats];  // [warp][heads][value_embed]
  __shared__ float head_peak[kDecodeMaxHeads], head_sum[kDecodeMaxHeads];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t chunks = p.q_heads / heads;
  const int64_t b = blockIdx.x / chunks, first_head = (blockIdx.x % chunks) * heads, split = blockIdx.y;
  const int64_t begin = split * kSplitKeys, end = min(begin + kSplitKeys, attended_keys(p)), count = end - begin;
  if (begin >= end) return;  // past the attended keys: the combination reads only the splits before
  for (int64_t e = threadIdx.x; e < heads * p.embed; e += blockDim.x)
    query[e] = load_f(q.data, q.elem, (b * p.q_heads + first_head) * p.embed + e);
  __syncthreads();

  // Scores of every head of the block against the split's keys, each key row loaded once.
  const int64_t key_vectors = p.embed / kPerVector;
  const auto* keys =
      reinterpret_cast<const uint4*>(k + (b * p.k_heads + first_head / (p.q_heads / p.k_heads)) * p.source * p.embed);
  const int key_lanes = lanes_per_row(key_vectors);
  const int64_t keys_per_pass = kDecodeWarps * (32 / key_lanes);
  const int64_t key_slot = warp * (32 / key_lanes) + lane / key_lanes;
  const int key_lane = lane % key_lanes;
  for (int64_t base = begin; base < end; base += keys_per_pass * kDecodeRowsInFlight) {
    uint4 loaded[kDecodeRowsInFlight][2];
    float masks[kDecodeRowsInFlight];  // the first head's mask terms, loaded with the keys
#pragma unroll
    for (int u = 0; u < kDecodeRowsInFlight; ++u) {
      const int64_t j = base + u * keys_per_pass + key_slot;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t at = key_lane + h * key_lanes;
        loaded[u][h] = j < end && at < key_vectors ? __ldg(keys + j * key_vectors + at) : make_uint4(0, 0, 0, 0);
      }
      masks[u] = j < end ? mask_term(p, b, first_head, 0, j) : 0.0f;
    }
#pragma unroll 1
    for (int g = 0; g < heads; ++g) {
#pragma unroll
      for (int u = 0; u < kDecodeRowsInFlight; ++u) {
        const int64_t j = base + u * keys_per_pass + key_slot;
        float dot = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t at = key_lane + h * key_lanes;
          if (at < key_vectors) dot += dot_shared<T>(loaded[u][h], query + g * p.embed + at * kPerVector);
        }
        for (int offset = key_lanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (j < end && key_lane == 0) {
          const float mask = g == 0 || p.mask_head_stride == 0 ? masks[u] : mask_term(p, b, first_head + g, 0, j);
          scores[g][j - begin] = masked_score(p, dot, mask, 0, j);
        }
      }
    }
  }
  __syncthreads();

  // Softmax numerators per head (a warp per head): maximum, weights, their sum.
  for (int g = warp; g < heads; g += kDecodeWarps) {
    float peak = -INFINITY;
    for (int64_t j = lane; j < count; j += 32) peak = fmaxf(peak, scores[g][j]);
    for (int offset = 16; offset > 0; offset /= 2) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, offset));
    float sum = 0.0f;
    for (int64_t j = lane; j < count; j += 32) {
      const float weight = peak == -INFINITY ? 0.0f : expf(scores[g][j] - peak);
      scores[g][j] = weight;
      sum += weight;
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      head_peak[g] = peak;
      head_sum[g] = sum;
    }
  }
  __syncthreads();

  // The weighted sums of the value rows, head by head (rows after the first head's come from the L1 cache).
  const int64_t value_vectors = p.value_embed / kPerVector;
  const auto* rows = reinterpret_cast<const uint4*>(v + (b * p.v_heads + first_head / (p.q_heads / p.v_heads)) *
                                                            p.source * p.value_embed);
  const int value_lanes = lanes_per_row(value_vectors);
  const int64_t rows_per_pass = kDecodeWarps * (32 / value_lanes);
  const int64_t row_slot = warp * (32 / value_lanes) + lane / value_lanes;
  const int value_lane = lane % value_lanes;
#pragma unroll 1
  for (int g = 0; g < heads; ++g) {
    float acc[2][kPerVector] = {};
    for (int64_t base = begin; base < end; base += rows_per_pass * kDecodeRowsInFlight) {
      uint4 loaded[kDecodeRowsInFlight][2];
#pragma unroll
      for (int u = 0; u < kDecodeRowsInFlight; ++u) {
        const int64_t j = base + u * rows_per_pass + row_slot;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t at = value_lane + h * value_lanes;
          loaded[u][h] = j < end && at < value_vectors ? __ldg(rows + j * value_vectors + at) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kDecodeRowsInFlight; ++u) {
        const int64_t j = base + u * rows_per_pass + row_slot;
        const float weight = j < end ? scores[g][j - begin] : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const T* features = reinterpret_cast<const T*>(&loaded[u][h]);
#pragma unroll
          for (int e = 0; e < kPerVector; ++e) acc[h][e] += weight * to_float(features[e]);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < kPerVector; ++e)
        for (int offset = 16; offset >= value_lanes; offset /= 2)
          acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], offset);
      const int64_t at = value_lane + h * value_lanes;
      if (lane < value_lanes && at < value_vectors)
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) partial[warp][g * p.value_embed + at * kPerVector + e] = acc[h][e];
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < heads * p.value_embed; i += blockDim.x) {
    const int64_t g = i / p.value_embed, e = i % p.value_embed;
    float total = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) total += partial[w][i];
    values[((b * p.q_heads + first_head + g) * splits + split) * p.value_embed + e] = total;
  }
  for (int g = threadIdx.x; g < heads; g += blockDim.x) {
    float* stat = stats + ((b * p.q_heads + first_head + g) * splits + split) * 2;
    stat[0] = head_peak[g];
    stat[1] = head_sum[g];
  }
}

__global__ void attention_combine_kernel(AttentionParams p, int64_t splits, const float* stats, const float* values,
                                         void* out, int out_elem) {
  const int64_t r = blockIdx.x;
  const float* stat = stats + r * splits * 2;
  const int64_t used = min(splits, (attended_keys(p) + kSplitKeys - 1) / kSplitKeys);
  float peak = -INFINITY;
  for (int64_t s = 0; s < used; ++s) peak = fmaxf(peak, stat[2 * s]);
  float total = 0.0f;
  for (int64_t s = 0; s < used; ++s)
    if (stat[2 * s] != -INFINITY) total += stat[2 * s + 1] * expf(stat[2 * s] - peak);
  for (int64_t e = threadIdx.x; e < p.value_embed; e += blockDim.x) {
    float value;
    if (peak == -INFINITY) {
      value = p.zero_masked_rows ? 0.0f : NAN;  // the softmax of a row with every score -inf
    } else {
      float acc = 0.0f;
      for (int64_t s = 0; s < used; ++s)
        if (stat[2 * s] != -INFINITY) acc += values[(r * splits + s) * p.value_embed + e] * expf(stat[2 * s] - peak);
      value = acc / total;
    }
    store_f(out, out_elem, r * p.value_embed + e, value);
  }
}

}  // namespace

cudaError_t launch_copy(cudaStream_t stream, const Indexer& index, void* dst, int dst_elem, Operand src) {
  const int64_t n = indexer_count(index);
  if (n > 0) copy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(index, n, dst, dst_elem, src);
  return cudaGetLastError();
}

cudaError_t launch_binary(cudaStream_t stream, BinaryOp op, const Indexer& index, void* out, int out_elem, Operand a,
                          Operand b, double scalar, int64_t int_scalar, double alpha, int64_t int_alpha) {
  const int64_t n = indexer_count(index);
  if (n > 0)
    binary_kernel<<<blocks_for(n), kThreads, 0, stream>>>(op, index, n, out, out_elem, a, b, scalar, int_scalar, alpha,
                                                          int_alpha);
  return cudaGetLastError();
}

cudaError_t launch_unary(cudaStream_t stream, UnaryOp op, int64_t count, void* out, int out_elem, Operand in) {
  if (count > 0) unary_kernel<<<blocks_for(count), kThreads, 0, stream>>>(op, count, out, out_elem, in);
  return cudaGetLastError();
}

cudaError_t launch_where(cudaStream_t stream, const Indexer& index, void* out, int out_elem, Operand cond, Operand a,
                         Operand b, double other) {
  const int64_t n = indexer_count(index);
  if (n > 0) where_kernel<<<blocks_for(n), kThreads, 0, stream>>>(index, n, out, out_elem, cond, a, b, other);
  return cudaGetLastError();
}

cudaError_t launch_rope(cudaStream_t stream, const Indexer& index, int64_t width, void* out, int out_elem, Operand x,
                        Operand cos, Operand sin) {
  const int64_t n = indexer_count(index);
  if (n > 0) rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(index, n, width, out, out_elem, x, cos, sin);
  return cudaGetLastError();
}

cudaError_t launch_rope_cache(cudaStream_t stream, const RopeCacheBatch& batch) {
  if (batch.count < 1 || batch.count > kRopeCacheMaxJobs) return cudaErrorInvalidValue;
  int64_t most = 0;
  for (int j = 0; j < batch.count; ++j) most = std::max(most, batch.jobs[j].count);
  if (most > 0)
    rope_cache_kernel<<<dim3(blocks_for(most), static_cast<unsigned>(batch.count)), kThreads, 0, stream>>>(batch);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(cudaStream_t stream, int64_t rows, int64_t row_size, double eps, void* out, int out_elem,
                            Operand x, Operand weight) {
  if (rows > 0)
    rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(row_size, eps, out, out_elem, x, weight);
  return cudaGetLastError();
}

cudaError_t launch_embedding(cudaStream_t stream, int64_t count, int64_t vocab, int64_t width, void* out, int out_elem,
                             Operand table, const int64_t* indices, int* error) {
  const int64_t n = count * width;
  if (n > 0)
    embedding_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, vocab, width, out, out_elem, table, indices, error);
  return cudaGetLastError();
}

cudaError_t launch_index_copy(cudaStream_t stream, int64_t outer, int64_t dim_size, int64_t inner, int64_t index_count,
                              void* out, int out_elem, Operand source, const int64_t* index, int* error) {
  const int64_t n = outer * index_count * inner;
  if (n > 0)
    index_copy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, dim_size, inner, index_count, out, out_elem, source,
                                                              index, error);
  return cudaGetLastError();
}

cudaError_t launch_index(cudaStream_t stream, const Indexer& broadcast, const GatherParams& g, void* out, int out_elem,
                         Operand self, int* error) {
  const int64_t n = indexer_count(broadcast) * g.inner;
  if (n > 0) index_kernel<<<blocks_for(n), kThreads, 0, stream>>>(broadcast, n, g, out, out_elem, self, error);
  return cudaGetLastError();
}

cudaError_t launch_linear(cudaStream_t stream, int64_t m, int64_t n, int64_t k, void* c, int c_elem, Operand a,
                          Operand b, Operand bias) {
  if (m > 0 && n > 0) {
    const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
    linear_kernel<<<grid, dim3(kTile, kTile), 0, stream>>>(m, n, k, c, c_elem, a, b, bias);
  }
  return cudaGetLastError();
}

cudaError_t launch_bias_activation(cudaStream_t stream, int64_t m, int64_t n, void* c, int c_elem, Operand bias,
                                   UnaryOp activation) {
  const int64_t count = m * n;
  if (count > 0)
    bias_activation_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, n, c, c_elem, bias, activation);
  return cudaGetLastError();
}

cudaError_t launch_conv2d(cudaStream_t stream, const ConvParams& p, void* out, int out_elem, Operand x, Operand w,
                          Operand bias, Operand residual) {
  const int64_t n = p.batch * p.out_channels * p.out_h * p.out_w;
  if (n > 0) conv2d_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, out, out_elem, x, w, bias, residual);
  return cudaGetLastError();
}

cudaError_t launch_max_pool2d(cudaStream_t stream, const PoolParams& p, void* out, int out_elem, Operand x) {
  const int64_t n = p.planes * p.out_h * p.out_w;
  if (n > 0) max_pool_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, out, out_elem, x);
  return cudaGetLastError();
}

cudaError_t launch_adaptive_avg_pool2d(cudaStream_t stream, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w, void* out, int out_elem, Operand x) {
  const int64_t n = planes * out_h * out_w;
  if (n > 0)
    adaptive_avg_pool_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, in_h, in_w, out_h, out_w, out, out_elem, x);
  return cudaGetLastError();
}

cudaError_t launch_im2col(cudaStream_t stream, const ConvParams& p, void* col, Operand x) {
  const int64_t n = p.in_channels / p.groups * p.kernel_h * p.kernel_w * p.out_h * p.out_w;
  if (n > 0) im2col_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, col, x);
  return cudaGetLastError();
}

cudaError_t launch_conv_epilogue(cudaStream_t stream, const ConvParams& p, void* out, int out_elem, Operand bias,
                                 Operand residual) {
  const int64_t n = p.batch * p.out_channels * p.out_h * p.out_w;
  if (n > 0) conv_epilogue_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, out, out_elem, bias, residual);
  return cudaGetLastError();
}

bool gemv_supports(int64_t k, int elem) { return k > 0 && elem <= kBF16 && (k * (elem == kF32 ? 4 : 2)) % 16 == 0; }

namespace {

// Launches `kernel` with programmatic dependent launch allowed, so that it can start while the previous kernel of
// the stream finishes (the kernel waits for it with wait_for_producer()).
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), unsigned blocks, unsigned threads, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename T, int R>
cudaError_t launch_gemv_typed(cudaStream_t stream, int64_t k, int parts, const void* x, const GemvBatch& batch) {
  const int64_t tasks = batch.first[batch.count];
  const auto blocks = static_cast<unsigned>((tasks + kGemvWarps / parts - 1) / (kGemvWarps / parts));
  const T* input = static_cast<const T*>(x);
  // Two vectors of each row in flight per lane, four for a lone row of a whole-warp task (measured on an H100).
  if (R == 1 && parts == 1)
    return launch_dependent(gemv_batch_kernel<T, R, 4>, blocks, kGemvThreads, stream, batch, k, parts, input);
  return launch_dependent(gemv_batch_kernel<T, R, 2>, blocks, kGemvThreads, stream, batch, k, parts, input);
}

template <int R>
cudaError_t launch_gemv_kernel(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvBatch& batch) {
  const int64_t tasks = batch.first[batch.count];
  if (tasks <= 0) return cudaGetLastError();
  if (batch.norm.enabled && (!batch.norm.weight || batch.norm.elem != elem)) return cudaErrorInvalidValue;
  // Short outputs split each task over up to 4 warps, so that about 6144 warps fill the GPU.
  const int64_t vectors = k / (16 / (elem == kF32 ? 4 : 2));
  int parts = 1;
  while (parts < kGemvWarps && tasks * parts < 6144 && vectors >= 32 * int64_t{parts} * 2) parts *= 2;
  switch (elem) {
    case kF32:
      return launch_gemv_typed<float, R>(stream, k, parts, x, batch);
    case kF16:
      return launch_gemv_typed<__half, R>(stream, k, parts, x, batch);
    case kBF16:
      return launch_gemv_typed<__nv_bfloat16, R>(stream, k, parts, x, batch);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_gemv_batch(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvSegment* segments,
                              int count, const GemvNorm& norm) {
  if (!gemv_supports(k, elem) || count < 1 || count > kGemvMaxSegments) return cudaErrorInvalidValue;
  GemvBatch batch{};
  batch.count = count;
  batch.norm = norm;
  for (int s = 0; s < count; ++s) {
    batch.segments[s] = segments[s];
    batch.first[s + 1] = batch.first[s] + segments[s].rows;
  }
  return launch_gemv_kernel<1>(stream, k, elem, x, batch);
}

cudaError_t launch_gemv_gated(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvSegment& gate,
                              const GemvSegment& up, const GemvNorm& norm) {
  if (!gemv_supports(k, elem) || gate.rows != up.rows) return cudaErrorInvalidValue;
  GemvBatch batch{};
  batch.count = 1;
  batch.norm = norm;
  batch.segments[0] = gate;
  batch.segments[1] = up;
  batch.first[1] = gate.rows;
  return launch_gemv_kernel<2>(stream, k, elem, x, batch);
}

cudaError_t launch_gemv(cudaStream_t stream, int64_t n, int64_t k, void* y, int elem, const void* x, const void* w,
                        Operand bias) {
  GemvSegment segment;
  segment.w = w;
  segment.y = y;
  segment.bias = bias;
  segment.rows = n;
  return launch_gemv_batch(stream, k, elem, x, &segment, 1, GemvNorm{});
}

int64_t attention_max_source() { return kAttentionSharedFloats - kAttentionWarps * kAttentionChunk; }

int64_t attention_scratch_floats(const AttentionParams& p) {
  if (p.length != 1 || p.source < 2 * kSplitKeys) return 0;
  const int64_t splits = (p.source + kSplitKeys - 1) / kSplitKeys;
  return p.batch * p.q_heads * splits * (2 + p.value_embed);
}

namespace {

// The 16-byte-load decode kernel for the splits, where the keys and values share one float storage whose rows are
// whole vectors; false when it does not apply. A block takes the most query heads of one key/value head that fit.
bool launch_decode_attention(cudaStream_t stream, const AttentionParams& p, int64_t splits, float* stats, float* values,
                             Operand q, Operand k, Operand v) {
  if (k.elem != v.elem || k.elem > kBF16) return false;
  const int64_t per_vector = k.elem == kF32 ? 4 : 8;
  const auto aligned = [](const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; };
  if (p.embed % per_vector != 0 || p.value_embed % per_vector != 0 || !aligned(k.data) || !aligned(v.data) ||
      p.q_heads % p.k_heads != 0 || p.q_heads % p.v_heads != 0)
    return false;
  const int key_slots = vectors_per_lane(p.embed / per_vector),
            value_slots = vectors_per_lane(p.value_embed / per_vector);
  if (key_slots > 2 || value_slots > 2) return false;
  // One query head per block: grouping the heads that share a key/value head (each cache row read once) measured
  // faster only at long contexts (H100, Qwen2.5-1.5B shape: 1.18x instead of 1.84x the step time of context 128
  // at 8192) and slower below (2.68 instead of 2.07 ms per token at 128), so the kernel takes `heads` but one runs.
  const int heads = 1;
  if (std::max(p.embed, p.value_embed) > kDecodeSharedFloats) return false;
  const dim3 grid(static_cast<unsigned>(p.batch * p.q_heads / heads), static_cast<unsigned>(splits));
  switch (k.elem) {
    case kF32:
      decode_attention_split_kernel<float><<<grid, kDecodeThreads, 0, stream>>>(
          p, heads, splits, stats, values, q, static_cast<const float*>(k.data), static_cast<const float*>(v.data));
      break;
    case kF16:
      decode_attention_split_kernel<__half><<<grid, kDecodeThreads, 0, stream>>>(
          p, heads, splits, stats, values, q, static_cast<const __half*>(k.data), static_cast<const __half*>(v.data));
      break;
    default:
      decode_attention_split_kernel<__nv_bfloat16><<<grid, kDecodeThreads, 0, stream>>>(
          p, heads, splits, stats, values, q, static_cast<const __nv_bfloat16*>(k.data),
          static_cast<const __nv_bfloat16*>(v.data));
      break;
  }
  return true;
}

}  // namespace

cudaError_t launch_attention(cudaStream_t stream, const AttentionParams& p, void* out, int out_elem, Operand q,
                             Operand k, Operand v, float* scratch) {
  const int64_t rows = p.batch * p.q_heads * p.length;
  if (rows <= 0) return cudaGetLastError();
  if (scratch && attention_scratch_floats(p) > 0) {
    const int64_t splits = (p.source + kSplitKeys - 1) / kSplitKeys;
    float* stats = scratch;
    float* values = scratch + rows * splits * 2;
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(splits));
    if (!launch_decode_attention(stream, p, splits, stats, values, q, k, v)) {
      const size_t shared =
          static_cast<size_t>(p.embed + kSplitKeys + kAttentionWarps * kAttentionChunk) * sizeof(float);
      attention_split_kernel<<<grid, kAttentionThreads, shared, stream>>>(p, splits, stats, values, q, k, v);
    }
    attention_combine_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(p, splits, stats, values, out, out_elem);
    return cudaGetLastError();
  }
  const size_t shared = static_cast<size_t>(p.embed + p.source + kAttentionWarps * kAttentionChunk) * sizeof(float);
  attention_kernel<<<static_cast<unsigned>(rows), kAttentionThreads, shared, stream>>>(p, out, out_elem, q, k, v);
  return cudaGetLastError();
}

cudaError_t launch_rotary_embedding(cudaStream_t stream, int64_t rows, int64_t half, float scaling, void* cos,
                                    void* sin, int out_elem, Operand inv_freq, const int64_t* positions) {
  const int64_t n = rows * half;
  if (n > 0)
    rotary_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, half, scaling, cos, sin, out_elem, inv_freq, positions);
  return cudaGetLastError();
}

cudaError_t launch_softmax(cudaStream_t stream, int64_t rows, int64_t width, void* out, int out_elem, Operand x) {
  if (rows > 0 && width > 0)
    softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(width, out, out_elem, x);
  return cudaGetLastError();
}

cudaError_t launch_fill_bytes(cudaStream_t stream, void* data, uint8_t value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  return cudaMemsetAsync(data, value, bytes, stream);
}

}  // namespace npusim::cuda
