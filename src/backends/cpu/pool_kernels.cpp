// max_pool2d over the last two dims, one plane per step: a vertical pass takes the max of the window's input rows
// (contiguous, vectorizable), a horizontal pass the max over the window's columns of that row. NaN wins, as in
// PyTorch; a window with no tap inside the input gives -inf. Output sizes come from the inferred output shape (so
// ceil_mode needs nothing special).
#include <array>
#include <cmath>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NPUSIM_POOL_X86 1
#endif

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "ops/pool_window.h"

namespace npusim::cpu {

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

struct MaxPoolPlan : ops::PoolWindow {
  int64_t planes = 0;
  std::array<int64_t, 2> in{1, 1}, out{1, 1};
  Buffer x, y;
};

// The larger of the two, or `value` when it is NaN; branch-free so that loops over it vectorize.
inline float nan_max(float best, float value) {
  const float larger = value > best ? value : best;
  return value != value ? value : larger;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#ifdef NPUSIM_POOL_X86
bool cpu_has_avx2() { return cpu_features().avx2; }

// The larger of a and b per lane, NaN when either is NaN.
__attribute__((target("avx2"), always_inline)) inline __m256 nan_max8(__m256 a, __m256 b) {
  return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

// Lanes 0, 2, ..., 14 (even) or 1, 3, ..., 15 (odd) of the 16 floats at src.
template <int Offset>
__attribute__((target("avx2"), always_inline)) inline __m256 every_other(const float* src) {
  const __m256 lo = _mm256_loadu_ps(src), hi = _mm256_loadu_ps(src + 8);
  constexpr int kPick = Offset == 0 ? _MM_SHUFFLE(2, 0, 2, 0) : _MM_SHUFFLE(3, 1, 3, 1);
  const __m256 picked = _mm256_shuffle_ps(lo, hi, kPick);  // x0 x2 y0 y2 | x4 x6 y4 y6 (for the even lanes)
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(picked), _MM_SHUFFLE(3, 1, 2, 0)));
}

// dst[i] = max(window[2i], window[2i + 1], window[2i + 2]) for i < count, eight at a time while the reads stay
// within window[0, span); the first index not written.
__attribute__((target("avx2"))) int64_t max3_stride2_avx2(const float* window, int64_t count, int64_t span,
                                                          float* dst) {
  int64_t i = 0;
  for (; i + 8 <= count && 2 * i + 18 <= span; i += 8) {
    const float* w = window + 2 * i;
    const __m256 left = every_other<0>(w), middle = every_other<1>(w), right = every_other<0>(w + 2);
    _mm256_storeu_ps(dst + i, nan_max8(nan_max8(left, middle), right));
  }
  return i;
}

// row[i] = the NaN-aware max of sources[0..count)[i] for i < width, in one pass.
__attribute__((target("avx2"))) void rows_max_avx2(const float* const* sources, int64_t count, int64_t width,
                                                   float* row) {
  int64_t i = 0;
  for (; i + 8 <= width; i += 8) {
    __m256 best = _mm256_set1_ps(kNegativeInfinity);
    for (int64_t r = 0; r < count; ++r) best = nan_max8(best, _mm256_loadu_ps(sources[r] + i));
    _mm256_storeu_ps(row + i, best);
  }
  for (; i < width; ++i) {
    float best = kNegativeInfinity;
    for (int64_t r = 0; r < count; ++r) best = nan_max(best, sources[r][i]);
    row[i] = best;
  }
}
#endif

// One plane: y[out_h, out_w] from x[in_h, in_w]; `row` holds in_w floats, `sources` kernel_h pointers.
void max_pool_plane(const MaxPoolPlan& p, const float* x, float* y, float* row, const float** sources) {
  const int64_t height = p.in[0], width = p.in[1], out_w = p.out[1];
  const int64_t sx = p.stride[1], dx = p.dilation[1], px = p.pad[1], taps_x = p.kernel[1];
  // Output columns whose every tap lies inside the row.
  const int64_t inner_begin = std::min(out_w, ceil_div(px, sx));
  const int64_t last_reach = (taps_x - 1) * dx - px;  // column of the last tap of output column 0
  const int64_t inner_end =
      std::clamp<int64_t>(width - 1 - last_reach >= 0 ? (width - 1 - last_reach) / sx + 1 : 0, inner_begin, out_w);
#ifdef NPUSIM_POOL_X86
  const bool three_by_two = taps_x == 3 && sx == 2 && dx == 1 && cpu_has_avx2();  // ResNet's stem
#endif
  for (int64_t oy = 0; oy < p.out[0]; ++oy) {
    int64_t count = 0;  // the window's rows inside the input
    for (int64_t ky = 0; ky < p.kernel[0]; ++ky) {
      const int64_t iy = oy * p.stride[0] - p.pad[0] + ky * p.dilation[0];
      if (iy >= 0 && iy < height) sources[count++] = x + iy * width;
    }
#ifdef NPUSIM_POOL_X86
    if (cpu_has_avx2()) {
      rows_max_avx2(sources, count, width, row);
    } else
#endif
    {
      std::fill(row, row + width, kNegativeInfinity);
      for (int64_t ky = 0; ky < p.kernel[0]; ++ky) {
        const int64_t iy = oy * p.stride[0] - p.pad[0] + ky * p.dilation[0];
        if (iy < 0 || iy >= height) continue;
        const float* src = x + iy * width;
        for (int64_t ix = 0; ix < width; ++ix) row[ix] = nan_max(row[ix], src[ix]);
      }
    }
    float* dst = y + oy * out_w;
    auto edge = [&](int64_t ox) {
      float best = kNegativeInfinity;
      for (int64_t kx = 0; kx < taps_x; ++kx) {
        const int64_t ix = ox * sx - px + kx * dx;
        if (ix >= 0 && ix < width) best = nan_max(best, row[ix]);
      }
      dst[ox] = best;
    };
    for (int64_t ox = 0; ox < inner_begin; ++ox) edge(ox);
    int64_t vectorized_end = inner_begin;
#ifdef NPUSIM_POOL_X86
    if (three_by_two) {
      const float* window = row + inner_begin * sx - px;
      vectorized_end += max3_stride2_avx2(window, inner_end - inner_begin, row + width - window, dst + inner_begin);
    }
#endif
    for (int64_t ox = vectorized_end; ox < inner_end; ++ox) {
      const float* window = row + ox * sx - px;
      float best = window[0];
      for (int64_t kx = 1; kx < taps_x; ++kx) best = nan_max(best, window[kx * dx]);
      dst[ox] = best;
    }
    for (int64_t ox = inner_end; ox < out_w; ++ox) edge(ox);
  }
}

std::optional<Kernel> max_pool2d(const KernelContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  MaxPoolPlan p;
  p.x = ctx.inputs[0];
  p.y = ctx.outputs[0];
  if (!is_float_elem(p.x.elem) || !is_float_elem(p.y.elem)) return std::nullopt;
  const Shape& in = p.x.meta.shape;
  const Shape& out = p.y.meta.shape;
  if (in.size() < 3 || in.size() > 4 || out.size() != in.size()) return std::nullopt;
  const std::optional<ops::PoolWindow> window = ops::pool_window(ctx.node.attrs, true);
  if (!window) return std::nullopt;
  static_cast<ops::PoolWindow&>(p) = *window;
  p.in = {in[in.size() - 2], in.back()};
  p.out = {out[out.size() - 2], out.back()};
  p.planes = shape_numel(Shape(in.begin(), in.end() - 2));
  if (shape_numel(Shape(out.begin(), out.end() - 2)) != p.planes) return std::nullopt;
  const int64_t in_plane = p.in[0] * p.in[1], out_plane = p.out[0] * p.out[1];
  // Per worker: the plane converted to fp32 (when stored otherwise), the output plane, one row of maxima, the
  // window's row pointers.
  const int64_t row_floats = (p.in[1] + 15) / 16 * 16;
  ctx.scratch.reserve_per_worker(floats_bytes(in_plane + out_plane + row_floats + 32) +
                                 static_cast<size_t>(p.kernel[0]) * sizeof(const float*));
  Kernel kernel_fn;
  kernel_fn.run = [p, in_plane, out_plane, row_floats, pool = &ctx.pool, scratch = &ctx.scratch] {
    if (p.planes == 0 || out_plane == 0) return;
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(in_plane, 1));
    pool->parallel_for(p.planes, grain, [&](int64_t begin, int64_t end, int worker) {
      float* converted = scratch->worker_as<float>(worker);
      float* result = converted + (in_plane + 15) / 16 * 16;
      float* row = result + (out_plane + 15) / 16 * 16;
      auto** sources = reinterpret_cast<const float**>(row + row_floats);
      for (int64_t plane = begin; plane < end; ++plane) {
        const float* x = float_data(p.x.data + static_cast<size_t>(plane * in_plane) * elem_size(p.x.elem), p.x.elem,
                                    in_plane, converted);
        float* y = p.y.elem == Elem::F32 ? p.y.as<float>() + plane * out_plane : result;
        max_pool_plane(p, x, y, row, sources);
        store_floats(y, p.y.data + static_cast<size_t>(plane * out_plane) * elem_size(p.y.elem), p.y.elem, out_plane);
      }
    });
  };
  return kernel_fn;
}

}  // namespace

void add_pool_kernels(KernelTable& table) { table.add("max_pool2d", max_pool2d); }

}  // namespace npusim::cpu
