// The CUDA backend's kernels. Generic ones take every element type through run-time element codes, compute in
// fp32 and loop grid-stride; the decode GEMV is specialized by storage type for 16-byte loads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <utility>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

namespace {

constexpr int kThreads = 256;

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

// Calls fn(T{}) with T the element type of `elem` when it is fp32, fp16 or bf16 storage (the kernels typed on their
// storage); false, calling nothing, for any other element type.
template <typename Fn>
bool with_float_storage(int elem, Fn&& fn) {
  if (elem == kF16)
    fn(__half{});
  else if (elem == kBF16)
    fn(__nv_bfloat16{});
  else if (elem == kF32)
    fn(float{});
  else
    return false;
  return true;
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
  allow_dependent_launch();
  wait_for_producer();
  const RopeCacheJob& job = batch.jobs[blockIdx.y];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < job.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (job.kind == RopeCacheKind::CopyToCache) {
      const int64_t slot = cache_slot(i, job.dim_size, job.inner, job.index_count, job.index, job.error);
      const int64_t e = i % job.inner, j = (i / job.inner) % job.index_count, outer = i / (job.inner * job.index_count);
      if (slot >= 0)
        convert_element(job.out, job.out_elem, slot, job.x.data, job.x.elem,
                        outer * job.source_outer_stride + j * job.source_index_stride + e);
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

// Mean and variance in two passes over the row (it stays in L1/L2), as the reference computes them.
__global__ void layer_norm_kernel(int64_t row_size, double eps, void* out, int out_elem, Operand x, Operand weight,
                                  Operand bias, Operand mean_out, Operand rstd_out) {
  __shared__ float reduce[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * row_size;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < row_size; c += blockDim.x) sum += load_f(x.data, x.elem, base + c);
  const float mean = block_sum(sum, reduce) / static_cast<float>(row_size);
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < row_size; c += blockDim.x) {
    const float d = load_f(x.data, x.elem, base + c) - mean;
    squares += d * d;
  }
  const double variance = static_cast<double>(block_sum(squares, reduce)) / static_cast<double>(row_size);
  const float rstd = static_cast<float>(1.0 / sqrt(variance + eps));
  for (int64_t c = threadIdx.x; c < row_size; c += blockDim.x) {
    float v = (load_f(x.data, x.elem, base + c) - mean) * rstd;
    if (weight.data) v *= load_f(weight.data, weight.elem, c);
    if (bias.data) v += load_f(bias.data, bias.elem, c);
    store_f(out, out_elem, base + c, v);
  }
  if (threadIdx.x == 0 && mean_out.data) {
    store_f(const_cast<void*>(mean_out.data), mean_out.elem, blockIdx.x, mean);
    store_f(const_cast<void*>(rstd_out.data), rstd_out.elem, blockIdx.x, rstd);
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

__global__ void softmax_kernel(int64_t width, void* out, int out_elem, Operand x, bool log) {
  __shared__ float reduce[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  float peak = -INFINITY;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) peak = fmaxf(peak, load_f(x.data, x.elem, base + c));
  peak = block_max(peak, reduce);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) sum += expf(load_f(x.data, x.elem, base + c) - peak);
  sum = block_sum(sum, reduce);
  const float log_sum = logf(sum);
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    const float shifted = load_f(x.data, x.elem, base + c) - peak;
    store_f(out, out_elem, base + c, log ? shifted - log_sum : expf(shifted) / sum);
  }
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

// The same on a 2D grid (output pixels, planes) with 32-bit pixel arithmetic, for fp32/fp16/bf16 storage and planes
// of fewer than 2^31 values.
template <typename T>
__global__ void max_pool_plane_kernel(PoolParams p, int out_pixels, T* out, const T* x) {
  const int pixel = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (pixel >= out_pixels) return;
  const int out_w = static_cast<int>(p.out_w), oh = pixel / out_w, ow = pixel - oh * out_w;
  const int in_h = static_cast<int>(p.in_h), in_w = static_cast<int>(p.in_w);
  const int kernel_h = static_cast<int>(p.kernel_h), kernel_w = static_cast<int>(p.kernel_w);
  const int top = oh * static_cast<int>(p.stride_h) - static_cast<int>(p.pad_h);
  const int left = ow * static_cast<int>(p.stride_w) - static_cast<int>(p.pad_w);
  const int dilation_h = static_cast<int>(p.dilation_h), dilation_w = static_cast<int>(p.dilation_w);
  for (int64_t plane = blockIdx.y; plane < p.planes; plane += gridDim.y) {
    const T* in = x + plane * in_h * in_w;
    float best = -INFINITY;
    for (int kh = 0; kh < kernel_h; ++kh) {
      const int ih = top + kh * dilation_h;
      if (ih < 0 || ih >= in_h) continue;
      for (int kw = 0; kw < kernel_w; ++kw) {
        const int iw = left + kw * dilation_w;
        if (iw < 0 || iw >= in_w) continue;
        const float v = to_float(in[ih * in_w + iw]);
        if (v > best || isnan(v)) best = v;
      }
    }
    out[plane * out_pixels + pixel] = from_float<T>(best);
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

// Global average pooling (one output per plane): a warp per plane, its lanes striding over the plane's values.
template <typename T>
__global__ void global_avg_pool_kernel(int64_t planes, int plane_size, T* out, const T* x) {
  const int64_t warps = gridDim.x * static_cast<int64_t>(blockDim.x) / 32;
  // The plane is the same for a warp's lanes: the warp leaves the loop together.
  for (int64_t plane = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; plane < planes;
       plane += warps) {
    const T* in = x + plane * plane_size;
    float sum = 0.0f;
    for (int i = static_cast<int>(threadIdx.x % 32); i < plane_size; i += 32) sum += to_float(in[i]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) out[plane] = from_float<T>(sum / static_cast<float>(plane_size));
  }
}

// One thread per (sample, row, pixel) on a 3D grid (pixels, rows, samples), so that the index arithmetic is 32-bit
// and the row's channel and tap are computed once per thread without 64-bit divisions.
__global__ void im2col_kernel(ConvParams p, int rows, int depth, void* col, Operand x) {
  const int pixels = static_cast<int>(p.out_h * p.out_w);
  const int pixel = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (pixel >= pixels) return;
  const int row = static_cast<int>(blockIdx.y);
  const int64_t sample = blockIdx.z;
  const int64_t at = (sample * rows + row) * pixels + pixel;
  if (row >= depth) {
    store_f(col, x.elem, at, row == depth ? 1.0f : 0.0f);
    return;
  }
  const int kernel_h = static_cast<int>(p.kernel_h), kernel_w = static_cast<int>(p.kernel_w);
  const int out_w = static_cast<int>(p.out_w);
  const int ci = row / (kernel_h * kernel_w), kh = (row / kernel_w) % kernel_h, kw = row % kernel_w;
  const int ih =
      (pixel / out_w) * static_cast<int>(p.stride_h) - static_cast<int>(p.pad_h) + kh * static_cast<int>(p.dilation_h);
  const int iw =
      (pixel % out_w) * static_cast<int>(p.stride_w) - static_cast<int>(p.pad_w) + kw * static_cast<int>(p.dilation_w);
  if (ih < 0 || ih >= p.in_h || iw < 0 || iw >= p.in_w)
    store_f(col, x.elem, at, 0.0f);
  else
    convert_element(col, x.elem, at, x.data, x.elem, ((sample * p.in_channels + ci) * p.in_h + ih) * p.in_w + iw);
}

// The same for fp32/fp16/bf16 storage, eight consecutive pixels of one row per thread: the row's channel and tap and
// the first pixel's coordinates are worked out once for the eight (the scalar form above spends most of its time on
// them), and the eight values go out in one or two 16-byte stores where the row allows.
template <typename T>
__global__ void im2col_vector_kernel(ConvParams p, int rows, int depth, T* col, const T* x) {
  constexpr int kPixels = 8;
  const int pixels = static_cast<int>(p.out_h * p.out_w);
  const int first = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x) * kPixels;
  if (first >= pixels) return;
  const int row = static_cast<int>(blockIdx.y), count = min(kPixels, pixels - first);
  const int64_t sample = blockIdx.z;
  T* out = col + (sample * rows + row) * pixels + first;
  T values[kPixels];
  if (row >= depth) {
    const T fill = from_float<T>(row == depth ? 1.0f : 0.0f);
#pragma unroll
    for (int j = 0; j < kPixels; ++j) values[j] = fill;
  } else {
    const int kernel_w = static_cast<int>(p.kernel_w), taps = static_cast<int>(p.kernel_h) * kernel_w;
    const int ci = row / taps, tap = row - ci * taps, ky = tap / kernel_w, kx = tap - ky * kernel_w;
    const int in_h = static_cast<int>(p.in_h), in_w = static_cast<int>(p.in_w), out_w = static_cast<int>(p.out_w);
    const int stride_h = static_cast<int>(p.stride_h), stride_w = static_cast<int>(p.stride_w);
    const int dy = ky * static_cast<int>(p.dilation_h) - static_cast<int>(p.pad_h);
    const int dx = kx * static_cast<int>(p.dilation_w) - static_cast<int>(p.pad_w);
    const T* plane = x + (sample * p.in_channels + ci) * p.in_h * p.in_w;
    int oh = first / out_w, ow = first - oh * out_w;
#pragma unroll
    for (int j = 0; j < kPixels; ++j) {
      const int ih = oh * stride_h + dy, iw = ow * stride_w + dx;
      values[j] =
          j < count && ih >= 0 && ih < in_h && iw >= 0 && iw < in_w ? plane[ih * in_w + iw] : from_float<T>(0.0f);
      if (++ow == out_w) {
        ow = 0;
        ++oh;
      }
    }
  }
  if (count == kPixels && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    constexpr int kVectors = kPixels * static_cast<int>(sizeof(T)) / 16;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) reinterpret_cast<uint4*>(out)[v] = reinterpret_cast<const uint4*>(values)[v];
  } else {
    for (int j = 0; j < count; ++j) out[j] = values[j];
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

// The same eight outputs per thread (one 16-byte vector of fp16/bf16 storage, the residual alike), for rows of pixels
// that are whole vectors: 32-bit index arithmetic and one bias load per vector, so that the pass runs at the memory's
// speed instead of the index divisions'.
template <typename T>
__global__ void conv_epilogue_vector_kernel(ConvParams p, uint32_t vectors, uint32_t vectors_per_row, T* out,
                                            const T* residual, Operand bias) {
  const uint32_t channels = static_cast<uint32_t>(p.out_channels);
  for (uint32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < vectors; v += gridDim.x * blockDim.x) {
    const float shift = bias.data ? load_f(bias.data, bias.elem, v / vectors_per_row % channels) : 0.0f;
    uint4 sums = reinterpret_cast<const uint4*>(out)[v];
    uint4 added = residual ? __ldcs(reinterpret_cast<const uint4*>(residual) + v) : make_uint4(0, 0, 0, 0);
    T* values = reinterpret_cast<T*>(&sums);
    const T* extra = reinterpret_cast<const T*>(&added);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float acc = to_float(values[j]);
      if (bias.data) acc += shift;
      if (residual) acc += to_float(extra[j]);
      acc = apply_unary(p.activation, acc);
      if (p.use_clamp) acc = fminf(fmaxf(acc, p.min_val), p.max_val);
      values[j] = from_float<T>(acc);
    }
    reinterpret_cast<uint4*>(out)[v] = sums;
  }
}

// ---- decode GEMV: one warp (or `parts` warps) per output, 16-byte loads of the weight row and of the (cached)
// activation row ----

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;

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

// Σ x·g·w over one vector (x scaled by the fused RMSNorm's weight g, in fp32), adding Σ x² to `squares`.
template <typename T>
__device__ __forceinline__ float dot_scaled(uint4 x_vector, uint4 g_vector, uint4 w_vector, float& squares) {
  constexpr int kPerVector = 16 / sizeof(T);
  const T* x = reinterpret_cast<const T*>(&x_vector);
  const T* g = reinterpret_cast<const T*>(&g_vector);
  const T* w = reinterpret_cast<const T*>(&w_vector);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerVector; ++e) {
    const float value = to_float(x[e]);
    squares += value * value;
    sum += value * to_float(g[e]) * to_float(w[e]);
  }
  return sum;
}

// `parts` warps share a task (each a slice of its vectors), so that short outputs still fill the GPU; a task is one
// row of one segment, or a gate row and its up row (R = 2, loaded together). The first weights are loaded before
// waiting for the kernel that writes the activations (programmatic dependent launch), and U vectors of each row
// are in flight per lane. A fused RMSNorm folds into the sums: the warps of a task read all of x between them, so
// they add up x² along with w·(x·g) and scale by 1 / sqrt(mean(x²) + eps) at the end, in one pass.
template <typename T, int R, int U>
__global__ void __launch_bounds__(kGemvThreads) gemv_batch_kernel(GemvBatch batch, int64_t k, int parts, const T* x) {
  __shared__ float partial[R + 1][kGemvWarps];
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
  const bool norm = batch.norm.enabled;
  float acc[R] = {};
  float squares = 0.0f;
  while (true) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t at = base + 32 * int64_t{parts} * u;
      if (!active || at >= vectors) break;
      const uint4 input = __ldg(xv + at);
      if (norm) {
        const uint4 scale = __ldg(norm_weight + at);
        float ignored = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += dot_scaled<T>(input, scale, weights[r][u], r == 0 ? squares : ignored);
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += dot_vector<T>(input, weights[r][u]);
      }
    }
    base += stride;
    if (!active || base >= vectors) break;
    load_weights();
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  if (norm)
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  if (parts > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) partial[r][warp] = acc[r];
      partial[R][warp] = squares;
    }
    __syncthreads();
    if (part == 0)
      for (int p = 1; p < parts; ++p) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += partial[r][warp + p];
        squares += partial[R][warp + p];
      }
  }
  if (!active || part != 0 || lane != 0) return;
  if (norm) {
    const auto inv_rms =
        static_cast<float>(1.0 / sqrt(static_cast<double>(squares) / static_cast<double>(k) + batch.norm.eps));
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] *= inv_rms;
  }
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
    return launch_dependent(rope_cache_kernel, dim3(blocks_for(most), static_cast<unsigned>(batch.count)), kThreads, 0,
                            stream, batch);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(cudaStream_t stream, int64_t rows, int64_t row_size, double eps, void* out, int out_elem,
                            Operand x, Operand weight) {
  if (rows > 0)
    rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(row_size, eps, out, out_elem, x, weight);
  return cudaGetLastError();
}

cudaError_t launch_layer_norm(cudaStream_t stream, int64_t rows, int64_t row_size, double eps, void* out, int out_elem,
                              Operand x, Operand weight, Operand bias, Operand mean_out, Operand rstd_out) {
  if (rows > 0 && row_size > 0)
    layer_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(row_size, eps, out, out_elem, x, weight,
                                                                            bias, mean_out, rstd_out);
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
  if (n <= 0) return cudaGetLastError();
  const int64_t pixels = p.out_h * p.out_w;
  const bool planes_fit = p.in_h * p.in_w < (int64_t{1} << 31) && pixels < (int64_t{1} << 31);
  const auto planes = [&](auto type) {
    using T = decltype(type);
    const dim3 grid(static_cast<unsigned>((pixels + kThreads - 1) / kThreads),
                    static_cast<unsigned>(std::min<int64_t>(p.planes, 65535)));
    max_pool_plane_kernel<T><<<grid, kThreads, 0, stream>>>(p, static_cast<int>(pixels), static_cast<T*>(out),
                                                            static_cast<const T*>(x.data));
  };
  if (!(planes_fit && x.elem == out_elem && with_float_storage(out_elem, planes)))
    max_pool_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, out, out_elem, x);
  return cudaGetLastError();
}

cudaError_t launch_adaptive_avg_pool2d(cudaStream_t stream, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w, void* out, int out_elem, Operand x) {
  const int64_t n = planes * out_h * out_w, plane_size = in_h * in_w;
  if (n <= 0) return cudaGetLastError();
  const bool global =
      out_h == 1 && out_w == 1 && plane_size > 0 && plane_size < (int64_t{1} << 31) && x.elem == out_elem;
  const auto per_plane = [&](auto type) {
    using T = decltype(type);
    global_avg_pool_kernel<T><<<blocks_for(planes * 32), kThreads, 0, stream>>>(
        planes, static_cast<int>(plane_size), static_cast<T*>(out), static_cast<const T*>(x.data));
  };
  if (!(global && with_float_storage(out_elem, per_plane)))
    adaptive_avg_pool_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, in_h, in_w, out_h, out_w, out, out_elem, x);
  return cudaGetLastError();
}

cudaError_t launch_im2col(cudaStream_t stream, const ConvParams& p, int64_t samples, int64_t rows, void* col,
                          Operand x) {
  const int64_t pixels = p.out_h * p.out_w;
  if (samples <= 0 || rows <= 0 || pixels <= 0) return cudaGetLastError();
  constexpr int64_t kMaxGridYZ = 65535;
  if (rows > kMaxGridYZ || samples > kMaxGridYZ || pixels > std::numeric_limits<int>::max() / 2 ||
      samples * rows * pixels > std::numeric_limits<int64_t>::max() / 2)
    return cudaErrorInvalidValue;
  const int depth = static_cast<int>(p.in_channels / p.groups * p.kernel_h * p.kernel_w);
  const auto vectors = [&](auto type) {
    using T = decltype(type);
    const int64_t threads_needed = (pixels + 7) / 8;
    const int threads = threads_needed >= kThreads ? kThreads : static_cast<int>((threads_needed + 31) / 32 * 32);
    const dim3 grid(static_cast<unsigned>((threads_needed + threads - 1) / threads), static_cast<unsigned>(rows),
                    static_cast<unsigned>(samples));
    im2col_vector_kernel<T><<<grid, threads, 0, stream>>>(p, static_cast<int>(rows), depth, static_cast<T*>(col),
                                                          static_cast<const T*>(x.data));
  };
  if (p.in_h * p.in_w < (int64_t{1} << 31) && with_float_storage(x.elem, vectors)) return cudaGetLastError();
  const int threads = pixels >= kThreads ? kThreads : static_cast<int>((pixels + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>((pixels + threads - 1) / threads), static_cast<unsigned>(rows),
                  static_cast<unsigned>(samples));
  im2col_kernel<<<grid, threads, 0, stream>>>(p, static_cast<int>(rows), depth, col, x);
  return cudaGetLastError();
}

cudaError_t launch_conv_epilogue(cudaStream_t stream, const ConvParams& p, void* out, int out_elem, Operand bias,
                                 Operand residual) {
  const int64_t n = p.batch * p.out_channels * p.out_h * p.out_w, pixels = p.out_h * p.out_w;
  if (n <= 0) return cudaGetLastError();
  const auto aligned = [](const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; };
  const bool vectors = (out_elem == kF16 || out_elem == kBF16) && pixels % 8 == 0 && n / 8 < (int64_t{1} << 32) &&
                       aligned(out) && (!residual.data || (residual.elem == out_elem && aligned(residual.data)));
  if (!vectors) {
    conv_epilogue_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, out, out_elem, bias, residual);
    return cudaGetLastError();
  }
  const auto count = static_cast<uint32_t>(n / 8), per_row = static_cast<uint32_t>(pixels / 8);
  if (out_elem == kF16)
    conv_epilogue_vector_kernel<__half><<<blocks_for(count), kThreads, 0, stream>>>(
        p, count, per_row, static_cast<__half*>(out), static_cast<const __half*>(residual.data), bias);
  else
    conv_epilogue_vector_kernel<__nv_bfloat16><<<blocks_for(count), kThreads, 0, stream>>>(
        p, count, per_row, static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(residual.data), bias);
  return cudaGetLastError();
}

GemvShape gemv_default_shape(int64_t tasks, int64_t k, int elem) {
  // Short outputs split each task over 2 or 4 warps while that keeps 2 vectors per lane and the grid under about
  // 6144 warps; a warp's rows are loaded in one go when they come to 4 vectors per lane or less, else 2 at a time.
  // On the H100 (Qwen2.5-1.5B's decode GEMVs, bf16, CudaBench.GemvShapes) this took q/k/v from 5.2 to 3.7 us and
  // o_proj from 3.2 to 2.9 us, and kept the best shapes of gate/up, down_proj and the LM head.
  const int64_t vectors = k / (16 / (elem == kF32 ? 4 : 2));
  GemvShape shape{1, 2};
  while (shape.parts < kGemvWarps && tasks * shape.parts < 6144 && vectors / (2 * shape.parts) >= 64) shape.parts *= 2;
  const int64_t per_lane = (vectors + 32 * shape.parts - 1) / (32 * shape.parts);
  shape.unroll = per_lane <= 4 ? 4 : 2;
  return shape;
}

bool gemv_supports(int64_t k, int elem) { return k > 0 && elem <= kBF16 && (k * (elem == kF32 ? 4 : 2)) % 16 == 0; }

namespace {

template <typename T, int R>
cudaError_t launch_gemv_typed(cudaStream_t stream, int64_t k, GemvShape shape, const void* x, const GemvBatch& batch) {
  const int64_t tasks = batch.first[batch.count];
  const int per_block = kGemvWarps / shape.parts;
  const auto blocks = static_cast<unsigned>((tasks + per_block - 1) / per_block);
  const T* input = static_cast<const T*>(x);
  switch (shape.unroll) {
    case 2:
      return launch_dependent(gemv_batch_kernel<T, R, 2>, dim3(blocks), kGemvThreads, 0, stream, batch, k, shape.parts,
                              input);
    case 4:
      return launch_dependent(gemv_batch_kernel<T, R, 4>, dim3(blocks), kGemvThreads, 0, stream, batch, k, shape.parts,
                              input);
    case 8:
      return launch_dependent(gemv_batch_kernel<T, R, 8>, dim3(blocks), kGemvThreads, 0, stream, batch, k, shape.parts,
                              input);
    default:
      return cudaErrorInvalidValue;
  }
}

template <int R>
cudaError_t launch_gemv_kernel(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvBatch& batch,
                               GemvShape shape) {
  const int64_t tasks = batch.first[batch.count];
  if (tasks <= 0) return cudaGetLastError();
  if (batch.norm.enabled && (!batch.norm.weight || batch.norm.elem != elem)) return cudaErrorInvalidValue;
  if (shape.parts == 0 && shape.unroll == 0) shape = gemv_default_shape(tasks, k, elem);
  if (shape.parts != 1 && shape.parts != 2 && shape.parts != 4) return cudaErrorInvalidValue;
  switch (elem) {
    case kF32:
      return launch_gemv_typed<float, R>(stream, k, shape, x, batch);
    case kF16:
      return launch_gemv_typed<__half, R>(stream, k, shape, x, batch);
    case kBF16:
      return launch_gemv_typed<__nv_bfloat16, R>(stream, k, shape, x, batch);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_gemv_batch(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvSegment* segments,
                              int count, const GemvNorm& norm, GemvShape shape) {
  if (!gemv_supports(k, elem) || count < 1 || count > kGemvMaxSegments) return cudaErrorInvalidValue;
  GemvBatch batch{};
  batch.count = count;
  batch.norm = norm;
  for (int s = 0; s < count; ++s) {
    batch.segments[s] = segments[s];
    batch.first[s + 1] = batch.first[s] + segments[s].rows;
  }
  return launch_gemv_kernel<1>(stream, k, elem, x, batch, shape);
}

cudaError_t launch_gemv_gated(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvSegment& gate,
                              const GemvSegment& up, const GemvNorm& norm, GemvShape shape) {
  if (!gemv_supports(k, elem) || gate.rows != up.rows) return cudaErrorInvalidValue;
  GemvBatch batch{};
  batch.count = 1;
  batch.norm = norm;
  batch.segments[0] = gate;
  batch.segments[1] = up;
  batch.first[1] = gate.rows;
  return launch_gemv_kernel<2>(stream, k, elem, x, batch, shape);
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

cudaError_t launch_rotary_embedding(cudaStream_t stream, int64_t rows, int64_t half, float scaling, void* cos,
                                    void* sin, int out_elem, Operand inv_freq, const int64_t* positions) {
  const int64_t n = rows * half;
  if (n > 0)
    rotary_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, half, scaling, cos, sin, out_elem, inv_freq, positions);
  return cudaGetLastError();
}

cudaError_t launch_softmax(cudaStream_t stream, int64_t rows, int64_t width, void* out, int out_elem, Operand x,
                           bool log) {
  if (rows > 0 && width > 0)
    softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(width, out, out_elem, x, log);
  return cudaGetLastError();
}

cudaError_t launch_fill_bytes(cudaStream_t stream, void* data, uint8_t value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  return cudaMemsetAsync(data, value, bytes, stream);
}

}  // namespace npusim::cuda
