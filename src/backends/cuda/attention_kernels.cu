// Attention kernels: the tiled form (query rows sharing a key/value head against 16-byte tiles of keys and values in
// shared memory; decode splits the keys into runs that the last one combines) and the general form for the rest (one
// block per query row, or its keys split over blocks and combined by a second kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_decode.h"
#include "backends/cuda/attention_mma.h"
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

namespace {

// ---- attention: one block per (batch, query head, query row); a warp per key for the scores, a warp per key
// and a lane per value feature for the weighted sum, the scores in shared memory ----

constexpr int kAttentionWarps = 8;
constexpr int kAttentionThreads = kAttentionWarps * 32;
constexpr int64_t kAttentionChunk = 128;               // value features summed per pass: 4 per lane
constexpr int64_t kAttentionSharedFloats = 12 * 1024;  // 48 KB

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

// ---- tiled attention: a block takes query rows that share one key/value head (query heads of a group in decode,
// positions of one head in prefill) and a run of keys. Tiles of key and value rows are copied to shared memory
// asynchronously (the next tile's copy in flight while the current one is used) and folded in with an online
// softmax. With one query row per head (decode, flash-decoding) the runs follow the attended context, read on the
// device: a short context takes few blocks, a long one up to kDecodeMaxSplits runs per head, and the last run to
// finish combines them ----

constexpr int kTiledThreads = 256;
constexpr int kTiledWarps = kTiledThreads / 32;
// Query heads per block in decode. The kernel shares each cache row between the query heads of a key/value head;
// on the H100 (Qwen2.5-1.5B shape, 6 query heads per key/value head, whole decode steps) 2 heads per block took 11%
// off the step at context 8192 (2.09 against 2.35 ms) for 1-2% more at context 128, 4 and 6 heads made context 128
// 4-20% slower (a block's serial work grows with its heads), and 64 runs per head instead of 32 were slower with
// either.
constexpr int kDecodeHeadsPerBlock = 2;
// Query positions of one head per block when there are several (prefill): they share every key and value tile.
constexpr int kPrefillRowsPerBlock = 4;
constexpr int kTileMaxKeys = 64;           // keys per tile (the softmax takes two per lane)
constexpr int kDecodeMaxSplits = 32;       // runs per head group (the last one combines them)
constexpr int64_t kTileBytes = 32 * 1024;  // one tile's key and value rows
constexpr int64_t kTiledMaxEmbed = 512;

struct TiledPlan {
  int heads, chunks;  // query heads per block, blocks per key/value head
  int tile, splits;   // keys per tile, the most runs per head group (grid.y)
  int64_t query_offset, tiles_offset, scores_offset, shared_bytes;
};

// Key (or value) row `row` of a tile, 16-byte vector `column`: in rows of a multiple of 8 vectors, each group of 8 is
// permuted by the row (an XOR with 0, 4, 1, 5, 2, 6, 3, 7 for rows 0..7), so that lanes reading a few columns of two
// neighbouring rows, or every column of one row, fall on different shared-memory banks.
__device__ __forceinline__ int tile_slot(int row, int column, int vectors) {
  const int permutation = ((row & 1) << 2) | ((row >> 1) & 3);
  return row * vectors + (vectors % 8 == 0 ? column ^ permutation : column);
}

template <typename T, int Heads>
__global__ void __launch_bounds__(kTiledThreads, 2)
    tiled_attention_kernel(AttentionParams p, TiledPlan plan, Operand q, const T* k, const T* v, void* out,
                           int out_elem, float* stats, float* values, unsigned* counters) {
  constexpr int kPerVector = 16 / sizeof(T);
  extern __shared__ float4 tiled_shared[];
  auto* shared = reinterpret_cast<unsigned char*>(tiled_shared);
  allow_dependent_launch();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // A block's query rows share one key/value head: with one query row per head (decode) they are heads of one
  // group, else consecutive positions of one head. Rows are numbered as q's [batch, head, position] flattening.
  const bool rows_are_heads = p.length == 1;
  const int64_t group = p.q_heads / p.k_heads, block_group = blockIdx.x;
  const int64_t segment_rows = rows_are_heads ? group : p.length, segments = rows_are_heads ? p.k_heads : p.q_heads;
  const int64_t chunk = block_group % plan.chunks, segment = (block_group / plan.chunks) % segments,
                b = block_group / (plan.chunks * segments);
  const int64_t kv = rows_are_heads ? segment : segment / group;
  const int heads = static_cast<int>(min(static_cast<int64_t>(Heads), segment_rows - chunk * Heads));
  const int64_t first_in_batch = segment * segment_rows + chunk * Heads;
  const int64_t first_row = b * p.q_heads * p.length + first_in_batch;
  auto head_of = [&](int g) { return rows_are_heads ? first_in_batch + g : segment; };
  auto position_of = [&](int g) { return rows_are_heads ? int64_t{0} : chunk * Heads + g; };
  const int tile = plan.tile;
  const int key_vectors = static_cast<int>(p.embed / kPerVector),
            value_vectors = static_cast<int>(p.value_embed / kPerVector);

  auto* query = reinterpret_cast<float*>(shared + plan.query_offset);  // [heads][embed]
  auto* key_tiles = reinterpret_cast<uint4*>(shared + plan.tiles_offset);
  uint4* value_tiles = key_tiles + 2 * tile * key_vectors;
  auto* partial = reinterpret_cast<float*>(shared + plan.tiles_offset);  // after the last tile
  auto* scores = reinterpret_cast<float*>(shared + plan.scores_offset);  // [Heads][tile]
  float* run_max = scores + Heads * tile;
  float* run_sum = run_max + Heads;
  float* rescale = run_sum + Heads;
  float* split_weight = rescale + Heads;  // [Heads][kDecodeMaxSplits]
  auto* is_last = reinterpret_cast<int*>(split_weight + Heads * kDecodeMaxSplits);

  wait_for_producer();
  const int64_t attended = attended_keys(p);
  if (attended == 0) {
    if (blockIdx.y == 0)
      for (int64_t i = tid; i < heads * p.value_embed; i += blockDim.x)
        store_f(out, out_elem, first_row * p.value_embed + i, finished_value(p, 0.0f, -INFINITY, 0.0f));
    return;
  }
  const int64_t per_split = (max((attended + plan.splits - 1) / plan.splits, int64_t{tile}) + tile - 1) / tile * tile;
  const int64_t runs = (attended + per_split - 1) / per_split;
  const int64_t begin = blockIdx.y * per_split, end = min(begin + per_split, attended);
  if (begin >= end) return;

  const uint4* key_rows = reinterpret_cast<const uint4*>(k + (b * p.k_heads + kv) * p.source * p.embed);
  const uint4* value_rows = reinterpret_cast<const uint4*>(v + (b * p.v_heads + kv) * p.source * p.value_embed);
  // Each thread copies the vectors tid, tid + kTiledThreads, ... of a tile's rows (row and column stepped without
  // dividing).
  auto copy_rows = [&](const uint4* source, uint4* tile_base, int vectors, int64_t start) {
    int row = tid / vectors, column = tid % vectors;
    const int row_step = kTiledThreads / vectors, column_step = kTiledThreads % vectors;
    while (row < tile) {
      const bool valid = start + row < end;  // rows past the run are zero-filled
      copy_async_16(tile_base + tile_slot(row, column, vectors), source + (valid ? start + row : 0) * vectors + column,
                    valid);
      row += row_step;
      column += column_step;
      if (column >= vectors) {
        column -= vectors;
        ++row;
      }
    }
  };
  auto copy_tile = [&](int64_t start, int buffer) {
    copy_rows(key_rows, key_tiles + buffer * tile * key_vectors, key_vectors, start);
    copy_rows(value_rows, value_tiles + buffer * tile * value_vectors, value_vectors, start);
    commit_async_copies();
  };

  // Scores: threads_per_key lanes share a key row. Values: `streams` lanes sum every streams-th row of a tile,
  // each lane one 16-byte vector of the row for every head.
  const int threads_per_key = kTiledThreads / tile;
  const int key_row = tid / threads_per_key, key_part = tid % threads_per_key;
  const int streams = static_cast<int>(kTiledThreads / value_vectors);
  const int stream = static_cast<int>(tid / value_vectors), value_column = static_cast<int>(tid % value_vectors);
  // The mask terms of this lane's key for each row (one load when the mask is the same for all the block's rows).
  const bool one_mask = rows_are_heads ? p.mask_head_stride == 0 : p.mask_row_stride == 0;
  auto load_masks = [&](int64_t start, float(&mask)[Heads]) {
    const int64_t key = start + key_row;
#pragma unroll
    for (int g = 0; g < Heads; ++g)
      mask[g] = key_part == 0 && key < end && g < heads && (g == 0 || !one_mask)
                    ? mask_term(p, b, head_of(g), position_of(g), key)
                    : 0.0f;
  };

  copy_tile(begin, 0);
  for (int64_t i = tid; i < heads * p.embed; i += blockDim.x)
    query[i] = load_f(q.data, q.elem, first_row * p.embed + i);
  if (tid < Heads) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }
  float mask_now[Heads], mask_next[Heads] = {};
  load_masks(begin, mask_now);
  float acc[Heads][kPerVector] = {};

  int buffer = 0;
  for (int64_t start = begin; start < end; start += tile, buffer ^= 1) {
    if (start + tile < end) {
      copy_tile(start + tile, buffer ^ 1);
      load_masks(start + tile, mask_next);
      wait_async_copies<1>();
    } else {
      wait_async_copies<0>();
    }
    __syncthreads();

    float dot[Heads] = {};
    for (int column = key_part; column < key_vectors; column += threads_per_key) {
      const uint4 raw = key_tiles[buffer * tile * key_vectors + tile_slot(key_row, column, key_vectors)];
      const T* elements = reinterpret_cast<const T*>(&raw);
      float key[kPerVector];
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) key[e] = to_float(elements[e]);
#pragma unroll
      for (int g = 0; g < Heads; ++g) {
        if (g >= heads) break;
        const auto* q4 = reinterpret_cast<const float4*>(query + g * p.embed + column * kPerVector);
#pragma unroll
        for (int e = 0; e < kPerVector / 4; ++e) {
          const float4 x = q4[e];
          dot[g] += key[4 * e] * x.x + key[4 * e + 1] * x.y + key[4 * e + 2] * x.z + key[4 * e + 3] * x.w;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < Heads; ++g)
      for (int offset = threads_per_key / 2; offset > 0; offset /= 2)
        dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
    if (key_part == 0) {
      const int64_t key = start + key_row;
#pragma unroll
      for (int g = 0; g < Heads; ++g)
        if (g < heads)
          scores[g * tile + key_row] =
              key < end ? masked_score(p, dot[g], one_mask ? mask_now[0] : mask_now[g], position_of(g), key)
                        : -INFINITY;
    }
    __syncthreads();

    // Online softmax, a warp per head: the running maximum, the tile's weights, the factor for the earlier sums.
    for (int g = warp; g < heads; g += kTiledWarps) {
      const float s0 = lane < tile ? scores[g * tile + lane] : -INFINITY;
      const float s1 = lane + 32 < tile ? scores[g * tile + lane + 32] : -INFINITY;
      const float before = run_max[g];
      const float top = fmaxf(before, warp_max(fmaxf(s0, s1)));
      float w0 = 0.0f, w1 = 0.0f, factor = 1.0f;
      if (top != -INFINITY) {
        w0 = expf(s0 - top);
        w1 = expf(s1 - top);
        factor = expf(before - top);
      }
      const float total = warp_sum(w0 + w1);
      if (lane < tile) scores[g * tile + lane] = w0;
      if (lane + 32 < tile) scores[g * tile + lane + 32] = w1;
      __syncwarp();
      if (lane == 0) {
        run_max[g] = top;
        run_sum[g] = run_sum[g] * factor + total;
        rescale[g] = factor;
      }
    }
    __syncthreads();

    if (stream < streams) {
#pragma unroll
      for (int g = 0; g < Heads; ++g)
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) acc[g][e] *= g < heads ? rescale[g] : 1.0f;
      for (int row = stream; row < tile; row += streams) {
        const uint4 raw = value_tiles[buffer * tile * value_vectors + tile_slot(row, value_column, value_vectors)];
        const T* elements = reinterpret_cast<const T*>(&raw);
        float value[kPerVector];
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) value[e] = to_float(elements[e]);
#pragma unroll
        for (int g = 0; g < Heads; ++g) {
          if (g >= heads) break;
          const float weight = scores[g * tile + row];
#pragma unroll
          for (int e = 0; e < kPerVector; ++e) acc[g][e] += weight * value[e];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < Heads; ++g) mask_now[g] = mask_next[g];
    __syncthreads();  // the tile's buffer and scores are free for the next copy
  }

  // The streams' sums, then the run's result: the output itself when it is the only run, else its partial sums.
  if (stream < streams)
#pragma unroll
    for (int g = 0; g < Heads; ++g)
      if (g < heads)
#pragma unroll
        for (int e = 0; e < kPerVector; ++e)
          partial[(stream * heads + g) * p.value_embed + value_column * kPerVector + e] = acc[g][e];
  __syncthreads();
  const bool only_run = runs == 1;
  for (int64_t i = tid; i < heads * p.value_embed; i += blockDim.x) {
    const int g = static_cast<int>(i / p.value_embed);
    const int64_t e = i % p.value_embed;
    float total = 0.0f;
    for (int s = 0; s < streams; ++s) total += partial[(s * heads + g) * p.value_embed + e];
    if (only_run)
      store_f(out, out_elem, (first_row + g) * p.value_embed + e, finished_value(p, total, run_max[g], run_sum[g]));
    else
      values[((first_row + g) * plan.splits + blockIdx.y) * p.value_embed + e] = total;
  }
  if (only_run) return;
  if (tid < heads) {
    stats[((first_row + tid) * plan.splits + blockIdx.y) * 2] = run_max[tid];
    stats[((first_row + tid) * plan.splits + blockIdx.y) * 2 + 1] = run_sum[tid];
  }
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

  // The last run combines them all: a warp per head weighs the runs (a lane each) from their maxima and sums, then
  // each output adds up the runs' partial sums.
  static_assert(kDecodeMaxSplits <= 32, "the combine takes one run per lane");
  for (int g = warp; g < heads; g += kTiledWarps) {
    const float* stat = stats + (first_row + g) * plan.splits * 2;
    const float peak = lane < runs ? __ldcg(stat + 2 * lane) : -INFINITY;
    const float sum = lane < runs ? __ldcg(stat + 2 * lane + 1) : 0.0f;
    const float top = warp_max(peak);
    const float scale = top == -INFINITY || peak == -INFINITY ? 0.0f : expf(peak - top);
    const float total = warp_sum(sum * scale);
    split_weight[g * kDecodeMaxSplits + lane] = top == -INFINITY ? 0.0f : scale / total;
    if (lane == 0) run_max[g] = top;
  }
  __syncthreads();
  // Each output's sum over the runs: `parts` threads per output take every parts-th run (their loads issued together),
  // then add up through shared memory.
  const int64_t outputs = heads * p.value_embed;
  const int parts = static_cast<int>(max(int64_t{1}, min(int64_t{kTiledThreads} / outputs, int64_t{8})));
  auto* part_sums = reinterpret_cast<float*>(shared + plan.tiles_offset);  // [parts][outputs]
  for (int64_t o = tid % outputs; o < outputs && tid < parts * outputs; o += kTiledThreads) {
    const int part = static_cast<int>(tid / outputs);
    const int g = static_cast<int>(o / p.value_embed);
    const float* partials = values + (first_row + g) * plan.splits * p.value_embed + o % p.value_embed;
    constexpr int kInFlight = 8;
    float weighted = 0.0f;
    for (int run0 = part; run0 < runs; run0 += parts * kInFlight) {
      float loaded[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int run = run0 + u * parts;
        loaded[u] =
            run < runs ? __ldcg(partials + run * p.value_embed) * split_weight[g * kDecodeMaxSplits + run] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) weighted += loaded[u];
    }
    part_sums[part * outputs + o] = weighted;
  }
  __syncthreads();
  for (int64_t o = tid; o < outputs; o += kTiledThreads) {
    float weighted = 0.0f;
    for (int part = 0; part < parts; ++part) weighted += part_sums[part * outputs + o];
    const int g = static_cast<int>(o / p.value_embed);
    store_f(out, out_elem, (first_row + g) * p.value_embed + o % p.value_embed,
            finished_value(p, weighted, run_max[g], 1.0f));
  }
}

// The tiled kernel's shape for these parameters and storage, or nullopt where it does not apply (key and value head
// counts that differ, rows that are not whole 16-byte vectors, very wide rows, or one query row per head without
// scratch for the runs' partial sums). Several query rows per head take one run per block (no combine).
std::optional<TiledPlan> tiled_plan(const AttentionParams& p, int elem, const void* k, const void* v,
                                    bool has_scratch) {
  if (p.length < 1 || (p.length == 1 && !has_scratch) || elem > kBF16 || p.k_heads != p.v_heads ||
      p.q_heads % p.k_heads != 0)
    return std::nullopt;
  const int64_t size = elem == kF32 ? 4 : 2, per_vector = 16 / size;
  const auto aligned = [](const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; };
  if (p.embed % per_vector != 0 || p.value_embed % per_vector != 0 || p.embed > kTiledMaxEmbed ||
      p.value_embed > kTiledMaxEmbed || !aligned(k) || !aligned(v))
    return std::nullopt;
  TiledPlan plan{};
  const int64_t group = p.q_heads / p.k_heads;
  plan.heads = p.length == 1 ? kDecodeHeadsPerBlock : kPrefillRowsPerBlock;
  const int64_t segment_rows = p.length == 1 ? group : p.length;
  plan.chunks = static_cast<int>((segment_rows + plan.heads - 1) / plan.heads);
  const int64_t row_bytes = (p.embed + p.value_embed) * size;
  plan.tile = kTileMaxKeys;
  while (plan.tile > 8 && plan.tile * row_bytes > kTileBytes) plan.tile /= 2;
  plan.splits =
      p.length == 1 ? static_cast<int>(std::min<int64_t>((p.source + plan.tile - 1) / plan.tile, kDecodeMaxSplits)) : 1;
  const int64_t streams = kTiledThreads / (p.value_embed / per_vector);
  const auto round16 = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
  plan.query_offset = 0;
  plan.tiles_offset = round16(plan.heads * p.embed * 4);
  const int64_t tiles = std::max(2 * plan.tile * row_bytes, streams * plan.heads * p.value_embed * 4);
  plan.scores_offset = plan.tiles_offset + round16(tiles);
  plan.shared_bytes = plan.scores_offset + round16((plan.heads * (plan.tile + 3 + kDecodeMaxSplits) + 1) * 4);
  return plan;
}

template <typename T, int Heads>
cudaError_t launch_tiled_typed(cudaStream_t stream, const AttentionParams& p, const TiledPlan& plan, void* out,
                               int out_elem, Operand q, const void* k, const void* v, float* scratch) {
  if (const cudaError_t error = allow_shared_bytes<tiled_attention_kernel<T, Heads>>(plan.shared_bytes);
      error != cudaSuccess)
    return error;
  const int64_t rows = p.batch * p.q_heads;
  float* stats = scratch;
  float* values = scratch + rows * plan.splits * 2;
  auto* counters = reinterpret_cast<unsigned*>(values + rows * plan.splits * p.value_embed);
  const int64_t segments = p.length == 1 ? p.k_heads : p.q_heads;
  const dim3 grid(static_cast<unsigned>(p.batch * segments * plan.chunks), static_cast<unsigned>(plan.splits));
  return launch_dependent(tiled_attention_kernel<T, Heads>, grid, kTiledThreads, plan.shared_bytes, stream, p, plan, q,
                          static_cast<const T*>(k), static_cast<const T*>(v), out, out_elem, stats, values, counters);
}

template <int Rows>
cudaError_t launch_tiled(cudaStream_t stream, const AttentionParams& p, const TiledPlan& plan, int elem, void* out,
                         int out_elem, Operand q, Operand k, Operand v, float* scratch) {
  switch (elem) {
    case kF32:
      return launch_tiled_typed<float, Rows>(stream, p, plan, out, out_elem, q, k.data, v.data, scratch);
    case kF16:
      return launch_tiled_typed<__half, Rows>(stream, p, plan, out, out_elem, q, k.data, v.data, scratch);
    default:
      return launch_tiled_typed<__nv_bfloat16, Rows>(stream, p, plan, out, out_elem, q, k.data, v.data, scratch);
  }
}

}  // namespace

bool attention_supported(const AttentionParams& p, Operand k, Operand v) {
  if (k.elem == v.elem && decode_attention_applies(p, k.elem, k.data, v.data)) return true;
  if (p.tensor_cores && k.elem == v.elem && mma_attention_applies(p, k.elem, k.data, v.data)) return true;
  const bool split_scratch = attention_scratch_floats(p) > 0;
  if (k.elem == v.elem && tiled_plan(p, k.elem, k.data, v.data, split_scratch)) return true;
  return split_scratch || p.embed + p.source <= kAttentionSharedFloats - kAttentionWarps * kAttentionChunk;
}

int64_t attention_scratch_floats(const AttentionParams& p) {
  if (p.length != 1) return 0;
  const int64_t decode = decode_attention_scratch_floats(p);
  if (p.source < 2 * kSplitKeys) return decode;
  const int64_t splits = std::max((p.source + kSplitKeys - 1) / kSplitKeys, int64_t{kDecodeMaxSplits});
  const int64_t rows = p.batch * p.q_heads;
  return std::max(decode, rows * splits * (2 + p.value_embed) + rows);  // the partial sums, then a counter per group
}

cudaError_t launch_attention(cudaStream_t stream, const AttentionParams& p, void* out, int out_elem, Operand q,
                             Operand k, Operand v, float* scratch) {
  const int64_t rows = p.batch * p.q_heads * p.length;
  if (rows <= 0) return cudaGetLastError();
  if (p.tensor_cores && k.elem == v.elem && mma_attention_applies(p, k.elem, k.data, v.data))
    return launch_mma_attention(stream, p, k.elem, out, out_elem, q, k.data, v.data);
  if (k.elem == v.elem && decode_attention_applies(p, k.elem, k.data, v.data) &&
      (scratch || decode_attention_scratch_floats(p) == 0))
    return launch_decode_attention(stream, p, k.elem, out, out_elem, q, k.data, v.data, scratch);
  if (p.heads_inner_output) return cudaErrorInvalidValue;  // only the tensor-core form writes that layout
  const bool split_scratch = scratch && attention_scratch_floats(p) > 0;
  if (const auto plan = k.elem == v.elem ? tiled_plan(p, k.elem, k.data, v.data, split_scratch) : std::nullopt) {
    if (p.length == 1)
      return launch_tiled<kDecodeHeadsPerBlock>(stream, p, *plan, k.elem, out, out_elem, q, k, v, scratch);
    return launch_tiled<kPrefillRowsPerBlock>(stream, p, *plan, k.elem, out, out_elem, q, k, v, scratch);
  }
  if (split_scratch) {
    const int64_t splits = (p.source + kSplitKeys - 1) / kSplitKeys;
    float* stats = scratch;
    float* values = scratch + rows * splits * 2;
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(splits));
    const size_t shared = static_cast<size_t>(p.embed + kSplitKeys + kAttentionWarps * kAttentionChunk) * sizeof(float);
    attention_split_kernel<<<grid, kAttentionThreads, shared, stream>>>(p, splits, stats, values, q, k, v);
    attention_combine_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(p, splits, stats, values, out, out_elem);
    return cudaGetLastError();
  }
  const size_t shared = static_cast<size_t>(p.embed + p.source + kAttentionWarps * kAttentionChunk) * sizeof(float);
  attention_kernel<<<static_cast<unsigned>(rows), kAttentionThreads, shared, stream>>>(p, out, out_elem, q, k, v);
  return cudaGetLastError();
}

}  // namespace npusim::cuda
