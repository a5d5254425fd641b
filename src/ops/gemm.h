#pragma once
// A cache-blocked fp32 matrix multiply shared by the reference implementations (conv, linear, matmul, attention).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace npusim::ops {

// Writes row p, columns [col, col + count) of a B operand that is produced on the fly (a convolution's im2col
// matrix) into `out`. Called concurrently from several threads.
using GemmRowSource = std::function<void(int64_t p, int64_t col, int64_t count, float* out)>;

// C[m, n] = alpha * A[m, k] · B + beta * C, accumulated in fp32. Row-major operands with explicit row strides.
// B is [k, n] (row stride ldb), or [n, k] when `b_transposed` (the layout of a linear weight).
// C is not read when beta == 0, so it may hold garbage. With k == 0 the product is zero.
struct GemmArgs {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  bool b_transposed = false;
  const GemmRowSource* b_rows = nullptr;  // when set, B is [k, n] and comes from here instead of `b`
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int max_threads = 0;  // 0: as many as the machine has, used only when the work is large enough
};

void gemm_f32(const GemmArgs& args);

// Runs fn(begin, end) over [0, count) split into at most `threads` contiguous chunks, each a multiple of `grain`
// (except the last), on std::threads when threads > 1.
template <typename Fn>
void parallel_chunks(int64_t count, int threads, int64_t grain, const Fn& fn);

// Element offset of every matrix of a batched operand [...batch, rows, cols] whose batch dims broadcast to
// `out_batch` (size-1 dims repeat), in row-major order of `out_batch`. Along `grouped_dim` (an index into
// out_batch, -1 for none) output index i reads operand index i / group: grouped-query attention heads.
std::vector<int64_t> batch_offsets(const std::vector<int64_t>& operand_shape, const std::vector<int64_t>& out_batch,
                                   int grouped_dim = -1, int64_t group = 1);

// Threads worth using for `work` multiply-adds (at least 1, at most the machine's cores).
int gemm_threads_for(int64_t work, int max_threads = 0);

template <typename Fn>
void parallel_chunks(int64_t count, int threads, int64_t grain, const Fn& fn) {
  if (count <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t grains = (count + grain - 1) / grain;
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, grains));
  if (workers == 1) {
    fn(int64_t{0}, count);
    return;
  }
  const int64_t per_worker = (grains + workers - 1) / workers * grain;
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) {
    const int64_t begin = w * per_worker;
    const int64_t end = std::min(count, begin + per_worker);
    if (begin < end) pool.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(int64_t{0}, std::min(count, per_worker));
  for (std::thread& t : pool) t.join();
}

}  // namespace npusim::ops
