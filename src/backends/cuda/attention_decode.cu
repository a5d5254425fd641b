// Decode attention (flash-decoding) on tensor cores: one query row per head against a key/value cache. A block takes
// one key/value head with all the query heads that share it (up to 16: the rows of an m16n8k16 fragment; each cache
// row is read once for the whole group) and a run of keys; the runs follow the attended context, read on the device
// (a short context is one run, a long one up to `splits`), and the last run of a head group to finish combines them.
//
// Each warp takes tiles of 16 keys. The cache rows go straight from global memory into the fragments, 16 bytes per
// load: the scores S = Q·Kᵀ take the feature (k) dimension in an order of our choosing, so that a lane's 8 loaded
// features are its part of two k-steps; the weighted sum O = P·V takes P from the scores' accumulators as they are,
// and each lane group reads 16-byte slices of its four value rows, its columns of O being a contiguous run of
// features (the output columns may be permuted freely). An online softmax per warp folds the tiles in; the warps
// then combine through shared memory.
#include <algorithm>
#include <atomic>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_decode.h"
#include "backends/cuda/mma_common.cuh"

namespace npusim::cuda {
namespace {

constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kTileKeys = 16;
constexpr int kBlockStep = kDecodeWarps * kTileKeys;  // keys the block's warps take in one round
constexpr int kMaxGroup = 16;
constexpr int kDefaultMaxSplits = 32;  // runs per head group a long context is split into
constexpr int64_t kMaxRunKeys = 512;   // past that many runs of this many keys, the runs grow in number
// Keys a run takes at least: the combine of split runs costs more than a warp's second tile.
constexpr int kDefaultMinRunKeys = 2 * kBlockStep;

struct DecodePlan {
  bool upper;  // more than 8 query heads per key/value head: the fragments' rows 8..15 are used
  int splits;  // most runs per head group (grid.y)
  int min_run;
  int64_t shared_bytes;
};

DecodePlan decode_plan(const AttentionParams& p, DecodeTuning tuning) {
  DecodePlan plan{};
  plan.upper = p.q_heads / p.k_heads > 8;
  plan.min_run = tuning.min_run_keys > 0 ? tuning.min_run_keys : kDefaultMinRunKeys;
  const int64_t most = tuning.max_splits > 0 ? tuning.max_splits : kDefaultMaxSplits;
  const int64_t wanted = std::max(std::min((p.source + plan.min_run - 1) / plan.min_run, most),
                                  (p.source + kMaxRunKeys - 1) / kMaxRunKeys);
  plan.splits = static_cast<int>(std::max<int64_t>(wanted, 1));
  const int64_t rows = plan.upper ? 16 : 8;
  const int64_t heads = p.q_heads / p.k_heads;
  const int64_t weights = std::max<int64_t>(heads * plan.splits, kMaxGroup * (kDecodeWarps + 1));
  plan.shared_bytes = (kDecodeWarps * rows * (p.embed + 6) + weights + kMaxGroup + 1) * 4;
  return plan;
}

// One 16-bit element of a lane's value slice: 32-bit word `index / 2` of the slice's 16-byte vectors.
__device__ __forceinline__ uint32_t slice_word(const uint4* slice, int index) {
  return reinterpret_cast<const uint32_t*>(slice)[index / 2];
}

template <typename T, int D, bool Upper>
__global__ void __launch_bounds__(kDecodeThreads, 1)
    decode_attention_kernel(AttentionParams p, int splits, int min_run, Operand q, const T* k, const T* v, void* out,
                            int out_elem, float* values, float* stats, unsigned* counters) {
  constexpr int W = D / 8;        // features per lane group in the weighted sum (its n-tiles)
  constexpr int kPairs = D / 32;  // pairs of k-steps in the scores, 8 features of each per lane
  constexpr int kSlice = W / 8;   // 16-byte vectors of a lane's value slice
  constexpr int kRows = Upper ? 16 : 8;
  constexpr int kHalves = Upper ? 2 : 1;
  extern __shared__ float4 decode_shared[];
  auto* shared = reinterpret_cast<float*>(decode_shared);
  // [warp][row][kAccStride]: feature e at e + e / 32, rows kAccStride apart, so that the lanes of a warp storing
  // their fragments fall on different banks; then the combine's part sums.
  constexpr int kAccStride = D + 4;
  float* warp_acc = shared;
  float* warp_top = warp_acc + kDecodeWarps * kRows * kAccStride;  // [warp][row]
  float* warp_total = warp_top + kDecodeWarps * kRows;             // [warp][row]
  float* split_weight = warp_total + kDecodeWarps * kRows;         // [head][splits]
  const int heads = static_cast<int>(p.q_heads / p.k_heads);
  float* run_max = split_weight + max(heads * splits, kMaxGroup * (kDecodeWarps + 1));  // [kMaxGroup]
  auto* is_last = reinterpret_cast<int*>(run_max + kMaxGroup);

  allow_dependent_launch();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int64_t block_group = blockIdx.x, b = block_group / p.k_heads, kv = block_group % p.k_heads;
  const int64_t first_head = kv * heads, first_row = b * p.q_heads + first_head;

  wait_for_producer();
  // The query fragments: rows g and g + 8 (heads of the group), features 32m + 8t + 2i, +1 as pair [m][i]; 16-byte
  // loads when the query is in the storage type, all in flight together.
  uint32_t query[kHalves][kPairs][4];
  const bool query_in_storage = q.elem == element_code<T>() && reinterpret_cast<uintptr_t>(q.data) % 16 == 0;
#pragma unroll
  for (int half = 0; half < kHalves; ++half) {
    const int head = g + 8 * half;
#pragma unroll
    for (int m = 0; m < kPairs; ++m) {
      const int64_t at = (first_row + head) * D + 32 * m + 8 * t;
      if (head >= heads) {
        query[half][m][0] = query[half][m][1] = query[half][m][2] = query[half][m][3] = 0u;
      } else if (query_in_storage) {
        const uint4 vector = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(q.data) + at));
        query[half][m][0] = vector.x;
        query[half][m][1] = vector.y;
        query[half][m][2] = vector.z;
        query[half][m][3] = vector.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          query[half][m][i] = pack_pair<T>(load_f(q.data, q.elem, at + 2 * i), load_f(q.data, q.elem, at + 2 * i + 1));
      }
    }
  }
  const int64_t attended = attended_keys(p);
  if (attended == 0) {
    if (blockIdx.y == 0)
      for (int i = tid; i < heads * D; i += kDecodeThreads)
        store_f(out, out_elem, first_row * D + i, finished_value(p, 0.0f, -INFINITY, 0.0f));
    return;
  }
  const int64_t per_split =
      (max((attended + splits - 1) / splits, int64_t{min_run}) + kBlockStep - 1) / kBlockStep * kBlockStep;
  const int64_t runs = (attended + per_split - 1) / per_split;
  const int64_t begin = blockIdx.y * per_split;
  if (begin >= attended) return;
  const int count = static_cast<int>(min(begin + per_split, attended) - begin);
  const T* key_base = k + ((b * p.k_heads + kv) * p.source + begin) * D;
  const T* value_base = v + ((b * p.v_heads + kv) * p.source + begin) * D;

  float top[kHalves], total[kHalves], acc[W][4];
#pragma unroll
  for (int half = 0; half < kHalves; ++half) {
    top[half] = -INFINITY;
    total[half] = 0.0f;
  }
#pragma unroll
  for (int n = 0; n < W; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int first = warp * kTileKeys; first < count; first += kBlockStep) {
    // Key rows first + 8j + g (features 32m + 8t..+8); value rows and scores of keys first + 2t, +1, +8, +9.
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
    float mask[kHalves][4];
#pragma unroll
    for (int half = 0; half < kHalves; ++half)
#pragma unroll
      for (int u = 0; u < 4; ++u)
        mask[half][u] = mine[u] < count && g + 8 * half < heads
                            ? mask_term(p, b, first_head + g + 8 * half, 0, begin + mine[u])
                            : 0.0f;

    float score[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int m = 0; m < kPairs; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t a[4] = {query[0][m][2 * h], Upper ? query[kHalves - 1][m][2 * h] : 0u, query[0][m][2 * h + 1],
                                 Upper ? query[kHalves - 1][m][2 * h + 1] : 0u};
          const auto* words = reinterpret_cast<const uint32_t*>(&key_part[j][m]);
          mma_16816<T>(score[j], a, words[2 * h], words[2 * h + 1]);
        }

    // The online softmax of rows g (and g + 8) over the tile's keys, shared by the four lanes of a row.
    float weight[kHalves][4];
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      float x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        x[u] = mine[u] < count ? masked_score(p, score[u / 2][2 * half + u % 2], mask[half][u], 0, begin + mine[u])
                               : -INFINITY;
      float tile_top = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      tile_top = fmaxf(tile_top, __shfl_xor_sync(0xffffffffu, tile_top, 1));
      tile_top = fmaxf(tile_top, __shfl_xor_sync(0xffffffffu, tile_top, 2));
      const float now = fmaxf(top[half], tile_top);
      const float factor = now == -INFINITY ? 1.0f : __expf(top[half] - now);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        weight[half][u] = now == -INFINITY ? 0.0f : __expf(x[u] - now);
        sum += weight[half][u];
      }
      total[half] = total[half] * factor + sum;
      top[half] = now;
#pragma unroll
      for (int n = 0; n < W; ++n) {
        acc[n][2 * half] *= factor;
        acc[n][2 * half + 1] *= factor;
      }
    }
    const uint32_t weights[4] = {pack_pair<T>(weight[0][0], weight[0][1]),
                                 Upper ? pack_pair<T>(weight[kHalves - 1][0], weight[kHalves - 1][1]) : 0u,
                                 pack_pair<T>(weight[0][2], weight[0][3]),
                                 Upper ? pack_pair<T>(weight[kHalves - 1][2], weight[kHalves - 1][3]) : 0u};
#pragma unroll
    for (int n = 0; n < W; ++n) {
      const uint32_t select = n % 2 == 0 ? 0x5410u : 0x7632u;  // the low or the high halves of two words
      const uint32_t b0 = __byte_perm(slice_word(value_part[0], n), slice_word(value_part[1], n), select);
      const uint32_t b1 = __byte_perm(slice_word(value_part[2], n), slice_word(value_part[3], n), select);
      mma_16816<T>(acc[n], weights, b0, b1);
    }
  }

  // The warps' runs, combined through shared memory: row g's features W·2t + n and W·(2t + 1) + n.
#pragma unroll
  for (int half = 0; half < kHalves; ++half) {
    total[half] += __shfl_xor_sync(0xffffffffu, total[half], 1);
    total[half] += __shfl_xor_sync(0xffffffffu, total[half], 2);
    const int row = g + 8 * half;
#pragma unroll
    for (int n = 0; n < W; ++n) {
      const int even = W * 2 * t + n, odd = W * (2 * t + 1) + n;
      warp_acc[(warp * kRows + row) * kAccStride + even + even / 32] = acc[n][2 * half];
      warp_acc[(warp * kRows + row) * kAccStride + odd + odd / 32] = acc[n][2 * half + 1];
    }
    if (t == 0) {
      warp_top[warp * kRows + row] = top[half];
      warp_total[warp * kRows + row] = total[half];
    }
  }
  __syncthreads();
  // Each warp's factor per head (its maximum against the block's), then the block's sums over the warps.
  float* warp_scale = split_weight;                            // [head][warp], free until the combine
  float* block_total = warp_scale + kMaxGroup * kDecodeWarps;  // [head]
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
      weighted += warp_acc[(w * kRows + head) * kAccStride + e + e / 32] * warp_scale[head * kDecodeWarps + w];
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
  if (only_run) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned ticket = atomicAdd(counters + block_group, 1u);
    *is_last = ticket == static_cast<unsigned>(runs - 1);
    if (*is_last) counters[block_group] = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!*is_last) return;
  __threadfence();

  // The last run combines them: a warp per head weighs the runs from their maxima and sums, then each output adds
  // up the runs' partial sums (four features per load, `parts` threads sharing an output's runs).
  for (int head = warp; head < heads; head += kDecodeWarps) {
    const float* stat = stats + (first_row + head) * splits * 2;
    float lane_top = -INFINITY, lane_sum = 0.0f;  // this lane's runs, merged as they come
    for (int r = lane; r < runs; r += 32) {
      const float run_top = __ldcg(stat + 2 * r), run_sum = __ldcg(stat + 2 * r + 1);
      split_weight[head * splits + r] = run_top;
      const float now = fmaxf(lane_top, run_top);
      if (now != -INFINITY) {
        lane_sum = lane_sum * expf(lane_top - now) + run_sum * expf(run_top - now);
        lane_top = now;
      }
    }
    const float peak = warp_max(lane_top);
    const float sum = warp_sum(peak == -INFINITY || lane_top == -INFINITY ? 0.0f : lane_sum * expf(lane_top - peak));
    for (int r = lane; r < runs; r += 32) {
      const float run_top = split_weight[head * splits + r];
      split_weight[head * splits + r] = peak == -INFINITY || run_top == -INFINITY ? 0.0f : expf(run_top - peak) / sum;
    }
    if (lane == 0) run_max[head] = peak;
  }
  __syncthreads();
  // The runs' partial sums, one row of a head's features per warp load (a float4 per lane), kInFlight rows in flight
  // per lane; each warp adds its rows into its own slot per head, the slots are summed at the end.
  static_assert(D / 4 <= 32, "a lane takes four features of a row");
  auto* slots = reinterpret_cast<float4*>(warp_acc);  // [warp][head][D / 4]
  for (int i = lane; i < heads * (D / 4); i += 32) slots[warp * heads * (D / 4) + i] = make_float4(0, 0, 0, 0);
  __syncwarp();
  const int rows_total = heads * static_cast<int>(runs);
  constexpr int kInFlight = 16;
  if (lane < D / 4)
    for (int first_of = warp; first_of < rows_total; first_of += kDecodeWarps * kInFlight) {
      float4 loaded[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int row = first_of + u * kDecodeWarps;
        const int head = row / static_cast<int>(runs), run = row % static_cast<int>(runs);
        loaded[u] =
            row < rows_total
                ? __ldcg(reinterpret_cast<const float4*>(values + ((first_row + head) * splits + run) * D) + lane)
                : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int row = first_of + u * kDecodeWarps;
        if (row >= rows_total) break;
        const int head = row / static_cast<int>(runs), run = row % static_cast<int>(runs);
        const float scale = split_weight[head * splits + run];
        float4& slot = slots[(warp * heads + head) * (D / 4) + lane];
        slot.x += loaded[u].x * scale;
        slot.y += loaded[u].y * scale;
        slot.z += loaded[u].z * scale;
        slot.w += loaded[u].w * scale;
      }
    }
  __syncthreads();
  const auto* features = reinterpret_cast<const float*>(slots);
  for (int i = tid; i < heads * D; i += kDecodeThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) sum += features[w * heads * D + i];
    const int head = i / D;
    store_f(out, out_elem, (first_row + head) * D + i % D, finished_value(p, sum, run_max[head], 1.0f));
  }
}

template <typename T, int D, bool Upper>
cudaError_t launch_decode_typed(cudaStream_t stream, const AttentionParams& p, const DecodePlan& plan, void* out,
                                int out_elem, Operand q, const void* k, const void* v, float* scratch) {
  static std::atomic<int64_t> allowed_shared{48 * 1024};
  if (plan.shared_bytes > allowed_shared.load()) {
    const cudaError_t error =
        cudaFuncSetAttribute(decode_attention_kernel<T, D, Upper>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(plan.shared_bytes));
    if (error != cudaSuccess) return error;
    allowed_shared.store(plan.shared_bytes);
  }
  const int64_t rows = p.batch * p.q_heads;
  float* values = scratch;
  float* stats = scratch ? values + rows * plan.splits * D : nullptr;
  auto* counters = scratch ? reinterpret_cast<unsigned*>(stats + rows * plan.splits * 2) : nullptr;
  const dim3 grid(static_cast<unsigned>(p.batch * p.k_heads), static_cast<unsigned>(plan.splits));
  return launch_dependent(decode_attention_kernel<T, D, Upper>, grid, kDecodeThreads, plan.shared_bytes, stream, p,
                          plan.splits, plan.min_run, q, static_cast<const T*>(k), static_cast<const T*>(v), out,
                          out_elem, values, stats, counters);
}

template <typename T, int D>
cudaError_t launch_decode_width(cudaStream_t stream, const AttentionParams& p, const DecodePlan& plan, void* out,
                                int out_elem, Operand q, const void* k, const void* v, float* scratch) {
  if (plan.upper) return launch_decode_typed<T, D, true>(stream, p, plan, out, out_elem, q, k, v, scratch);
  return launch_decode_typed<T, D, false>(stream, p, plan, out, out_elem, q, k, v, scratch);
}

template <typename T>
cudaError_t launch_decode_storage(cudaStream_t stream, const AttentionParams& p, const DecodePlan& plan, void* out,
                                  int out_elem, Operand q, const void* k, const void* v, float* scratch) {
  if (p.embed == 64) return launch_decode_width<T, 64>(stream, p, plan, out, out_elem, q, k, v, scratch);
  return launch_decode_width<T, 128>(stream, p, plan, out, out_elem, q, k, v, scratch);
}

}  // namespace

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
  return rows * plan.splits * (p.embed + 2) + p.batch * p.k_heads;
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
