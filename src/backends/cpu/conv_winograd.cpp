// Winograd convolution. Transforms work one channel at a time with the tiles as vector lanes: the input rows under
// the tiles are split by phase (column modulo the tile side), so that element k of every tile is one contiguous
// array and both 1-D passes become plain loops over the tiles (the vertical input pass and both output passes over
// all tiles of the channel at once). Transformed inputs V live as alpha^2 matrices [Cin, tiles], the GEMM products
// M as [Cout, tiles] (or [tiles, Cout] when there are few tiles).
#include "backends/cpu/conv_winograd.h"

#include <algorithm>
#include <cstring>

namespace npusim::cpu {

namespace {

// Weight transforms G (alpha x 3) for interpolation points 0, ±1, ±2 (F4) and 0, ±1 (F2).
constexpr double kG4[6][3] = {{1.0 / 4, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                              {0, 0, 1}};
constexpr double kG2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

// 1-D transforms over n lanes: out[i][l] = sum_k T[i][k] * in[k][l], with T = B^T (input) or A^T (output). The
// arrays never overlap; the lane loops take restrict pointers so that they vectorize.
void input_lanes_f4(const float* __restrict d0, const float* __restrict d1, const float* __restrict d2,
                    const float* __restrict d3, const float* __restrict d4, const float* __restrict d5,
                    float* __restrict o0, float* __restrict o1, float* __restrict o2, float* __restrict o3,
                    float* __restrict o4, float* __restrict o5, int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    const float a = d4[l] - 4.0f * d2[l], b = d3[l] - 4.0f * d1[l];
    const float c = d4[l] - d2[l], e = 2.0f * (d3[l] - d1[l]);
    o0[l] = 4.0f * d0[l] - 5.0f * d2[l] + d4[l];
    o1[l] = a + b;
    o2[l] = a - b;
    o3[l] = c + e;
    o4[l] = c - e;
    o5[l] = 4.0f * d1[l] - 5.0f * d3[l] + d5[l];
  }
}

void input_transform_f4(const float* const* in, float* const* out, int64_t n) {
  input_lanes_f4(in[0], in[1], in[2], in[3], in[4], in[5], out[0], out[1], out[2], out[3], out[4], out[5], n);
}

void input_lanes_f2(const float* __restrict d0, const float* __restrict d1, const float* __restrict d2,
                    const float* __restrict d3, float* __restrict o0, float* __restrict o1, float* __restrict o2,
                    float* __restrict o3, int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    o0[l] = d0[l] - d2[l];
    o1[l] = d1[l] + d2[l];
    o2[l] = d2[l] - d1[l];
    o3[l] = d1[l] - d3[l];
  }
}

void input_transform_f2(const float* const* in, float* const* out, int64_t n) {
  input_lanes_f2(in[0], in[1], in[2], in[3], out[0], out[1], out[2], out[3], n);
}

void output_lanes_f4(const float* __restrict m0, const float* __restrict m1, const float* __restrict m2,
                     const float* __restrict m3, const float* __restrict m4, const float* __restrict m5,
                     float* __restrict y0, float* __restrict y1, float* __restrict y2, float* __restrict y3,
                     int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    const float s12 = m1[l] + m2[l], d12 = m1[l] - m2[l], s34 = m3[l] + m4[l], d34 = m3[l] - m4[l];
    y0[l] = m0[l] + s12 + s34;
    y1[l] = d12 + 2.0f * d34;
    y2[l] = s12 + 4.0f * s34;
    y3[l] = d12 + 8.0f * d34 + m5[l];
  }
}

void output_transform_f4(const float* const* in, float* const* out, int64_t n) {
  output_lanes_f4(in[0], in[1], in[2], in[3], in[4], in[5], out[0], out[1], out[2], out[3], n);
}

void output_lanes_f2(const float* __restrict m0, const float* __restrict m1, const float* __restrict m2,
                     const float* __restrict m3, float* __restrict y0, float* __restrict y1, int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    y0[l] = m0[l] + m1[l] + m2[l];
    y1[l] = m1[l] - m2[l] - m3[l];
  }
}

void output_transform_f2(const float* const* in, float* const* out, int64_t n) {
  output_lanes_f2(in[0], in[1], in[2], in[3], out[0], out[1], n);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bias, residual, activation and the store of one output row segment of `count` values at element `at`.
void finish_row(float* row, int64_t count, int64_t channel, int64_t at, const GemmOutput& out, const GemmEpilogue& e,
                float* scratch) {
  if (e.bias) {
    const float bias = e.bias[channel];
    for (int64_t j = 0; j < count; ++j) row[j] += bias;
  }
  if (e.residual) {
    const std::byte* src = e.residual + static_cast<size_t>(at) * elem_size(e.residual_elem);
    const float* add = reinterpret_cast<const float*>(src);
    if (e.residual_elem != Elem::F32) {
      to_float(src, e.residual_elem, scratch, count);
      add = scratch;
    }
    for (int64_t j = 0; j < count; ++j) row[j] += add[j];
  }
  if (e.activation == GemmActivation::Relu) {
    for (int64_t j = 0; j < count; ++j) row[j] = row[j] < 0.0f ? 0.0f : row[j];
  } else if (e.activation == GemmActivation::Clamp) {
    for (int64_t j = 0; j < count; ++j) row[j] = row[j] < e.low ? e.low : (row[j] > e.high ? e.high : row[j]);
  }
  std::byte* dst = out.data + static_cast<size_t>(at) * elem_size(out.elem);
  if (out.elem == Elem::F32)
    std::memcpy(dst, row, static_cast<size_t>(count) * sizeof(float));
  else
    from_float(row, dst, out.elem, count);
}

}  // namespace

namespace {

// F4 for larger images, F2 (fewer wasted tile rows and columns, smaller transformed weights) for small ones.
int tile_side(const WinogradConv::Geometry& g) { return g.out_h * g.out_w >= 144 ? 4 : 2; }

}  // namespace

bool WinogradConv::suitable(const Geometry& g) {
  // The transformed inputs and products of a whole sample live in the workspace: keep it bounded.
  constexpr int64_t kMaxWorkspaceBytes = int64_t{64} << 20;
  const int64_t m = tile_side(g), tiles = ceil_div(g.out_h, m) * ceil_div(g.out_w, m);
  const int64_t workspace = (m + 2) * (m + 2) * tiles * (g.in_channels + g.out_channels) * 4;
  return g.in_channels >= 16 && g.out_channels >= 16 && g.out_h * g.out_w >= 16 && g.pad_h <= 2 && g.pad_w <= 2 &&
         workspace <= kMaxWorkspaceBytes;
}

WinogradConv::WinogradConv(const Geometry& g, const std::byte* weight, Elem weight_elem, ScratchSpace& scratch)
    : g_(g) {
  tile_ = tile_side(g);
  const int alpha = tile_ + 2;
  tiles_h_ = ceil_div(g.out_h, tile_);
  tiles_w_ = ceil_div(g.out_w, tile_);
  const int64_t tiles = tiles_h_ * tiles_w_, cin = g.in_channels, cout = g.out_channels;
  const double waste_as_columns = static_cast<double>(ceil_div(tiles, kGemmTileCols) * kGemmTileCols) / tiles;
  const double waste_as_rows = static_cast<double>(ceil_div(tiles, kGemmTileRows) * kGemmTileRows) / tiles;
  // Few tiles: rows of the GEMM waste less padding than its wider columns. Many tiles: the output transform reads
  // the products far faster as [Cout, tiles].
  tiles_as_rows_ = tiles < kGemmTileCols && waste_as_rows + 0.05 < waste_as_columns;

  // U[xi][o][c] = (G w G^T)[i][j], computed in double.
  std::vector<float> transformed(static_cast<size_t>(alpha * alpha * cout * cin));
  const double(*gm)[3] = tile_ == 4 ? kG4 : kG2;
  // Per output channel, over all input channels at once (contiguous, vectorizable): taps [9][cin] as doubles, then
  // G w -> [alpha][3][cin], then (G w) G^T -> the alpha^2 planes.
  std::vector<float> row(static_cast<size_t>(cin * 9));
  std::vector<double> taps(static_cast<size_t>(9 * cin)), gw(static_cast<size_t>(alpha * 3 * cin));
  for (int64_t o = 0; o < cout; ++o) {
    to_float(weight + static_cast<size_t>(o * cin * 9) * elem_size(weight_elem), weight_elem, row.data(), cin * 9);
    for (int64_t c = 0; c < cin; ++c)
      for (int t = 0; t < 9; ++t) taps[static_cast<size_t>(t * cin + c)] = row[static_cast<size_t>(c * 9 + t)];
    for (int i = 0; i < alpha; ++i)
      for (int k = 0; k < 3; ++k) {
        double* out = gw.data() + (i * 3 + k) * cin;
        const double *w0 = taps.data() + k * cin, *w1 = taps.data() + (3 + k) * cin, *w2 = taps.data() + (6 + k) * cin;
        for (int64_t c = 0; c < cin; ++c) out[c] = gm[i][0] * w0[c] + gm[i][1] * w1[c] + gm[i][2] * w2[c];
      }
    for (int i = 0; i < alpha; ++i)
      for (int j = 0; j < alpha; ++j) {
        float* out = transformed.data() + ((i * alpha + j) * cout + o) * cin;
        const double *g0 = gw.data() + (i * 3) * cin, *g1 = g0 + cin, *g2 = g1 + cin;
        for (int64_t c = 0; c < cin; ++c)
          out[c] = static_cast<float>(g0[c] * gm[j][0] + g1[c] * gm[j][1] + g2[c] * gm[j][2]);
      }
  }
  for (int xi = 0; xi < alpha * alpha; ++xi) {
    const auto* u = reinterpret_cast<const std::byte*>(transformed.data() + static_cast<size_t>(xi) * cout * cin);
    weights_.push_back(tiles_as_rows_ ? PackedMatrix::pack(GemmSide::B, u, Elem::F32, cin, cout, cin, true)
                                      : PackedMatrix::pack(GemmSide::A, u, Elem::F32, cout, cin));
  }
  gemm_ = tiles_as_rows_
              ? PackedGemm({.m = tiles, .n = cout, .k = cin, .b_prepacked = true, .max_threads = 1}, scratch)
              : PackedGemm({.m = cout, .n = tiles, .k = cin, .a_prepacked = true, .max_threads = 1}, scratch);
  const int64_t input_floats = 2 * alpha * tile_ * tiles_h_ * (tiles_w_ + 1);
  const int64_t output_floats = (alpha * alpha + alpha * tile_ + tile_ * tile_) * tiles + 2 * (tiles_w_ * tile_ + 16);
  scratch.reserve_per_worker(static_cast<size_t>(std::max(input_floats, output_floats)) * sizeof(float));
}

int64_t WinogradConv::workspace_floats() const {
  const int64_t points = (tile_ + 2) * (tile_ + 2), tiles = tiles_h_ * tiles_w_;
  return points * tiles * (g_.in_channels + g_.out_channels);
}

void WinogradConv::run(const float* input, float* workspace, const GemmOutput& out, const GemmEpilogue& epilogue,
                       ThreadPool& pool, const ScratchSpace& scratch) const {
  const int m = tile_, alpha = tile_ + 2, points = alpha * alpha;
  const int64_t cin = g_.in_channels, cout = g_.out_channels, tw = tiles_w_, tiles = tiles_h_ * tiles_w_;
  const int64_t height = g_.height, width = g_.width, row = tw + 1;
  float* v = workspace;                        // [points][cin][tiles]
  float* products = v + points * cin * tiles;  // [points][cout][tiles] or [points][tiles][cout]
  const auto input_1d = m == 4 ? input_transform_f4 : input_transform_f2;
  const auto output_1d = m == 4 ? output_transform_f4 : output_transform_f2;

  // Input tiles, one channel per step: the vertical pass runs over every row of tiles at once.
  const int64_t lanes = tiles_h_ * row;
  pool.parallel_for(cin, 1, [&](int64_t begin, int64_t end, int worker) {
    float* phases = scratch.worker_as<float>(worker);  // [alpha rows][m phases][tiles_h][row]
    float* rows = phases + alpha * m * lanes;          // the same after the vertical pass
    // What lies outside the image stays zero: every channel writes the same inside positions.
    std::fill(phases, rows, 0.0f);
    // Per phase: the tiles l whose column l * m + ph - pad lies inside the image.
    int64_t first[4], last[4];
    for (int ph = 0; ph < m; ++ph) {
      const int64_t shift = ph - g_.pad_w;
      first[ph] = std::min(row, shift >= 0 ? 0 : ceil_div(-shift, m));
      last[ph] = std::clamp<int64_t>(ceil_div(width - shift, m), first[ph], row);
    }
    for (int64_t c = begin; c < end; ++c) {
      const float* plane = input + c * height * width;
      for (int64_t ty = 0; ty < tiles_h_; ++ty)
        for (int k = 0; k < alpha; ++k) {
          const int64_t iy = ty * m - g_.pad_h + k;
          if (iy < 0 || iy >= height) continue;
          for (int ph = 0; ph < m; ++ph) {
            float* q = phases + (k * m + ph) * lanes + ty * row;
            const float* src = plane + iy * width + ph - g_.pad_w;
            for (int64_t l = first[ph]; l < last[ph]; ++l) q[l] = src[l * m];
          }
        }
      const float* in[6];
      float* outs[6];
      for (int ph = 0; ph < m; ++ph) {
        for (int k = 0; k < alpha; ++k) {
          in[k] = phases + (k * m + ph) * lanes;
          outs[k] = rows + (k * m + ph) * lanes;
        }
        input_1d(in, outs, lanes);
      }
      for (int64_t ty = 0; ty < tiles_h_; ++ty)
        for (int i = 0; i < alpha; ++i) {
          for (int k = 0; k < alpha; ++k) {
            in[k] = rows + (i * m + k % m) * lanes + ty * row + k / m;
            outs[k] = v + ((i * alpha + k) * cin + c) * tiles + ty * tw;
          }
          input_1d(in, outs, tw);
        }
    }
  });

  // One independent product per transform point.
  pool.parallel_for(points, 1, [&](int64_t begin, int64_t end, int worker) {
    for (int64_t xi = begin; xi < end; ++xi) {
      const auto* vx = reinterpret_cast<const std::byte*>(v + xi * cin * tiles);
      auto* px = reinterpret_cast<std::byte*>(products + xi * cout * tiles);
      if (tiles_as_rows_)
        gemm_.run_on_worker(StridedOperand{vx, Elem::F32, tiles, true}, &weights_[static_cast<size_t>(xi)],
                            {px, Elem::F32, cout}, {}, worker, scratch);
      else
        gemm_.run_on_worker(&weights_[static_cast<size_t>(xi)], StridedOperand{vx, Elem::F32, tiles},
                            {px, Elem::F32, tiles}, {}, worker, scratch);
    }
  });

  // Output tiles, one channel per step, both passes over all tiles at once.
  const int64_t pixels = g_.out_h * g_.out_w;
  pool.parallel_for(cout, 1, [&](int64_t begin, int64_t end, int worker) {
    float* gathered = scratch.worker_as<float>(worker);              // [points][tiles], products as [tiles, Cout]
    float* half = gathered + (tiles_as_rows_ ? points * tiles : 0);  // [alpha][m][tiles]
    float* done = half + alpha * m * tiles;                          // [m][m][tiles]
    float* line = done + m * m * tiles;                              // one output row
    float* spare = line + tw * m + 16;
    for (int64_t o = begin; o < end; ++o) {
      const float* mt[36];
      for (int xi = 0; xi < points; ++xi) {
        if (!tiles_as_rows_) {
          mt[xi] = products + (xi * cout + o) * tiles;
          continue;
        }
        float* dst = gathered + xi * tiles;
        const float* src = products + xi * tiles * cout + o;
        for (int64_t t = 0; t < tiles; ++t) dst[t] = src[t * cout];
        mt[xi] = dst;
      }
      const float* in[6];
      float* outs[6];
      for (int i = 0; i < alpha; ++i) {
        for (int j = 0; j < alpha; ++j) in[j] = mt[i * alpha + j];
        for (int r = 0; r < m; ++r) outs[r] = half + (i * m + r) * tiles;
        output_1d(in, outs, tiles);
      }
      for (int r = 0; r < m; ++r) {
        for (int i = 0; i < alpha; ++i) in[i] = half + (i * m + r) * tiles;
        for (int q = 0; q < m; ++q) outs[q] = done + (q * m + r) * tiles;
        output_1d(in, outs, tiles);
      }
      for (int64_t ty = 0; ty < tiles_h_; ++ty)
        for (int q = 0; q < m; ++q) {
          const int64_t oy = ty * m + q;
          if (oy >= g_.out_h) break;
          for (int r = 0; r < m; ++r) {
            const float* y = done + (q * m + r) * tiles + ty * tw;
            for (int64_t l = 0; l < tw; ++l) line[l * m + r] = y[l];
          }
          finish_row(line, g_.out_w, o, o * pixels + oy * g_.out_w, out, epilogue, spare);
        }
    }
  });
}

}  // namespace npusim::cpu
