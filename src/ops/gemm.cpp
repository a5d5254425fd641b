#include "ops/gemm.h"

#include <cstring>

#include "core/cpu_features.h"

namespace npusim::ops {

namespace {

// GCC vector extensions: the same source compiles for the baseline ISA (SSE2 on x86-64) and, in the
// target-attributed clones below, for AVX2+FMA, chosen at run time.
using Vec4 = float __attribute__((vector_size(16)));
using Vec8 = float __attribute__((vector_size(32)));

// The same vector read from or written to any float address.
template <typename V>
using Unaligned [[gnu::aligned(4), gnu::may_alias]] = V;

template <typename V>
[[gnu::always_inline]] inline const Unaligned<V>& at(const float* p) {
  return *reinterpret_cast<const Unaligned<V>*>(p);
}
template <typename V>
[[gnu::always_inline]] inline Unaligned<V>& at(float* p) {
  return *reinterpret_cast<Unaligned<V>*>(p);
}

constexpr int kMr = 6;  // rows of a register tile
constexpr int kNv = 2;  // vectors per register tile row
constexpr int64_t kKc = 256;
constexpr int64_t kMc = 144;
constexpr int64_t kNc = 1024;
constexpr int64_t kMaxNr = 16;

// One kMr x (kNv * lanes) tile of C from packed panels: a_panel holds kc columns of kMr values, b_panel kc rows
// of kNv * lanes values.
template <typename V>
[[gnu::always_inline]] inline void micro_kernel_body(int64_t kc, const float* a_panel, const float* b_panel, float* c,
                                                     int64_t ldc, float alpha, float beta) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  V acc[kMr][kNv] = {};
  for (int64_t p = 0; p < kc; ++p) {
    V b[kNv];
    for (int v = 0; v < kNv; ++v) b[v] = at<V>(b_panel + v * lanes);
    for (int r = 0; r < kMr; ++r) {
      const float a = a_panel[r];
      for (int v = 0; v < kNv; ++v) acc[r][v] += b[v] * a;
    }
    a_panel += kMr;
    b_panel += kNv * lanes;
  }
  for (int r = 0; r < kMr; ++r) {
    float* row = c + r * ldc;
    for (int v = 0; v < kNv; ++v) {
      V result = acc[r][v] * alpha;
      if (beta != 0.0f) result += at<V>(row + v * lanes) * beta;
      at<V>(row + v * lanes) = result;
    }
  }
}

template <typename V>
[[gnu::always_inline]] inline float dot_body(const float* x, const float* y, int64_t n) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  V acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    acc0 += at<V>(x + i) * at<V>(y + i);
    acc1 += at<V>(x + i + lanes) * at<V>(y + i + lanes);
    acc2 += at<V>(x + i + 2 * lanes) * at<V>(y + i + 2 * lanes);
    acc3 += at<V>(x + i + 3 * lanes) * at<V>(y + i + 3 * lanes);
  }
  for (; i + lanes <= n; i += lanes) acc0 += at<V>(x + i) * at<V>(y + i);
  const V acc = (acc0 + acc1) + (acc2 + acc3);
  float sum = 0.0f;
  for (int l = 0; l < lanes; ++l) sum += acc[l];
  for (; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

// y += a * x
template <typename V>
[[gnu::always_inline]] inline void axpy_body(int64_t n, float a, const float* x, float* y) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    at<V>(y + i) += at<V>(x + i) * a;
    at<V>(y + i + lanes) += at<V>(x + i + lanes) * a;
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

void micro_kernel_baseline(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta) {
  micro_kernel_body<Vec4>(kc, a, b, c, ldc, alpha, beta);
}
float dot_baseline(const float* x, const float* y, int64_t n) { return dot_body<Vec4>(x, y, n); }
void axpy_baseline(int64_t n, float a, const float* x, float* y) { axpy_body<Vec4>(n, a, x, y); }

#if defined(__x86_64__) && defined(__GNUC__)
#define NPUSIM_HAVE_AVX2_CLONES 1
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t kc, const float* a, const float* b, float* c,
                                                           int64_t ldc, float alpha, float beta) {
  micro_kernel_body<Vec8>(kc, a, b, c, ldc, alpha, beta);
}
__attribute__((target("avx2,fma"))) float dot_avx2(const float* x, const float* y, int64_t n) {
  return dot_body<Vec8>(x, y, n);
}
__attribute__((target("avx2,fma"))) void axpy_avx2(int64_t n, float a, const float* x, float* y) {
  axpy_body<Vec8>(n, a, x, y);
}
#endif

struct Kernels {
  int64_t nr;  // columns of a register tile
  void (*micro)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta);
  float (*dot)(const float* x, const float* y, int64_t n);
  void (*axpy)(int64_t n, float a, const float* x, float* y);
};

const Kernels& kernels() {
  static const Kernels selected = [] {
#ifdef NPUSIM_HAVE_AVX2_CLONES
    if (cpu_features().avx2 && cpu_features().fma) return Kernels{kNv * 8, micro_kernel_avx2, dot_avx2, axpy_avx2};
#endif
    return Kernels{kNv * 4, micro_kernel_baseline, dot_baseline, axpy_baseline};
  }();
  return selected;
}

int hardware_threads() {
  static const int count = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return count;
}

// Packs rows [row0, row0 + rows) x columns [col0, col0 + kc) of A into kMr-row panels, zero-padding the last.
void pack_a(const GemmArgs& g, int64_t row0, int64_t rows, int64_t col0, int64_t kc, float* out) {
  for (int64_t panel = 0; panel < rows; panel += kMr, out += kMr * kc) {
    const int64_t valid = std::min<int64_t>(kMr, rows - panel);
    const float* src[kMr];
    for (int64_t r = 0; r < kMr; ++r) src[r] = g.a + (row0 + panel + std::min(r, valid - 1)) * g.lda + col0;
    if (valid == kMr) {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < kMr; ++r) out[p * kMr + r] = src[r][p];
    } else {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < kMr; ++r) out[p * kMr + r] = r < valid ? src[r][p] : 0.0f;
    }
  }
}

// Scatters one row of B (cols values) into row p of consecutive NR-column panels of height kc.
template <int64_t NR>
void scatter_b_row(const float* row, int64_t cols, int64_t p, int64_t kc, float* out) {
  int64_t panel = 0;
  for (; panel + NR <= cols; panel += NR, out += NR * kc) std::copy(row + panel, row + panel + NR, out + p * NR);
  if (panel < cols) {
    float* dst = out + p * NR;
    std::copy(row + panel, row + cols, dst);
    std::fill(dst + (cols - panel), dst + NR, 0.0f);
  }
}

// Packs rows [row0, row0 + kc) x columns [col0, col0 + cols) of B into nr-column panels, zero-padding the last.
void pack_b(const GemmArgs& g, int64_t row0, int64_t kc, int64_t col0, int64_t cols, int64_t nr, float* out) {
  if (g.b_transposed) {
    for (int64_t panel = 0; panel < cols; panel += nr, out += nr * kc) {
      const int64_t valid = std::min(nr, cols - panel);
      for (int64_t j = 0; j < nr; ++j) {
        if (j >= valid) {
          for (int64_t p = 0; p < kc; ++p) out[p * nr + j] = 0.0f;
          continue;
        }
        const float* src = g.b + (col0 + panel + j) * g.ldb + row0;
        for (int64_t p = 0; p < kc; ++p) out[p * nr + j] = src[p];
      }
    }
    return;
  }
  thread_local std::vector<float> produced;
  if (g.b_rows) produced.resize(static_cast<size_t>(cols));
  for (int64_t p = 0; p < kc; ++p) {
    const float* row = g.b_rows ? produced.data() : g.b + (row0 + p) * g.ldb + col0;
    if (g.b_rows) (*g.b_rows)(row0 + p, col0, cols, produced.data());
    if (nr == 16) {
      scatter_b_row<16>(row, cols, p, kc, out);
    } else {
      scatter_b_row<8>(row, cols, p, kc, out);
    }
  }
}

// Writes the valid rows x cols corner of a full register tile into C.
void merge_tile(const float* tile, int64_t nr, int64_t rows, int64_t cols, float* c, int64_t ldc, float alpha,
                float beta) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const float product = alpha * tile[r * nr + j];
      c[r * ldc + j] = beta == 0.0f ? product : product + beta * c[r * ldc + j];
    }
}

// The blocked product on one thread: B panels of kKc x kNc, A blocks of kMc x kKc, register tiles kMr x nr.
void gemm_blocked(const GemmArgs& g, const Kernels& kern) {
  const int64_t nr = kern.nr;
  thread_local std::vector<float> a_pack, b_pack;
  a_pack.resize(static_cast<size_t>(kMc * kKc));
  b_pack.resize(static_cast<size_t>(kKc * ((kNc + nr - 1) / nr * nr)));
  float tile[kMr * kMaxNr];

  for (int64_t jc = 0; jc < g.n; jc += kNc) {
    const int64_t nc = std::min(kNc, g.n - jc);
    for (int64_t pc = 0; pc < g.k; pc += kKc) {
      const int64_t kc = std::min(kKc, g.k - pc);
      const float beta = pc == 0 ? g.beta : 1.0f;
      pack_b(g, pc, kc, jc, nc, nr, b_pack.data());
      for (int64_t ic = 0; ic < g.m; ic += kMc) {
        const int64_t mc = std::min(kMc, g.m - ic);
        pack_a(g, ic, mc, pc, kc, a_pack.data());
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const int64_t cols = std::min(nr, nc - jr);
          const float* b_panel = b_pack.data() + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const int64_t rows = std::min<int64_t>(kMr, mc - ir);
            const float* a_panel = a_pack.data() + ir * kc;
            float* c = g.c + (ic + ir) * g.ldc + jc + jr;
            if (rows == kMr && cols == nr) {
              kern.micro(kc, a_panel, b_panel, c, g.ldc, g.alpha, beta);
            } else {
              kern.micro(kc, a_panel, b_panel, tile, nr, 1.0f, 0.0f);
              merge_tile(tile, nr, rows, cols, c, g.ldc, g.alpha, beta);
            }
          }
        }
      }
    }
  }
}

inline void finish(float* c, float sum, float alpha, float beta) {
  *c = beta == 0.0f ? alpha * sum : alpha * sum + beta * *c;
}

// Few rows or few columns: no packing. Rows of A are dotted with contiguous rows of B (transposing B first when it
// is [k, n]), split over whichever of m and n is larger.
void gemm_by_dots(const GemmArgs& g, const Kernels& kern, int threads) {
  std::vector<float> b_columns;
  const float* b = g.b;
  int64_t ldb = g.ldb;
  if (!g.b_transposed) {
    b_columns.resize(static_cast<size_t>(g.n * g.k));
    for (int64_t p = 0; p < g.k; ++p)
      for (int64_t j = 0; j < g.n; ++j) b_columns[static_cast<size_t>(j * g.k + p)] = g.b[p * g.ldb + j];
    b = b_columns.data();
    ldb = g.k;
  }
  auto rows = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = j0; j < j1; ++j)
        finish(g.c + i * g.ldc + j, kern.dot(g.a + i * g.lda, b + j * ldb, g.k), g.alpha, g.beta);
  };
  if (g.n >= g.m)
    parallel_chunks(g.n, threads, 16, [&](int64_t j0, int64_t j1) { rows(0, g.m, j0, j1); });
  else
    parallel_chunks(g.m, threads, 1, [&](int64_t i0, int64_t i1) { rows(i0, i1, 0, g.n); });
}

// Few rows with B as [k, n]: each row of C accumulates scaled rows of B, split over columns.
void gemm_by_axpy(const GemmArgs& g, const Kernels& kern, int threads) {
  parallel_chunks(g.n, threads, 64, [&](int64_t j0, int64_t j1) {
    std::vector<float> acc(static_cast<size_t>(j1 - j0));
    for (int64_t i = 0; i < g.m; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t p = 0; p < g.k; ++p) kern.axpy(j1 - j0, g.a[i * g.lda + p], g.b + p * g.ldb + j0, acc.data());
      for (int64_t j = j0; j < j1; ++j) finish(g.c + i * g.ldc + j, acc[static_cast<size_t>(j - j0)], g.alpha, g.beta);
    }
  });
}

void scale_c(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* row = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) row[j] = g.beta == 0.0f ? 0.0f : g.beta * row[j];
  }
}

}  // namespace

std::vector<int64_t> batch_offsets(const std::vector<int64_t>& operand_shape, const std::vector<int64_t>& out_batch,
                                   int grouped_dim, int64_t group) {
  const size_t rank = out_batch.size();
  const size_t operand_batch_rank = operand_shape.size() - 2;
  // Strides of the operand's batch dims aligned to the right of out_batch; 0 where the operand repeats.
  std::vector<int64_t> strides(rank, 0);
  int64_t stride = operand_shape[operand_batch_rank] * operand_shape[operand_batch_rank + 1];
  for (size_t i = operand_batch_rank; i-- > 0;) {
    const size_t d = i + (rank - operand_batch_rank);
    if (operand_shape[i] != 1) strides[d] = stride;
    stride *= operand_shape[i];
  }
  int64_t count = 1;
  for (int64_t extent : out_batch) count *= extent;
  std::vector<int64_t> offsets(static_cast<size_t>(count));
  std::vector<int64_t> index(rank, 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t offset = 0;
    for (size_t d = 0; d < rank; ++d)
      offset += (static_cast<int>(d) == grouped_dim ? index[d] / group : index[d]) * strides[d];
    offsets[static_cast<size_t>(flat)] = offset;
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < out_batch[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

int gemm_threads_for(int64_t work, int max_threads) {
  constexpr int64_t kWorkPerThread = int64_t{1} << 20;
  const int64_t limit = max_threads > 0 ? std::min(max_threads, hardware_threads()) : hardware_threads();
  return static_cast<int>(std::clamp<int64_t>(work / kWorkPerThread, 1, limit));
}

void gemm_f32(const GemmArgs& args) {
  if (args.m <= 0 || args.n <= 0) return;
  if (args.k <= 0) {
    scale_c(args);
    return;
  }
  const Kernels& kern = kernels();
  const int threads = gemm_threads_for(args.m * args.n * args.k, args.max_threads);
  constexpr int64_t kFewRows = 4;
  const bool few = args.m <= kFewRows || args.n <= kFewRows;

  std::vector<float> produced_b;
  GemmArgs g = args;
  if (few && g.b_rows) {
    // The unpacked paths read B directly: produce all of it first.
    produced_b.resize(static_cast<size_t>(g.k * g.n));
    for (int64_t p = 0; p < g.k; ++p) (*g.b_rows)(p, 0, g.n, produced_b.data() + p * g.n);
    g.b = produced_b.data();
    g.ldb = g.n;
    g.b_rows = nullptr;
  }
  if (g.m <= kFewRows && !g.b_transposed) return gemm_by_axpy(g, kern, threads);
  if (few) return gemm_by_dots(g, kern, threads);

  // Split C into row or column blocks, one per thread, along its longer side.
  if (g.n >= g.m) {
    parallel_chunks(g.n, threads, kern.nr, [&](int64_t j0, int64_t j1) {
      GemmArgs part = g;
      part.n = j1 - j0;
      part.c = g.c + j0;
      GemmRowSource shifted;
      if (g.b_rows) {
        shifted = [&g, j0](int64_t p, int64_t col, int64_t count, float* out) { (*g.b_rows)(p, col + j0, count, out); };
        part.b_rows = &shifted;
      } else {
        part.b = g.b_transposed ? g.b + j0 * g.ldb : g.b + j0;
      }
      gemm_blocked(part, kern);
    });
  } else {
    parallel_chunks(g.m, threads, kMr, [&](int64_t i0, int64_t i1) {
      GemmArgs part = g;
      part.m = i1 - i0;
      part.a = g.a + i0 * g.lda;
      part.c = g.c + i0 * g.ldc;
      gemm_blocked(part, kern);
    });
  }
}

}  // namespace npusim::ops
