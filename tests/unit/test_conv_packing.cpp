// The packed GEMM's convolution-shaped paths against double-precision references, every element: the patch matrix
// packed straight from the input (row runs, hardware gathers, permutes) and from the input split by stride phases, the
// phase split itself, and products whose last B panel holds a single column. Operand values are multiples of 1/4 in
// [-1.25, 1.25], so every sum is exact in fp32 and results must match exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/packed_gemm.h"
#include "npusim/error.h"
#include "unit/patch_matrix.h"

namespace npusim::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float quarter(int64_t seed) { return static_cast<float>((seed * 7919 + 13) % 11 - 5) * 0.25f; }

std::vector<float> quarters(int64_t count, int64_t seed) {
  std::vector<float> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) v[i] = quarter(static_cast<int64_t>(i) + seed);
  return v;
}

// Each kernel family this CPU has, forced in turn.
std::vector<GemmKernelChoice> kernels() {
  std::vector<GemmKernelChoice> all;
  for (GemmKernelChoice k : {GemmKernelChoice::Portable, GemmKernelChoice::Avx2, GemmKernelChoice::Avx512})
    if (gemm_kernel_supported(k)) all.push_back(k);
  return all;
}

class ForcedKernel {
 public:
  explicit ForcedKernel(GemmKernelChoice choice) { set_gemm_kernel_choice(choice); }
  ~ForcedKernel() { set_gemm_kernel_choice(GemmKernelChoice::Best); }
  ForcedKernel(const ForcedKernel&) = delete;
  ForcedKernel& operator=(const ForcedKernel&) = delete;
};

struct ConvShape {
  int64_t channels, height, width, kh, kw, sh, sw, ph, pw, dh, dw;
};

std::string describe(const ConvShape& g) {
  return std::to_string(g.channels) + "x" + std::to_string(g.height) + "x" + std::to_string(g.width) + " kernel " +
         std::to_string(g.kh) + "x" + std::to_string(g.kw) + " stride " + std::to_string(g.sh) + "," +
         std::to_string(g.sw) + " pad " + std::to_string(g.ph) + "," + std::to_string(g.pw) + " dilation " +
         std::to_string(g.dh) + "," + std::to_string(g.dw);
}

Im2colOperand operand(const ConvShape& g, const float* input) {
  Im2colOperand s{input, g.channels, g.height, g.width, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, 0, 0};
  s.out_h = (g.height + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  s.out_w = (g.width + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  return s;
}

// Odd sizes, every stride from 1 to 3, padding, dilation, a single channel and empty inputs; output rows shorter
// than a panel, between one and four panels, and longer (the packing paths switch at four panels); panels of one to
// four runs of output pixels, and of more (AVX-512 packs up to four runs a panel with permutes, more with gathers).
const std::vector<ConvShape> kShapes = {
    {3, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1},   {2, 8, 7, 3, 2, 2, 1, 0, 1, 1, 1},   {4, 10, 10, 3, 3, 2, 2, 2, 2, 2, 2},
    {1, 5, 40, 1, 5, 1, 3, 0, 2, 1, 1},   {5, 14, 14, 1, 1, 2, 2, 0, 0, 1, 1}, {3, 15, 15, 3, 3, 2, 2, 1, 1, 1, 1},
    {3, 11, 141, 7, 7, 2, 2, 3, 3, 1, 1}, {4, 6, 131, 1, 1, 2, 2, 0, 0, 1, 1}, {2, 9, 200, 3, 3, 3, 3, 1, 1, 1, 1},
    {2, 7, 150, 3, 5, 2, 2, 2, 1, 2, 2},  {1, 3, 129, 2, 2, 2, 2, 0, 0, 1, 1}, {3, 5, 133, 3, 3, 1, 2, 1, 1, 1, 1},
    {0, 6, 130, 3, 3, 2, 2, 1, 1, 1, 1},  {3, 9, 56, 3, 3, 2, 2, 1, 1, 1, 1},  {2, 5, 6, 3, 3, 2, 2, 1, 1, 1, 1},
};

// C = A [m, k] (prepacked) times the patches of `s` plus a row bias and a residual, then ReLU, into rows of ldc
// n + 3 filled with NaN first; every element against double sums, and the row padding left NaN.
void check_product(const ConvShape& g, const Im2colOperand& s, const std::vector<float>& patches, int threads,
                   const std::string& label) {
  const int64_t m = 13, n = s.out_h * s.out_w, k = g.channels * g.kh * g.kw, ldc = n + 3;
  const std::vector<float> a = quarters(m * k, 9), bias = quarters(m, 4), residual = quarters(m * n, 5);
  const PackedMatrix packed =
      PackedMatrix::pack(GemmSide::A, reinterpret_cast<const std::byte*>(a.data()), Elem::F32, m, k);
  ThreadPool pool(threads);
  ScratchSpace scratch;
  PackedGemm gemm({.m = m, .n = n, .k = k, .a_prepacked = true}, scratch);
  scratch.allocate(pool.size());
  std::vector<float> c(static_cast<size_t>(m * ldc), kNaN);
  GemmEpilogue epilogue;
  epilogue.bias = bias.data();
  epilogue.residual = reinterpret_cast<const std::byte*>(residual.data());
  epilogue.residual_ld = n;
  epilogue.activation = GemmActivation::Relu;
  gemm.run(&packed, s, {reinterpret_cast<std::byte*>(c.data()), Elem::F32, ldc}, epilogue, pool, scratch);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p)
        sum += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * patches[static_cast<size_t>(p * n + j)];
      sum += bias[static_cast<size_t>(i)];
      sum += residual[static_cast<size_t>(i * n + j)];
      ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], static_cast<float>(std::max(sum, 0.0)))
          << label << " at " << i << "," << j;
    }
    for (int64_t j = n; j < ldc; ++j) ASSERT_TRUE(std::isnan(c[static_cast<size_t>(i * ldc + j)])) << label;
  }
}

TEST(ConvPacking, PatchesFromTheInputMatchExplicitPatches) {
  for (GemmKernelChoice kernel : kernels()) {
    ForcedKernel forced(kernel);
    for (const ConvShape& g : kShapes) {
      const std::vector<float> input = quarters(g.channels * g.height * g.width, 2);
      const Im2colOperand s = operand(g, input.data());
      const std::vector<float> patches = test::explicit_patch_matrix(s);
      for (int threads : {1, 2}) {
        check_product(g, s, patches, threads,
                      describe(g) + " kernel " + std::to_string(static_cast<int>(kernel)) + " threads " +
                          std::to_string(threads));
        if (testing::Test::HasFailure()) return;
      }
    }
  }
}

// Phases NaN-filled first; the split must write every value of every phase a tap reads.
std::vector<float> split(const Im2colOperand& s, ThreadPool* pool) {
  std::vector<float> phases(static_cast<size_t>(im2col_phase_floats(s)), kNaN);
  split_im2col_phases(s, phases.data(), pool);
  return phases;
}

TEST(ConvPacking, PatchesFromPhasesMatchExplicitPatches) {
  for (GemmKernelChoice kernel : kernels()) {
    ForcedKernel forced(kernel);
    for (const ConvShape& g : kShapes) {
      const std::vector<float> input = quarters(g.channels * g.height * g.width, 3);
      Im2colOperand s = operand(g, input.data());
      const std::vector<float> patches = test::explicit_patch_matrix(s);
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        const std::vector<float> phases = split(s, threads == 2 ? &pool : nullptr);
        s.phases = phases.data();
        check_product(g, s, patches, threads,
                      "phases " + describe(g) + " kernel " + std::to_string(static_cast<int>(kernel)) + " threads " +
                          std::to_string(threads));
        if (testing::Test::HasFailure()) return;
      }
    }
  }
}

// Phase (ry, rx) of channel c, row qy, column qx is the padded input at (qy * sh + ry, qx * sw + rx); phases no tap
// reads are left alone.
TEST(ConvPacking, PhasesHoldThePaddedInput) {
  for (GemmKernelChoice kernel : kernels()) {
    ForcedKernel forced(kernel);
    for (const ConvShape& g : kShapes) {
      const std::vector<float> input = quarters(g.channels * g.height * g.width, 7);
      const Im2colOperand s = operand(g, input.data());
      const std::vector<float> phases = split(s, nullptr);
      const int64_t rows = (g.height + 2 * g.ph + g.sh - 1) / g.sh, cols = (g.width + 2 * g.pw + g.sw - 1) / g.sw;
      ASSERT_EQ(im2col_phase_floats(s), g.channels * g.sh * g.sw * rows * cols) << describe(g);
      const auto read = [](int64_t phase, int64_t taps, int64_t dilation, int64_t stride) {
        for (int64_t t = 0; t < taps; ++t)
          if (t * dilation % stride == phase) return true;
        return false;
      };
      for (int64_t c = 0; c < g.channels; ++c)
        for (int64_t ry = 0; ry < g.sh; ++ry)
          for (int64_t rx = 0; rx < g.sw; ++rx)
            for (int64_t qy = 0; qy < rows; ++qy)
              for (int64_t qx = 0; qx < cols; ++qx) {
                const float value =
                    phases[static_cast<size_t>((((c * g.sh + ry) * g.sw + rx) * rows + qy) * cols + qx)];
                if (!read(ry, g.kh, g.dh, g.sh) || !read(rx, g.kw, g.dw, g.sw)) {
                  ASSERT_TRUE(std::isnan(value)) << describe(g) << " wrote an unread phase";
                  continue;
                }
                const int64_t iy = qy * g.sh + ry - g.ph, ix = qx * g.sw + rx - g.pw;
                const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
                ASSERT_EQ(value, inside ? input[static_cast<size_t>((c * g.height + iy) * g.width + ix)] : 0.0f)
                    << describe(g) << " channel " << c << " phase " << ry << "," << rx << " at " << qy << "," << qx;
              }
    }
  }
}

TEST(ConvPacking, PhasesPayOnlyForStridedLongRows) {
  const auto pays = [](const ConvShape& g) { return im2col_phases_pay(operand(g, nullptr)); };
  EXPECT_TRUE(pays({3, 224, 224, 7, 7, 2, 2, 3, 3, 1, 1}));   // ResNet's stem: rows of 112
  EXPECT_FALSE(pays({128, 56, 56, 3, 3, 2, 2, 1, 1, 1, 1}));  // rows of 28: the gathers are faster
  EXPECT_FALSE(pays({64, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1}));   // no stride: nothing to split
}

// Products whose last B panel holds one column (n = 16 q + 1), as a 7x7 image's 49 pixels leave: depths that are
// not multiples of the eight steps the column kernel takes at once, and deep enough for several depth blocks.
TEST(ConvPacking, SingleLastColumnMatchesDoubleSums) {
  for (GemmKernelChoice kernel : kernels()) {
    ForcedKernel forced(kernel);
    for (int64_t n : {1, 17, 49})
      for (int64_t k : {1, 3, 8, 9, 31, 517, 1100})
        for (int64_t m : {1, 6, 13})
          for (int threads : {1, 2}) {
            const std::vector<float> a = quarters(m * k, 1), b = quarters(k * n, 2), bias = quarters(m, 3);
            const PackedMatrix packed =
                PackedMatrix::pack(GemmSide::A, reinterpret_cast<const std::byte*>(a.data()), Elem::F32, m, k);
            ThreadPool pool(threads);
            ScratchSpace scratch;
            PackedGemm gemm({.m = m, .n = n, .k = k, .a_prepacked = true}, scratch);
            scratch.allocate(pool.size());
            const int64_t ldc = n + 1;
            std::vector<float> c(static_cast<size_t>(m * ldc), kNaN);
            GemmEpilogue epilogue;
            epilogue.bias = bias.data();
            gemm.run(&packed, StridedOperand{reinterpret_cast<const std::byte*>(b.data()), Elem::F32, n},
                     {reinterpret_cast<std::byte*>(c.data()), Elem::F32, ldc}, epilogue, pool, scratch);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double sum = bias[static_cast<size_t>(i)];
                for (int64_t p = 0; p < k; ++p)
                  sum += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(p * n + j)];
                ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], static_cast<float>(sum))
                    << "m " << m << " n " << n << " k " << k << " threads " << threads << " kernel "
                    << static_cast<int>(kernel) << " at " << i << "," << j;
              }
              ASSERT_TRUE(std::isnan(c[static_cast<size_t>(i * ldc + n)])) << "padding written";
            }
          }
  }
}

TEST(ConvPacking, MismatchedPatchesAreErrors) {
  const ConvShape g{3, 11, 141, 7, 7, 2, 2, 3, 3, 1, 1};
  const std::vector<float> input = quarters(g.channels * g.height * g.width, 1);
  Im2colOperand s = operand(g, input.data());
  const std::vector<float> phases = split(s, nullptr);
  s.phases = phases.data();
  const int64_t k = g.channels * g.kh * g.kw, n = s.out_h * s.out_w;
  const std::vector<float> a = quarters(4 * k, 1);
  const PackedMatrix packed =
      PackedMatrix::pack(GemmSide::A, reinterpret_cast<const std::byte*>(a.data()), Elem::F32, 4, k);
  ThreadPool pool(1);
  ScratchSpace scratch;
  PackedGemm gemm({.m = 4, .n = n + 1, .k = k, .a_prepacked = true}, scratch);
  scratch.allocate(pool.size());
  std::vector<float> c(static_cast<size_t>(4 * (n + 1)));
  EXPECT_THROW(gemm.run(&packed, s, {reinterpret_cast<std::byte*>(c.data()), Elem::F32, n + 1}, {}, pool, scratch),
               Error);
}

}  // namespace
}  // namespace npusim::cpu
