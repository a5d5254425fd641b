// Attention for several query rows per head (prefill) on tensor cores: fp16 or bf16 keys and values, head widths
// that are multiples of 16 up to 128. A block takes one m16 fragment of query rows (rows of the query heads that share
// one key/value head, in [head, position] order) and splits the keys between its four warps: each warp copies its
// tiles of 32 keys and values to shared memory asynchronously (its mask terms loading meanwhile), runs the scores and
// the weighted sum as m16n8k16 matrix products with fp32 accumulation and folds them in with an online softmax; the
// warps' runs are combined at the end. The weights are rounded to the key/value storage type for the second product,
// as flash attention does. (One buffer per warp: a second one, copying the next tile during the current, measured
// the same on the H100 at 128 tokens and halves the blocks an SM holds.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_mma.h"
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/mma_common.cuh"

namespace npusim::cuda {

namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kRowsPerBlock = 16;  // one m16 fragment of query rows, shared by the block's warps
constexpr int kKeysPerTile = 32;
constexpr int kMaxEmbed = 128;
// Shared-memory rows carry 8 extra elements, so that the 8 rows one matrix load reads start on different banks.
constexpr int kRowPad = 8;

// Four 8x8 matrices of 16-bit elements from shared memory, transposed: lane l names row l % 8 of matrix l / 8.
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The mask's terms for this thread's scores of keys start.. of a tile (rows quad_row and quad_row + 8, keys
// quad_column, +1 of each block of 8), loaded together through the mask's own type; 0 where there is no mask, the
// key is past `end` or the row past the last.
template <typename M, typename Load>
__device__ __forceinline__ void load_mask_terms(const AttentionParams& p, const int64_t (&mask_row)[2],
                                                const bool (&valid_row)[2], int64_t start, int64_t end,
                                                float (&bias)[kKeysPerTile / 8][4], Load load) {
  const int quad_column = (threadIdx.x % 4) * 2;
  const auto* mask = static_cast<const M*>(p.mask);
#pragma unroll
  for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t j = start + n * 8 + quad_column + e % 2;
      bias[n][e] = j < end && valid_row[e / 2] ? load(mask[mask_row[e / 2] + j * p.mask_column_stride]) : 0.0f;
    }
}

__device__ __forceinline__ void mask_terms(const AttentionParams& p, const int64_t (&mask_row)[2],
                                           const bool (&valid_row)[2], int64_t start, int64_t end,
                                           float (&bias)[kKeysPerTile / 8][4]) {
  const auto zero = [](auto) { return 0.0f; };
  if (!p.mask) return load_mask_terms<uint8_t>(p, mask_row, valid_row, start, start, bias, zero);
  switch (p.mask_elem) {
    case kF32:
      return load_mask_terms<float>(p, mask_row, valid_row, start, end, bias, [](float x) { return x; });
    case kF16:
      return load_mask_terms<__half>(p, mask_row, valid_row, start, end, bias,
                                     [](__half x) { return __half2float(x); });
    case kBF16:
      return load_mask_terms<__nv_bfloat16>(p, mask_row, valid_row, start, end, bias,
                                            [](__nv_bfloat16 x) { return __bfloat162float(x); });
    case kBool:
      return load_mask_terms<uint8_t>(p, mask_row, valid_row, start, end, bias,
                                      [](uint8_t x) { return x ? 0.0f : -INFINITY; });
    default:
      return load_mask_terms<long long>(p, mask_row, valid_row, start, end, bias,
                                        [](long long x) { return static_cast<float>(x); });
  }
}

// Steps: the head width in 16-wide steps (1..8).
template <typename T, int Steps>
__global__ void __launch_bounds__(kMmaThreads)
    mma_attention_kernel(AttentionParams p, Operand q, const T* k, const T* v, void* out, int out_elem) {
  constexpr int kEmbed = Steps * 16;
  constexpr int kStride = kEmbed + kRowPad;  // elements per shared-memory row
  constexpr int kVectors = kEmbed / 8;       // 16-byte vectors per row
  constexpr int kTileElements = kKeysPerTile * kStride;
  extern __shared__ float4 mma_shared[];
  allow_dependent_launch();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int quad_row = lane / 4, quad_column = (lane % 4) * 2;
  // This warp's key and value tiles: [keys, values][kKeysPerTile][kStride].
  T* keys = reinterpret_cast<T*>(mma_shared) + warp * 2 * kTileElements;
  const T* values = keys + kTileElements;
  const int64_t group = p.q_heads / p.k_heads, group_rows = group * p.length;
  const int64_t chunks = (group_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t chunk = blockIdx.x % chunks, kv = (blockIdx.x / chunks) % p.k_heads,
                b = blockIdx.x / (chunks * p.k_heads);
  // This thread's two query rows (quad_row and quad_row + 8) in the group's [head, position] order.
  int64_t head[2], position[2], out_row[2], mask_row[2];
  bool valid_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = chunk * kRowsPerBlock + quad_row + 8 * h;
    valid_row[h] = r < group_rows;
    const int64_t clamped = valid_row[h] ? r : group_rows - 1;
    head[h] = kv * group + clamped / p.length;
    position[h] = clamped % p.length;
    out_row[h] = (b * p.q_heads + head[h]) * p.length + position[h];
    mask_row[h] = b * p.mask_batch_stride + head[h] * p.mask_head_stride + position[h] * p.mask_row_stride;
  }

  wait_for_producer();
  const int64_t end = attended_keys(p);
  const T* key_rows = k + (b * p.k_heads + kv) * p.source * kEmbed;
  const T* value_rows = v + (b * p.v_heads + kv) * p.source * kEmbed;
  // The warp's tiles are every kMmaWarps-th run of kKeysPerTile keys from its own index.
  const int64_t tile_step = int64_t{kMmaWarps} * kKeysPerTile;
  auto copy_tile = [&](int64_t start) {
    for (int i = lane; i < kKeysPerTile * kVectors; i += 32) {
      const int row = i / kVectors, column = i % kVectors;
      const bool valid = start + row < end;  // rows past the attended keys are zero-filled
      const int64_t source_row = valid ? start + row : 0;
      copy_async_16(keys + row * kStride + column * 8, key_rows + source_row * kEmbed + column * 8, valid);
      copy_async_16(keys + kTileElements + row * kStride + column * 8, value_rows + source_row * kEmbed + column * 8,
                    valid);
    }
    commit_async_copies();
  };
  const int64_t first = int64_t{warp} * kKeysPerTile;
  if (first < end) copy_tile(first);

  // The query rows as A fragments, one per 16-wide step of the head (typed loads issued together where the query is
  // stored like the keys).
  uint32_t query[Steps][4];
  if (q.elem == element_code<T>() && reinterpret_cast<uintptr_t>(q.data) % 4 == 0) {
    const T* rows = static_cast<const T*>(q.data);
#pragma unroll
    for (int s = 0; s < Steps; ++s)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          query[s][2 * half + h] =
              *reinterpret_cast<const uint32_t*>(rows + out_row[h] * kEmbed + s * 16 + quad_column + 8 * half);
  } else {
#pragma unroll
    for (int s = 0; s < Steps; ++s)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t at = out_row[h] * kEmbed + s * 16 + quad_column + 8 * half;
          query[s][2 * half + h] = pack_pair<T>(load_f(q.data, q.elem, at), load_f(q.data, q.elem, at + 1));
        }
  }

  float acc[2 * Steps][4] = {};  // [8-wide output column block][fragment]
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};
  for (int64_t start = first; start < end; start += tile_step) {
    float bias[kKeysPerTile / 8][4];
    mask_terms(p, mask_row, valid_row, start, end, bias);
    wait_async_copies<0>();
    __syncwarp();

    // Scores of 8 keys per fragment: lanes hold rows quad_row (+8), keys quad_column, +1 of each block of 8.
    float score[kKeysPerTile / 8][4] = {};
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n) {
      const T* key = keys + (n * 8 + quad_row) * kStride + quad_column;
#pragma unroll
      for (int s = 0; s < Steps; ++s)
        mma_16816<T>(score[n], query[s], *reinterpret_cast<const uint32_t*>(key + s * 16),
                     *reinterpret_cast<const uint32_t*>(key + s * 16 + 8));
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const int64_t j = start + n * 8 + quad_column + e % 2;
        float s = -INFINITY;
        if (j < end && valid_row[h]) {
          s = __fmul_rn(score[n][e], p.scale);
          if (p.causal && j > position[h]) s = -INFINITY;
          if (p.mask) s = __fadd_rn(s, bias[n][e]);
        }
        score[n][e] = s;
        tile_max[h] = fmaxf(tile_max[h], s);
      }
    // The online softmax: each row's maximum over its quad, the factor for the earlier sums, the tile's weights.
    float factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float top = fmaxf(run_max[h], tile_max[h]);
      factor[h] = top == -INFINITY ? 1.0f : __expf(run_max[h] - top);
      run_max[h] = top;
      run_sum[h] *= factor[h];
    }
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const float weight = run_max[h] == -INFINITY ? 0.0f : __expf(score[n][e] - run_max[h]);
        score[n][e] = weight;
        run_sum[h] += weight;
      }
#pragma unroll
    for (int c = 0; c < 2 * Steps; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[c][e] *= factor[e / 2];

        // The weighted sum: weights as A fragments (16 keys each), values as B fragments through transposed loads.
#pragma unroll
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
      const uint32_t weights[4] = {pack_pair<T>(score[2 * ks][0], score[2 * ks][1]),
                                   pack_pair<T>(score[2 * ks][2], score[2 * ks][3]),
                                   pack_pair<T>(score[2 * ks + 1][0], score[2 * ks + 1][1]),
                                   pack_pair<T>(score[2 * ks + 1][2], score[2 * ks + 1][3])};
      const int matrix = lane / 8;
      const T* row = values + (ks * 16 + lane % 8 + (matrix % 2) * 8) * kStride + (matrix / 2) * 8;
#pragma unroll
      for (int s = 0; s < Steps; ++s) {
        uint32_t fragments[4];
        load_matrices_transposed(fragments, row + s * 16);
        mma_16816<T>(acc[2 * s], weights, fragments[0], fragments[1]);
        mma_16816<T>(acc[2 * s + 1], weights, fragments[2], fragments[3]);
      }
    }
    __syncwarp();  // the tile is free for the next copy
    if (start + tile_step < end) copy_tile(start + tile_step);
  }

  // The warps' runs combined: each leaves its rows' maxima, sums and weighted sums in shared memory (over the tiles,
  // once every warp is done with them), then the block's threads weigh the runs for each output.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
  }
  __syncthreads();
  auto* partial = reinterpret_cast<float*>(mma_shared);         // [warp][row][kEmbed]
  float* stats = partial + kMmaWarps * kRowsPerBlock * kEmbed;  // [warp][row][max, sum], then [warp][row] weights
#pragma unroll
  for (int c = 0; c < 2 * Steps; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(partial + (warp * kRowsPerBlock + quad_row + 8 * h) * kEmbed + c * 8 + quad_column) =
          make_float2(acc[c][2 * h], acc[c][2 * h + 1]);
  if (lane % 4 == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(stats + (warp * kRowsPerBlock + quad_row + 8 * h) * 2) =
          make_float2(run_max[h], run_sum[h]);
  __syncthreads();
  // Each row's weight for each warp's run (0 for a row with nothing attended), in place of its statistics.
  float* weights = stats + 2 * kMmaWarps * kRowsPerBlock;  // [warp][row]
  float* tops = weights + kMmaWarps * kRowsPerBlock;       // [row]
  if (threadIdx.x < kRowsPerBlock) {
    const int row = threadIdx.x;
    float2 run[kMmaWarps];
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      run[w] = *reinterpret_cast<const float2*>(stats + (w * kRowsPerBlock + row) * 2);
      top = fmaxf(top, run[w].x);
    }
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      run[w].x = run[w].x == -INFINITY ? 0.0f : __expf(run[w].x - top);
      sum += run[w].y * run[w].x;
    }
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) weights[w * kRowsPerBlock + row] = top == -INFINITY ? 0.0f : run[w].x / sum;
    tops[row] = top;
  }
  __syncthreads();
  // Four features per thread: the runs' sums weighed, stored as the output's type.
  const bool typed_store = out_elem == element_code<T>() && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  for (int i = threadIdx.x; i < kRowsPerBlock * kEmbed / 4; i += kMmaThreads) {
    const int row = i / (kEmbed / 4), feature = i % (kEmbed / 4) * 4;
    const int64_t r = chunk * kRowsPerBlock + row;
    if (r >= group_rows) break;
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      const float weight = weights[w * kRowsPerBlock + row];
      const float4 part = *reinterpret_cast<const float4*>(partial + (w * kRowsPerBlock + row) * kEmbed + feature);
      total.x += part.x * weight;
      total.y += part.y * weight;
      total.z += part.z * weight;
      total.w += part.w * weight;
    }
    const float top = tops[row];
    const float value[4] = {finished_value(p, total.x, top, 1.0f), finished_value(p, total.y, top, 1.0f),
                            finished_value(p, total.z, top, 1.0f), finished_value(p, total.w, top, 1.0f)};
    const int64_t row_head = kv * group + r / p.length, row_position = r % p.length;
    const int64_t at = (p.heads_inner_output ? (b * p.length + row_position) * p.q_heads + row_head
                                             : (b * p.q_heads + row_head) * p.length + row_position) *
                           kEmbed +
                       feature;
    if (typed_store) {
      *reinterpret_cast<uint2*>(static_cast<T*>(out) + at) =
          make_uint2(pack_pair<T>(value[0], value[1]), pack_pair<T>(value[2], value[3]));
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) store_f(out, out_elem, at + e, value[e]);
    }
  }
}

template <typename T, int Steps>
cudaError_t launch_typed(cudaStream_t stream, const AttentionParams& p, void* out, int out_elem, Operand q,
                         const void* k, const void* v) {
  constexpr int64_t kSharedBytes = int64_t{2} * kMmaWarps * kKeysPerTile * (Steps * 16 + kRowPad) * sizeof(T);
  static_assert(kSharedBytes >= (kMmaWarps * kRowsPerBlock * (Steps * 16 + 3) + kRowsPerBlock) * 4,
                "room for the warps' runs");
  if (const cudaError_t error = allow_shared_bytes<mma_attention_kernel<T, Steps>>(kSharedBytes); error != cudaSuccess)
    return error;
  const int64_t chunks = (p.q_heads / p.k_heads * p.length + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid(static_cast<unsigned>(p.batch * p.k_heads * chunks));
  return launch_dependent(mma_attention_kernel<T, Steps>, grid, kMmaThreads, kSharedBytes, stream, p, q,
                          static_cast<const T*>(k), static_cast<const T*>(v), out, out_elem);
}

// The kernel for the head width: Steps, or the next width up to 8 steps (128 features).
template <typename T, int Steps = 1>
cudaError_t launch_for_width(cudaStream_t stream, const AttentionParams& p, void* out, int out_elem, Operand q,
                             const void* k, const void* v) {
  if constexpr (Steps < kMaxEmbed / 16)
    if (p.embed / 16 != Steps) return launch_for_width<T, Steps + 1>(stream, p, out, out_elem, q, k, v);
  return launch_typed<T, Steps>(stream, p, out, out_elem, q, k, v);
}

}  // namespace

bool mma_attention_applies(const AttentionParams& p, int elem, const void* k, const void* v) {
  const auto aligned = [](const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; };
  return p.length > 1 && (elem == kF16 || elem == kBF16) && p.k_heads == p.v_heads && p.k_heads > 0 &&
         p.q_heads % p.k_heads == 0 && p.embed == p.value_embed && p.embed % 16 == 0 && p.embed >= 16 &&
         p.embed <= kMaxEmbed && aligned(k) && aligned(v);
}

cudaError_t launch_mma_attention(cudaStream_t stream, const AttentionParams& p, int elem, void* out, int out_elem,
                                 Operand q, const void* k, const void* v) {
  if (elem == kF16) return launch_for_width<__half>(stream, p, out, out_elem, q, k, v);
  return launch_for_width<__nv_bfloat16>(stream, p, out, out_elem, q, k, v);
}

}  // namespace npusim::cuda
