// Decode attention (flash-decoding) on tensor cores: one query row per head against a key/value cache. A block takes
// one key/value head with all the query heads that share it (up to 8: the columns of an n8 fragment; each cache row
// is read once for the whole group) and a run of keys; the runs follow the attended context, read on the device (a
// short context is one run, a long one up to `splits`), and a second kernel combines the runs' results.
//
// Each warp takes tiles of 16 keys, with keys and features as the fragments' rows and heads as their columns, so that
// no fragment row is padding: Sᵀ = K·Qᵀ, then Oᵀ += Vᵀ·Pᵀ. The cache rows go straight from global memory into the
// fragments, 16 bytes per load: the scores take the feature (k) dimension in an order of our choosing, so that a
// lane's 8 loaded features are its part of two k-steps; Oᵀ's rows may be any features, so each lane group reads a
// contiguous 16-byte-aligned slice of its four value rows and pairs their halves into Vᵀ's fragments. The weights go
// to the second product transposed through shared memory. An online softmax per warp folds the tiles in; the warps
// then combine through shared memory.
#include <algorithm>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_decode.h"
#include "backends/cuda/mma_common.cuh"

namespace npusim::cuda {
namespace {

constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kTileKeys = 16;
constexpr int kBlockStep = kDecodeWarps * kTileKeys;  // keys the block's warps take in one round
constexpr int kMaxGroup = 8;                          // query heads per key/value head: the columns of an n8 fragment
constexpr int kDefaultMaxSplits = 32;                 // runs per head group a long context is split into
constexpr int64_t kMaxRunKeys = 512;                  // past that many runs of this many keys, the runs grow in number
// Keys a run takes at least: one round of the block's warps. On the H100 (Qwen2.5-1.5B's shape,
// CudaBench.DecodeAttention) runs of 128 took context 1024 from 9.0 to 7.0 us per layer against runs of 256, for 0.1 us
// more at 160.
constexpr int kDefaultMinRunKeys = kBlockStep;

struct DecodePlan {
  int splits;  // most runs per head group (grid.y)
  int min_run;
  int64_t shared_bytes;
};

DecodePlan decode_plan(const AttentionParams& p, DecodeTuning tuning) {
  DecodePlan plan{};
  plan.min_run = tuning.min_run_keys > 0 ? tuning.min_run_keys : kDefaultMinRunKeys;
  const int64_t most = tuning.max_splits > 0 ? tuning.max_splits : kDefaultMaxSplits;
  const int64_t wanted = std::max(std::min((p.source + plan.min_run - 1) / plan.min_run, most),
                                  (p.source + kMaxRunKeys - 1) / kMaxRunKeys);
  plan.splits = static_cast<int>(std::max<int64_t>(wanted, 1));
  const int64_t stride = (p.embed + p.embed / 16 + 27) / 32 * 32 + 4;  // the kernel's kAccStride
  plan.shared_bytes = (kDecodeWarps * kMaxGroup * (stride + 2) + kMaxGroup * (kDecodeWarps + 2)) * 4 +
                      int64_t{kDecodeWarps} * kMaxGroup * kTileKeys * 2;
  return plan;
}

__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

// Keys per run and runs for `attended` keys: runs of at least min_run keys, whole rounds of the block's warps, at most
// `splits` of them.
__device__ __forceinline__ int64_t decode_run_keys(int64_t attended, int splits, int min_run) {
  return (max((attended + splits - 1) / splits, int64_t{min_run}) + kBlockStep - 1) / kBlockStep * kBlockStep;
}
__device__ __forceinline__ int64_t decode_runs(int64_t attended, int splits, int min_run) {
  const int64_t per_split = decode_run_keys(attended, splits, min_run);
  return (attended + per_split - 1) / per_split;
}

template <typename T, int D>
__global__ void __launch_bounds__(kDecodeThreads, 1)
    decode_attention_kernel(AttentionParams p, int splits, int min_run, Operand q, const T* k, const T* v, void* out,
                            int out_elem, float* values, float* stats) {
  constexpr int W = D / 8;        // features of a lane group's value slice
  constexpr int kPairs = D / 32;  // pairs of k-steps in the scores, 8 features of each per lane
  constexpr int kSlice = W / 8;   // 16-byte vectors of a value slice
  constexpr int kRows = kMaxGroup;
  extern __shared__ float4 decode_shared[];
  auto* shared = reinterpret_cast<float*>(decode_shared);
  // [warp][head][kAccStride], feature e at e + e / 16: the lanes of a warp storing their fragments fall on different
  // banks (rows 4 banks apart). Then the combine's part sums.
  constexpr int kAccStride = (D + D / 16 + 27) / 32 * 32 + 4;
  float* warp_acc = shared;
  float* warp_top = warp_acc + kDecodeWarps * kRows * kAccStride;  // [warp][head]
  float* warp_total = warp_top + kDecodeWarps * kRows;             // [warp][head]
  float* warp_scale = warp_total + kDecodeWarps * kRows;           // [head][warp]
  float* block_total = warp_scale + kMaxGroup * kDecodeWarps;      // [head]
  float* run_max = block_total + kMaxGroup;                        // [head]
  const int heads = static_cast<int>(p.q_heads / p.k_heads);
  auto* weight_tiles = reinterpret_cast<T*>(run_max + kMaxGroup);  // [warp][head][key]: a tile's weights, transposed

  allow_dependent_launch();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int64_t block_group = blockIdx.x, b = block_group / p.k_heads, kv = block_group % p.k_heads;
  const int64_t first_head = kv * heads, first_row = b * p.q_heads + first_head;

  // With the positions ready before the kernel ahead finishes, the run's cache rows are fetched into L2 meanwhile
  // (a prefetch cannot read a stale copy: L2 is where every write lands).
  const bool early = p.positions_ready;
  int64_t attended = early ? attended_keys(p) : 0;
  if (early && attended > 0) {
    const int64_t per_split = decode_run_keys(attended, splits, min_run), begin = blockIdx.y * per_split;
    const int64_t count = min(begin + per_split, attended) - begin;
    const T* key_rows = k + ((b * p.k_heads + kv) * p.source + begin) * D;
    const T* value_rows = v + ((b * p.v_heads + kv) * p.source + begin) * D;
    // A 128-byte line per prefetch: the rows' second lines (D = 128) by half the lanes.
    const int key_line = D > 64 ? 64 * (t % 2) : 0, value_line = D > 64 ? 64 * (g / 2 % 2) : 0;
    for (int64_t first = warp * kTileKeys; first < count; first += kBlockStep) {
      if (first + g < count) prefetch_l2(key_rows + (first + g) * D + key_line);
      if (first + g + 8 < count) prefetch_l2(key_rows + (first + g + 8) * D + key_line);
      if (first + 2 * t + g % 2 < count) prefetch_l2(value_rows + (first + 2 * t + g % 2) * D + value_line);
      if (first + 8 + 2 * t + g % 2 < count) prefetch_l2(value_rows + (first + 8 + 2 * t + g % 2) * D + value_line);
    }
  }
  wait_for_producer();
  // Qᵀ as the scores' B fragments: head g, features 32m + 8t + 2i, +1 as pair [m][i]; 16-byte loads when the query
  // is in the storage type, all in flight together.
  uint32_t query[kPairs][4];
  const bool query_in_storage = q.elem == element_code<T>() && reinterpret_cast<uintptr_t>(q.data) % 16 == 0;
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    const int64_t at = (first_row + g) * D + 32 * m + 8 * t;
    if (g >= heads) {
      query[m][0] = query[m][1] = query[m][2] = query[m][3] = 0u;
    } else if (query_in_storage) {
      const uint4 vector = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(q.data) + at));
      query[m][0] = vector.x;
      query[m][1] = vector.y;
      query[m][2] = vector.z;
      query[m][3] = vector.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        query[m][i] = pack_pair<T>(load_f(q.data, q.elem, at + 2 * i), load_f(q.data, q.elem, at + 2 * i + 1));
    }
  }
  if (!early) attended = attended_keys(p);
  if (attended == 0) {
    if (blockIdx.y == 0)
      for (int i = tid; i < heads * D; i += kDecodeThreads)
        store_f(out, out_elem, first_row * D + i, finished_value(p, 0.0f, -INFINITY, 0.0f));
    return;
  }
  const int64_t per_split = decode_run_keys(attended, splits, min_run);
  const int64_t runs = (attended + per_split - 1) / per_split;
  const int64_t begin = blockIdx.y * per_split;
  if (begin >= attended) return;
  const int count = static_cast<int>(min(begin + per_split, attended) - begin);
  const T* key_base = k + ((b * p.k_heads + kv) * p.source + begin) * D;
  const T* value_base = v + ((b * p.v_heads + kv) * p.source + begin) * D;
  T* weight_tile = weight_tiles + warp * 8 * kTileKeys;

  // Per lane: heads 2t and 2t + 1 (the accumulators' columns).
  float top[2] = {-INFINITY, -INFINITY}, total[2] = {0.0f, 0.0f}, acc[W / 2][4];
#pragma unroll
  for (int r = 0; r < W / 2; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;

  for (int first = warp * kTileKeys; first < count; first += kBlockStep) {
    // Key rows first + g and first + g + 8 (features 32m + 8t..+8); value rows first + 2t, +1, +8, +9 (features
    // W·g..+W).
    uint4 key_part[2][kPairs], value_part[4][kSlice];
    const int mine[4] = {first + 2 * t, first + 2 * t + 1, first + 8 + 2 * t, first + 9 + 2 * t};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = first + 8 * j + g;
      const auto* row = reinterpret_cast<const uint4*>(key_base + static_cast<int64_t>(r) * D) + t;
#pragma unroll
      for (int m = 0; m < kPairs; ++m) key_part[j][m] = r < count ? __ldcs(row + 4 * m) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const auto* row = reinterpret_cast<const uint4*>(value_base + static_cast<int64_t>(mine[u]) * D) + g * kSlice;
#pragma unroll
      for (int i = 0; i < kSlice; ++i) value_part[u][i] = mine[u] < count ? __ldcs(row + i) : make_uint4(0, 0, 0, 0);
    }
    // Score c: key first + g + 8 (c / 2), head 2t + c % 2.
    float mask[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = first + g + 8 * (c / 2), head = 2 * t + c % 2;
      mask[c] = r < count && head < heads ? mask_term(p, b, first_head + head, 0, begin + r) : 0.0f;
    }

    // Sᵀ = K·Qᵀ: keys as the fragment rows, heads as its columns.
    float score[4] = {};
#pragma unroll
    for (int m = 0; m < kPairs; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const auto* low = reinterpret_cast<const uint32_t*>(&key_part[0][m]);
        const auto* high = reinterpret_cast<const uint32_t*>(&key_part[1][m]);
        const uint32_t a[4] = {low[2 * h], high[2 * h], low[2 * h + 1], high[2 * h + 1]};
        mma_16816<T>(score, a, query[m][2 * h], query[m][2 * h + 1]);
      }

    // The online softmax of heads 2t and 2t + 1 over the tile's keys, shared by the eight lanes of a column.
    float x[4], weight[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = first + g + 8 * (c / 2), head = 2 * t + c % 2;
      x[c] = r < count && head < heads ? masked_score(p, score[c], mask[c], 0, begin + r) : -INFINITY;
    }
    float factor[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float tile_top = fmaxf(x[e], x[2 + e]);
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2)
        tile_top = fmaxf(tile_top, __shfl_xor_sync(0xffffffffu, tile_top, offset));
      const float now = fmaxf(top[e], tile_top);
      factor[e] = now == -INFINITY ? 1.0f : __expf(top[e] - now);
      weight[e] = now == -INFINITY ? 0.0f : __expf(x[e] - now);
      weight[2 + e] = now == -INFINITY ? 0.0f : __expf(x[2 + e] - now);
      total[e] = total[e] * factor[e] + weight[e] + weight[2 + e];
      top[e] = now;
    }
#pragma unroll
    for (int r = 0; r < W / 2; ++r) {
      acc[r][0] *= factor[0];
      acc[r][1] *= factor[1];
      acc[r][2] *= factor[0];
      acc[r][3] *= factor[1];
    }
    // Pᵀ as the weighted sum's B fragments: through shared memory, transposed to [head][key].
    weight_tile[(2 * t) * kTileKeys + g] = from_float<T>(weight[0]);
    weight_tile[(2 * t + 1) * kTileKeys + g] = from_float<T>(weight[1]);
    weight_tile[(2 * t) * kTileKeys + g + 8] = from_float<T>(weight[2]);
    weight_tile[(2 * t + 1) * kTileKeys + g + 8] = from_float<T>(weight[3]);
    __syncwarp();
    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(weight_tile + g * kTileKeys + 2 * t);
    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(weight_tile + g * kTileKeys + 2 * t + 8);
    __syncwarp();

    // Oᵀ += Vᵀ·Pᵀ: features as the fragment rows (row g of m-tile r is feature W·g + 2r, row g + 8 is W·g + 2r + 1:
    // the low and high halves of word r of the lane's value slices), heads as its columns.
#pragma unroll
    for (int r = 0; r < W / 2; ++r) {
      const uint32_t w0 = reinterpret_cast<const uint32_t*>(value_part[0])[r];
      const uint32_t w1 = reinterpret_cast<const uint32_t*>(value_part[1])[r];
      const uint32_t w2 = reinterpret_cast<const uint32_t*>(value_part[2])[r];
      const uint32_t w3 = reinterpret_cast<const uint32_t*>(value_part[3])[r];
      const uint32_t a[4] = {__byte_perm(w0, w1, 0x5410u), __byte_perm(w0, w1, 0x7632u), __byte_perm(w2, w3, 0x5410u),
                             __byte_perm(w2, w3, 0x7632u)};
      mma_16816<T>(acc[r], a, b0, b1);
    }
  }

  // The warps' runs, combined through shared memory: head 2t + e gets features W·g + 2r (acc[r][e]) and
  // W·g + 2r + 1 (acc[r][2 + e]).
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) total[e] += __shfl_xor_sync(0xffffffffu, total[e], offset);
    const int head = 2 * t + e;
#pragma unroll
    for (int r = 0; r < W / 2; ++r) {
      const int even = W * g + 2 * r;
      warp_acc[(warp * kRows + head) * kAccStride + even + even / 16] = acc[r][e];
      warp_acc[(warp * kRows + head) * kAccStride + even + 1 + (even + 1) / 16] = acc[r][2 + e];
    }
    if (g == 0) {
      warp_top[warp * kRows + head] = top[e];
      warp_total[warp * kRows + head] = total[e];
    }
  }
  __syncthreads();
  // Each warp's factor per head (its maximum against the block's), then the block's sums over the warps.
  if (tid < heads) {
    float peak = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) peak = fmaxf(peak, warp_top[w * kRows + tid]);
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float run_top = warp_top[w * kRows + tid];
      const float scale = run_top == -INFINITY ? 0.0f : __expf(run_top - peak);
      warp_scale[tid * kDecodeWarps + w] = scale;
      sum += warp_total[w * kRows + tid] * scale;
    }
    run_max[tid] = peak;
    block_total[tid] = sum;
  }
  __syncthreads();
  const bool only_run = runs == 1;
  for (int i = tid; i < heads * D; i += kDecodeThreads) {
    const int head = i / D, e = i % D;
    float weighted = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w)
      weighted += warp_acc[(w * kRows + head) * kAccStride + e + e / 16] * warp_scale[head * kDecodeWarps + w];
    if (only_run) {
      store_f(out, out_elem, (first_row + head) * D + e, finished_value(p, weighted, run_max[head], block_total[head]));
    } else {
      values[((first_row + head) * splits + blockIdx.y) * D + e] = weighted;
      if (e == 0) {
        stats[((first_row + head) * splits + blockIdx.y) * 2] = run_max[head];
        stats[((first_row + head) * splits + blockIdx.y) * 2 + 1] = block_total[head];
      }
    }
  }
}

// The runs' results into the output (when there were several): a block per query row, a thread per feature. Every
// thread's first partial sums are loaded before the first warp works out the runs' weights from their maxima and sums.
template <int D>
__global__ void __launch_bounds__(D) decode_combine_kernel(AttentionParams p, int splits, int min_run, void* out,
                                                           int out_elem, const float* values, const float* stats) {
  extern __shared__ float combine_shared[];
  float* weight = combine_shared;  // [splits], then the row's maximum
  allow_dependent_launch();
  const bool early = p.positions_ready;
  int64_t attended = early ? attended_keys(p) : 0;
  wait_for_producer();
  if (!early) attended = attended_keys(p);
  if (attended == 0) return;  // the first run wrote the output
  const int64_t runs = decode_runs(attended, splits, min_run);
  if (runs == 1) return;
  const int64_t row = blockIdx.x;
  const int e = threadIdx.x, lane = e % 32;
  const float* partials = values + row * splits * D + e;
  constexpr int kInFlight = 16;
  float loaded[kInFlight];
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) loaded[u] = u < runs ? __ldcg(partials + u * D) : 0.0f;
  if (e < 32) {
    const float* stat = stats + row * splits * 2;
    float lane_top = -INFINITY, lane_sum = 0.0f;  // this lane's runs, merged as they come
    for (int r = lane; r < runs; r += 32) {
      const float run_top = __ldcg(stat + 2 * r), run_sum = __ldcg(stat + 2 * r + 1);
      weight[r] = run_top;
      const float now = fmaxf(lane_top, run_top);
      if (now != -INFINITY) {
        lane_sum = lane_sum * expf(lane_top - now) + run_sum * expf(run_top - now);
        lane_top = now;
      }
    }
    const float peak = warp_max(lane_top);
    const float sum = warp_sum(peak == -INFINITY || lane_top == -INFINITY ? 0.0f : lane_sum * expf(lane_top - peak));
    for (int r = lane; r < runs; r += 32)
      weight[r] = peak == -INFINITY || weight[r] == -INFINITY ? 0.0f : expf(weight[r] - peak) / sum;
    if (lane == 0) weight[splits] = peak;
  }
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) total += loaded[u] * (u < runs ? weight[u] : 0.0f);
  for (int64_t r = kInFlight; r < runs; ++r) total += __ldcg(partials + r * D) * weight[r];
  store_f(out, out_elem, row * D + e, finished_value(p, total, weight[splits], 1.0f));
}

template <typename T, int D>
cudaError_t launch_decode_typed(cudaStream_t stream, const AttentionParams& p, const DecodePlan& plan, void* out,
                                int out_elem, Operand q, const void* k, const void* v, float* scratch) {
  if (const cudaError_t error = allow_shared_bytes<decode_attention_kernel<T, D>>(plan.shared_bytes);
      error != cudaSuccess)
    return error;
  const int64_t rows = p.batch * p.q_heads;
  float* values = scratch;
  float* stats = scratch ? values + rows * plan.splits * D : nullptr;
  const dim3 grid(static_cast<unsigned>(p.batch * p.k_heads), static_cast<unsigned>(plan.splits));
  const cudaError_t split = launch_dependent(decode_attention_kernel<T, D>, grid, kDecodeThreads, plan.shared_bytes,
                                             stream, p, plan.splits, plan.min_run, q, static_cast<const T*>(k),
                                             static_cast<const T*>(v), out, out_elem, values, stats);
  if (split != cudaSuccess || plan.splits == 1) return split;
  return launch_dependent(decode_combine_kernel<D>, dim3(static_cast<unsigned>(rows)), D,
                          static_cast<size_t>(plan.splits + 1) * sizeof(float), stream, p, plan.splits, plan.min_run,
                          out, out_elem, static_cast<const float*>(values), static_cast<const float*>(stats));
}

template <typename T>
cudaError_t launch_decode_storage(cudaStream_t stream, const AttentionParams& p, const DecodePlan& plan, void* out,
                                  int out_elem, Operand q, const void* k, const void* v, float* scratch) {
  if (p.embed == 64) return launch_decode_typed<T, 64>(stream, p, plan, out, out_elem, q, k, v, scratch);
  return launch_decode_typed<T, 128>(stream, p, plan, out, out_elem, q, k, v, scratch);
}

// The attended rows of every key/value head's cache into L2: a 128-byte line per prefetch, spread over the grid.
__global__ void __launch_bounds__(256) prefetch_cache_kernel(AttentionParams p, const char* k, const char* v,
                                                             int64_t key_row_bytes, int64_t value_row_bytes) {
  const int64_t attended = attended_keys(p);
  const int64_t key_lines = (attended * key_row_bytes + 127) / 128,
                value_lines = (attended * value_row_bytes + 127) / 128;
  const int64_t per_head = key_lines + value_lines, heads = p.batch * p.k_heads;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < heads * per_head; i += stride) {
    const int64_t head = i / per_head, line = i % per_head;
    const char* address = line < key_lines ? k + head * p.source * key_row_bytes + line * 128
                                           : v + head * p.source * value_row_bytes + (line - key_lines) * 128;
    prefetch_l2(address);
  }
}

}  // namespace

cudaError_t launch_cache_prefetch(cudaStream_t stream, const AttentionParams& p, int elem, const void* k,
                                  const void* v) {
  if (p.batch * p.k_heads <= 0 || p.k_heads != p.v_heads) return cudaErrorInvalidValue;
  constexpr int kPrefetchBlocks = 32;
  prefetch_cache_kernel<<<kPrefetchBlocks, 256, 0, stream>>>(p, static_cast<const char*>(k),
                                                             static_cast<const char*>(v), p.embed * element_bytes(elem),
                                                             p.value_embed * element_bytes(elem));
  return cudaGetLastError();
}

bool decode_attention_applies(const AttentionParams& p, int elem, const void* k, const void* v) {
  const auto aligned = [](const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; };
  return p.length == 1 && (elem == kF16 || elem == kBF16) && !p.heads_inner_output && p.k_heads > 0 &&
         p.k_heads == p.v_heads && p.q_heads % p.k_heads == 0 && p.q_heads / p.k_heads <= kMaxGroup &&
         p.embed == p.value_embed && (p.embed == 64 || p.embed == 128) && aligned(k) && aligned(v);
}

int64_t decode_attention_scratch_floats(const AttentionParams& p, DecodeTuning tuning) {
  if (p.length != 1 || p.k_heads <= 0 || p.q_heads % p.k_heads != 0) return 0;
  const DecodePlan plan = decode_plan(p, tuning);
  if (plan.splits == 1) return 0;
  const int64_t rows = p.batch * p.q_heads;
  return rows * plan.splits * (p.embed + 2);
}

cudaError_t launch_decode_attention(cudaStream_t stream, const AttentionParams& p, int elem, void* out, int out_elem,
                                    Operand q, const void* k, const void* v, float* scratch, DecodeTuning tuning) {
  if (!decode_attention_applies(p, elem, k, v)) return cudaErrorInvalidValue;
  const DecodePlan plan = decode_plan(p, tuning);
  if (plan.splits > 1 && !scratch) return cudaErrorInvalidValue;
  if (elem == kF16) return launch_decode_storage<__half>(stream, p, plan, out, out_elem, q, k, v, scratch);
  return launch_decode_storage<__nv_bfloat16>(stream, p, plan, out, out_elem, q, k, v, scratch);
}

}  // namespace npusim::cuda
