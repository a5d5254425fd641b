// The packed GEMM against a double-precision naive product, every element. Operand values are multiples of 1/4 in
// [-1.25, 1.25], exact in fp16 and bf16, so every partial sum is exact in fp32 and results must match exactly
// (after rounding to the output's type); one case with arbitrary values uses a tolerance.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>

#include "backends/cpu/gemv.h"
#include "backends/cpu/packed_gemm.h"
#include "core/cpu_features.h"
#include "npusim/error.h"
#include "unit/patch_matrix.h"
#include "unit/random_values.h"

namespace npusim::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::vector<int64_t> kSizes = {0, 1, 2, 5, 7, 17, 31, 64, 100, 257};

float quarter(int64_t seed) { return static_cast<float>((seed * 7919 + 13) % 11 - 5) * 0.25f; }

// A logical [rows, cols] matrix of quarter values.
std::vector<float> values(int64_t rows, int64_t cols, int64_t seed) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = quarter(static_cast<int64_t>(i) + seed);
  return v;
}

// The matrix stored as `elem` with row stride ld (of the stored layout), transposed when asked; padding is NaN.
std::vector<std::byte> store(const std::vector<float>& v, int64_t rows, int64_t cols, Elem elem, int64_t ld,
                             bool transposed) {
  const int64_t stored_rows = transposed ? cols : rows;
  std::vector<std::byte> bytes(static_cast<size_t>(std::max<int64_t>(stored_rows * ld, 1)) * elem_size(elem));
  for (int64_t i = 0; i < stored_rows * ld; ++i) store_float(bytes.data(), elem, i, kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      store_float(bytes.data(), elem, transposed ? c * ld + r : r * ld + c, v[static_cast<size_t>(r * cols + c)]);
  return bytes;
}

float round_to(Elem elem, double value) {
  std::byte bytes[4];
  store_float(bytes, elem, 0, static_cast<float>(value));
  return load_float(bytes, elem, 0);
}

// Interleaved: B is a transposed bf16 weight prepacked in the AVX2 tile's order (PackedMatrix::pack_interleaved_bf16).
enum class Source { Packed, Strided, Interleaved };

struct Case {
  int64_t m = 1, n = 1, k = 1;
  Source a = Source::Strided, b = Source::Packed;
  Elem a_elem = Elem::F32, b_elem = Elem::F32, c_elem = Elem::F32;
  bool a_transposed = false, b_transposed = false;
  int64_t a_pad = 0, b_pad = 0, c_pad = 0;  // extra row stride
  bool row_bias = false, column_bias = false, residual = false, residual_in_place = false;
  Elem residual_elem = Elem::F32;
  GemmActivation activation = GemmActivation::None;
  float low = 0.0f, high = 0.0f;
  int threads = 1;
  bool arbitrary_values = false;
  bool b_on_lines = false;  // a strided B starting on a cache line (with b_pad, its rows may start on lines too)

  std::string label() const {
    std::ostringstream s;
    s << "m=" << m << " n=" << n << " k=" << k << " a=" << (a == Source::Packed ? "packed" : "strided") << "/"
      << static_cast<int>(a_elem) << (a_transposed ? "T" : "") << " b=" << (b == Source::Packed ? "packed" : "strided")
      << "/" << static_cast<int>(b_elem) << (b_transposed ? "T" : "") << " c=" << static_cast<int>(c_elem)
      << " pads=" << a_pad << "," << b_pad << "," << c_pad << " bias=" << row_bias << column_bias
      << " residual=" << residual << residual_in_place << " act=" << static_cast<int>(activation)
      << " threads=" << threads << " b_on_lines=" << b_on_lines << " kernel=" << static_cast<int>(gemm_active_kernel());
    return s.str();
  }
};

void check(const Case& t) {
  SCOPED_TRACE(t.label());
  const int64_t m = t.m, n = t.n, k = t.k;
  std::vector<float> a = t.arbitrary_values ? test::random_floats(m * k, 1) : values(m, k, 3);
  std::vector<float> b = t.arbitrary_values ? test::random_floats(k * n, 2) : values(k, n, 5);
  // Half-precision operands hold the rounded values.
  for (float& x : a) x = round_to(t.a_elem, x);
  for (float& x : b) x = round_to(t.b_elem, x);
  const std::vector<float> bias = values(1, std::max(m, n), 11);
  const std::vector<float> residual = values(m, n, 17);

  const int64_t a_ld = (t.a_transposed ? m : k) + t.a_pad, b_ld = (t.b_transposed ? k : n) + t.b_pad;
  const std::vector<std::byte> a_bytes = store(a, m, k, t.a_elem, a_ld, t.a_transposed);
  const std::vector<std::byte> b_stored = store(b, k, n, t.b_elem, b_ld, t.b_transposed);
  // On a cache line when asked, else at a 4-byte offset from one.
  std::vector<std::byte> b_space(b_stored.size() + 128);
  const auto b_start = (reinterpret_cast<uintptr_t>(b_space.data()) + 63) / 64 * 64 + (t.b_on_lines ? 0 : 4);
  std::byte* b_data = b_space.data() + (b_start - reinterpret_cast<uintptr_t>(b_space.data()));
  std::copy(b_stored.begin(), b_stored.end(), b_data);
  const int64_t ldc = n + t.c_pad;
  std::vector<std::byte> c_bytes(static_cast<size_t>(std::max<int64_t>(m * ldc, 1)) * elem_size(t.c_elem));
  for (int64_t i = 0; i < m * ldc; ++i) store_float(c_bytes.data(), t.c_elem, i, kNaN);

  GemmEpilogue epilogue;
  epilogue.bias = t.row_bias || t.column_bias ? bias.data() : nullptr;
  epilogue.bias_per_column = t.column_bias;
  std::vector<std::byte> residual_bytes;
  if (t.residual) {
    if (t.residual_in_place) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          store_float(c_bytes.data(), t.c_elem, i * ldc + j, residual[static_cast<size_t>(i * n + j)]);
      epilogue.residual = c_bytes.data();
      epilogue.residual_elem = t.c_elem;
      epilogue.residual_ld = ldc;
    } else {
      residual_bytes = store(residual, m, n, t.residual_elem, n + 3, false);
      epilogue.residual = residual_bytes.data();
      epilogue.residual_elem = t.residual_elem;
      epilogue.residual_ld = n + 3;
    }
  }
  epilogue.activation = t.activation;
  if (t.activation == GemmActivation::Clamp) {
    epilogue.low = t.low;
    epilogue.high = t.high;
  }

  ThreadPool pool(t.threads);
  ScratchSpace scratch;
  PackedGemm gemm({.m = m, .n = n, .k = k, .a_prepacked = t.a == Source::Packed, .b_prepacked = t.b != Source::Strided},
                  scratch);
  scratch.allocate(pool.size());
  PackedMatrix a_packed, b_packed;
  GemmOperand a_operand = StridedOperand{a_bytes.data(), t.a_elem, a_ld, t.a_transposed};
  GemmOperand b_operand = StridedOperand{b_data, t.b_elem, b_ld, t.b_transposed};
  if (t.a == Source::Packed) {
    a_packed = PackedMatrix::pack(GemmSide::A, a_bytes.data(), t.a_elem, m, k, a_ld, t.a_transposed);
    a_operand = &a_packed;
  }
  if (t.b == Source::Packed) {
    b_packed = PackedMatrix::pack(GemmSide::B, b_data, t.b_elem, k, n, b_ld, t.b_transposed);
    b_operand = &b_packed;
  }
  if (t.b == Source::Interleaved) {
    ASSERT_TRUE(t.b_elem == Elem::BF16 && t.b_transposed);
    b_packed = PackedMatrix::pack_interleaved_bf16(reinterpret_cast<const uint16_t*>(b_data), n, k, b_ld, &pool);
    ASSERT_TRUE(b_packed.interleaved());
    b_operand = &b_packed;
  }
  // Twice: a second run over the same scratch gives the same answer.
  for (int run = 0; run < 2 && !(run == 1 && t.residual_in_place); ++run) {
    gemm.run(a_operand, b_operand, {c_bytes.data(), t.c_elem, ldc}, epilogue, pool, scratch);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < k; ++p)
          sum += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(p * n + j)];
        if (t.row_bias) sum += bias[static_cast<size_t>(i)];
        if (t.column_bias) sum += bias[static_cast<size_t>(j)];
        if (t.residual) sum += round_to(t.residual_in_place ? t.c_elem : t.residual_elem, residual[i * n + j]);
        if (t.activation == GemmActivation::Relu) sum = std::max(sum, 0.0);
        if (t.activation == GemmActivation::Clamp) sum = std::clamp<double>(sum, t.low, t.high);
        const float actual = load_float(c_bytes.data(), t.c_elem, i * ldc + j);
        if (t.arbitrary_values) {
          ASSERT_NEAR(actual, sum, 1e-5 * (1.0 + std::sqrt(static_cast<double>(k)))) << "at " << i << "," << j;
        } else {
          ASSERT_EQ(actual, round_to(t.c_elem, sum)) << "at " << i << "," << j;
        }
      }
      for (int64_t j = n; j < ldc; ++j)
        ASSERT_TRUE(std::isnan(load_float(c_bytes.data(), t.c_elem, i * ldc + j))) << "padding written at " << i;
    }
  }
}

// Each micro-kernel family this CPU has, forced in turn.
class PackedGemmTest : public ::testing::TestWithParam<GemmKernelChoice> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(gemm_kernel_supported(GetParam()));
    set_gemm_kernel_choice(GetParam());
    ASSERT_TRUE(GetParam() == GemmKernelChoice::Best || gemm_active_kernel() == GetParam());
  }
  void TearDown() override { set_gemm_kernel_choice(GemmKernelChoice::Best); }
  bool portable() const { return GetParam() == GemmKernelChoice::Portable; }
};

TEST_P(PackedGemmTest, AllSizesPackedBStridedA) {
  for (int64_t m : kSizes)
    for (int64_t n : kSizes)
      for (int64_t k : kSizes) {
        if (portable() && m * n * k > 300000) continue;  // the portable kernel is slow; large sizes below
        check({.m = m, .n = n, .k = k, .threads = (m + n + k) % 2 == 0 ? 2 : 1});
        if (testing::Test::HasFailure()) return;
      }
}

TEST_P(PackedGemmTest, AllSizesPackedAStridedB) {
  for (int64_t m : kSizes)
    for (int64_t n : kSizes)
      for (int64_t k : kSizes) {
        if (portable() && m * n * k > 300000) continue;
        check({.m = m,
               .n = n,
               .k = k,
               .a = Source::Packed,
               .b = Source::Strided,
               .threads = static_cast<int>((m + n + k) % 2) + 1});
        if (testing::Test::HasFailure()) return;
      }
}

// fn(elem, transposed, threads) for every storage type, layout and worker count, until a check fails.
template <class Fn>
void for_each_storage(const Fn& fn) {
  for (Elem elem : {Elem::F32, Elem::F16, Elem::BF16})
    for (bool transposed : {false, true})
      for (int threads : {1, 2}) {
        fn(elem, transposed, threads);
        if (testing::Test::HasFailure()) return;
      }
}

TEST_P(PackedGemmTest, EveryLayoutAndStorageType) {
  const std::vector<std::array<int64_t, 3>> shapes = {{7, 17, 31}, {17, 100, 5}, {100, 31, 257}, {64, 64, 64}};
  for (const auto& [m, n, k] : shapes)
    for (Source a : {Source::Packed, Source::Strided})
      for (Source b : {Source::Packed, Source::Strided})
        for_each_storage([&](Elem elem, bool transposed, int threads) {
          check({.m = m,
                 .n = n,
                 .k = k,
                 .a = a,
                 .b = b,
                 .a_elem = elem,
                 .a_transposed = transposed,
                 .a_pad = 3,
                 .threads = threads});
          check({.m = m,
                 .n = n,
                 .k = k,
                 .a = a,
                 .b = b,
                 .b_elem = elem,
                 .b_transposed = transposed,
                 .b_pad = 5,
                 .threads = threads});
        });
}

// Both operands bf16, A row-major and B a transposed weight (a bf16 model's linear layers): on CPUs with AVX-512
// BF16 the AVX-512 kernels multiply depth pairs. Odd depths, partial panels and several depth blocks.
TEST_P(PackedGemmTest, Bf16OperandsTogether) {
  for (int64_t m : {1, 5, 6, 7, 13, 100})
    for (int64_t n : {1, 15, 16, 17, 33, 100})
      for (int64_t k : {0, 1, 2, 3, 15, 16, 17, 31, 257, 600}) {
        check({.m = m,
               .n = n,
               .k = k,
               .b = Source::Strided,
               .a_elem = Elem::BF16,
               .b_elem = Elem::BF16,
               .c_elem = k % 2 == 1 ? Elem::BF16 : Elem::F32,
               .b_transposed = true,
               .a_pad = 3,
               .b_pad = 5,
               .column_bias = n % 2 == 1,
               .threads = static_cast<int>(m % 2) + 1});
        if (testing::Test::HasFailure()) return;
      }
}

// A bf16 linear weight prepacked in the AVX2 tile's order, read by every kernel family: A bf16 or fp32, partial
// panels both ways, odd depths, several depth blocks and column blocks, one and two workers.
TEST_P(PackedGemmTest, Bf16WeightPrepackedInterleaved) {
  for (int64_t m : {1, 5, 6, 7, 13, 128})
    for (int64_t n : {1, 7, 16, 17, 33, 530})
      for (int64_t k : {0, 1, 3, 8, 17, 257, 600}) {
        check({.m = m,
               .n = n,
               .k = k,
               .b = Source::Interleaved,
               .a_elem = n % 2 == 1 ? Elem::BF16 : Elem::F32,
               .b_elem = Elem::BF16,
               .c_elem = k % 2 == 1 ? Elem::BF16 : Elem::F32,
               .b_transposed = true,
               .a_pad = 3,
               .b_pad = 5,
               .column_bias = m % 2 == 1,
               .threads = static_cast<int>(k % 2) + 1});
        if (testing::Test::HasFailure()) return;
      }
}

// Each shape with A strided in every storage type and layout, on one and two workers: against a strided B (of the
// same type, transposed or not) packed during the product, with a bias along the columns, then against a prepacked
// fp32 B with a residual; rows of A padded.
void check_strided_a(const std::vector<std::array<int64_t, 3>>& shapes) {
  for (const auto& [m, n, k] : shapes)
    for_each_storage([&](Elem elem, bool transposed, int threads) {
      check({.m = m,
             .n = n,
             .k = k,
             .b = Source::Strided,
             .a_elem = elem,
             .b_elem = elem,
             .c_elem = Elem::F32,
             .b_transposed = transposed,
             .a_pad = 3,
             .b_pad = 5,
             .column_bias = true,
             .threads = threads});
      check({.m = m,
             .n = n,
             .k = k,
             .a_elem = elem,
             .a_transposed = transposed,
             .a_pad = 2,
             .residual = true,
             .threads = threads});
    });
}

// Products wider than one column block (n past 512, or past 128 for deep rows) pack a strided A whole once per
// worker and read it from there for every block; bf16 B packed during the product stays bf16 for the AVX2 tile.
// Rows that end in partial panels, depths that end in partial steps of 8 and several depth blocks, split over one
// and two workers.
TEST_P(PackedGemmTest, StridedAWiderThanOneColumnBlock) {
  check_strided_a({{7, 530, 19}, {13, 600, 257}, {128, 1040, 40}, {5, 300, 3100}, {600, 520, 19}});
}

// Workers claim each other's column blocks once their own are done (more workers than this machine has cores make
// that likely): with the rows split too, a worker then packs the other region's rows of A whole for them. Every run
// of every product gives the exact sums, over three and four workers, A strided and prepacked, fp32 and bf16.
TEST_P(PackedGemmTest, ColumnBlocksClaimedAcrossWorkers) {
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{{600, 1100, 19}, {1200, 1100, 8}, {30, 2600, 23}})
    for (int threads : {3, 4})
      for (Source a : {Source::Strided, Source::Packed}) {
        check({.m = m, .n = n, .k = k, .a = a, .b = Source::Strided, .column_bias = true, .threads = threads});
        // bf16 both sides, B a transposed weight: the AVX2 tile's bf16 panels and the AVX-512 bf16 pairs.
        check({.m = m,
               .n = n,
               .k = k,
               .a = a,
               .b = Source::Strided,
               .a_elem = Elem::BF16,
               .b_elem = Elem::BF16,
               .b_transposed = true,
               .threads = threads});
        if (testing::Test::HasFailure()) return;
      }
}

// Row blocks whose last panel would hold one or two rows share their last MR + 1 or MR + 2 rows between two panels
// on the AVX2 tiles: one row block (7, 8, 13, 14 rows), the last of several (96 + 32), a last block of fewer rows
// than a panel (96 + 2), rows split over two workers, and a single last column (the one-column tile).
TEST_P(PackedGemmTest, LastRowsSharedBetweenTwoPanels) {
  check_strided_a({{7, 40, 33}, {8, 17, 9}, {13, 33, 64}, {14, 600, 19}, {128, 49, 300}, {98, 21, 40}});
}

// The AVX-512 tiles take two A panels (12 rows) at a time while two remain: rows of exactly two panels, two and a
// partial one, three, and two whose second is partial, against one B panel, one and a partial, and two; with A
// prepacked and packed during the product, bias and ReLU, over one and two workers.
TEST_P(PackedGemmTest, TwoAPanelsAtOnce) {
  for (const int64_t m : {12, 13, 18, 10, 24, 97})
    for (const int64_t n : {16, 17, 32, 49})
      for (const Source a : {Source::Packed, Source::Strided}) {
        check({.m = m, .n = n, .k = 300, .a = a, .b = Source::Strided, .threads = 1});
        check({.m = m,
               .n = n,
               .k = 31,
               .a = a,
               .b = Source::Strided,
               .row_bias = true,
               .activation = GemmActivation::Relu,
               .threads = 2});
        if (testing::Test::HasFailure()) return;
      }
}

// `base` with each epilogue: row or column bias, ReLU or clamp, a residual (separate, in place in C, or bf16).
void check_each_epilogue(const Case& base) {
  Case t = base;
  t.row_bias = true;
  check(t);
  t = base;
  t.column_bias = true;
  t.activation = GemmActivation::Relu;
  check(t);
  t = base;
  t.residual = true;
  t.row_bias = true;
  t.activation = GemmActivation::Clamp;
  t.low = 0.0f;
  t.high = 6.0f;
  check(t);
  t = base;
  t.residual = true;
  t.residual_in_place = true;
  t.column_bias = true;
  t.activation = GemmActivation::Relu;
  check(t);
  t = base;
  t.residual = true;
  t.residual_elem = Elem::BF16;
  t.activation = GemmActivation::Clamp;
  t.low = -1.5f;
  t.high = 2.25f;
  check(t);
}

// A row-major fp32 B whose rows start on cache lines, which the AVX-512 tiles read in place (whole panels; a last
// partial panel is packed), plain and through each epilogue (the tiles store those over an fp32 residual themselves).
TEST_P(PackedGemmTest, StridedBOnCacheLines) {
  for (int64_t m : {1, 7, 13, 100})
    for (int64_t n : {16, 37, 48, 100, 513})
      for (int64_t k : {1, 9, 300}) {
        const Case base{.m = m,
                        .n = n,
                        .k = k,
                        .a = (m + n) % 2 ? Source::Packed : Source::Strided,
                        .b = Source::Strided,
                        .b_pad = (n + 15) / 16 * 16 - n,
                        .c_pad = 3,
                        .threads = static_cast<int>(k % 2) + 1,
                        .b_on_lines = true};
        check(base);
        check_each_epilogue(base);
        if (testing::Test::HasFailure()) return;
      }
}

TEST_P(PackedGemmTest, Epilogues) {
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {5, 7, 2}, {31, 17, 100}, {100, 257, 64}};
  for (const auto& [m, n, k] : shapes)
    for (Elem c_elem : {Elem::F32, Elem::F16, Elem::BF16})
      for (int threads : {1, 2}) {
        const Case base{.m = m, .n = n, .k = k, .c_elem = c_elem, .c_pad = 2, .threads = threads};
        check_each_epilogue(base);
        if (testing::Test::HasFailure()) return;
      }
}

TEST_P(PackedGemmTest, ArbitraryValuesWithinTolerance) {
  check({.m = 100, .n = 257, .k = 257, .threads = 2, .arbitrary_values = true});
  check({.m = 31, .n = 64, .k = 600, .a = Source::Packed, .b = Source::Strided, .arbitrary_values = true});
}

std::vector<GemmKernelChoice> supported_kernels() {
  std::vector<GemmKernelChoice> kernels;
  for (GemmKernelChoice k : {GemmKernelChoice::Best, GemmKernelChoice::Portable, GemmKernelChoice::Avx2,
                             GemmKernelChoice::Avx512, GemmKernelChoice::Amx})
    if (gemm_kernel_supported(k)) kernels.push_back(k);
  return kernels;
}

// An int8 weight as B, widened while it is packed, gives what the same product gives over the weight's rows
// widened first by dequantize_row (to bf16 where a bf16 A meets AVX-512 BF16 pairs, else to fp32), element for
// element; and both stay within fp32 rounding of the exact sums. Shapes cover partial panels, depths that are not
// whole runs of eight, several scale groups per row, several column blocks, and A prepacked with B packed once for
// every worker.
TEST_P(PackedGemmTest, Int8WeightWidenedWhilePacked) {
  struct Shape {
    int64_t m, n, k, group;
    bool a_prepacked = false;
  };
  const GemmKernelChoice active = gemm_active_kernel();
  const bool bf16_pairs = (active == GemmKernelChoice::Avx512 || active == GemmKernelChoice::Amx) &&
                          cpu_features().avx512() && cpu_features().avx512bf16;
  for (const Shape& c :
       {Shape{8, 16, 8, 8}, Shape{13, 31, 40, 8}, Shape{9, 1, 7, 7}, Shape{100, 257, 64, 16}, Shape{8, 17, 257, 257},
        Shape{21, 64, 96, 32}, Shape{8, 700, 520, 520}, Shape{256, 196, 1024, 64, true}})
    for (Elem a_elem : {Elem::F32, Elem::BF16})
      for (int threads : {1, 2}) {
        if (c.a_prepacked && a_elem != Elem::F32) continue;
        SCOPED_TRACE(::testing::Message()
                     << c.m << "x" << c.n << "x" << c.k << " group " << c.group << " a " << static_cast<int>(a_elem)
                     << (c.a_prepacked ? " prepacked" : "") << " threads " << threads);
        std::vector<float> a = test::random_floats(c.m * c.k, 7);
        for (float& x : a) x = round_to(a_elem, x);
        const std::vector<std::byte> a_bytes = store(a, c.m, c.k, a_elem, c.k, false);
        const std::vector<float> w = test::random_floats(c.n * c.k, 8);
        const QuantizedWeight q = quantize_int8(reinterpret_cast<const std::byte*>(w.data()), Elem::F32, c.n, c.k,
                                                c.group == c.k ? 0 : c.group);
        const Elem widened = a_elem == Elem::BF16 && bf16_pairs ? Elem::BF16 : Elem::F32;
        std::vector<std::byte> rows(static_cast<size_t>(c.n * c.k) * elem_size(widened));
        for (int64_t j = 0; j < c.n; ++j)
          q.dequantize_row(j, widened, rows.data() + static_cast<size_t>(j * c.k) * elem_size(widened));

        ThreadPool pool(threads);
        ScratchSpace scratch;
        PackedGemm gemm({.m = c.m, .n = c.n, .k = c.k, .a_prepacked = c.a_prepacked}, scratch);
        scratch.allocate(pool.size());
        if (c.a_prepacked && threads == 2) EXPECT_TRUE(gemm.packs_b_once(threads));
        PackedMatrix a_packed;
        GemmOperand a_operand = StridedOperand{a_bytes.data(), a_elem, c.k};
        if (c.a_prepacked) {
          a_packed = PackedMatrix::pack(GemmSide::A, a_bytes.data(), a_elem, c.m, c.k);
          a_operand = &a_packed;
        }
        const auto product = [&](const GemmOperand& b) {
          std::vector<float> out(static_cast<size_t>(c.m * c.n), kNaN);
          gemm.run(a_operand, b, {reinterpret_cast<std::byte*>(out.data()), Elem::F32, c.n}, {}, pool, scratch);
          return out;
        };
        const std::vector<float> expected =
            product(StridedOperand{.data = rows.data(), .elem = widened, .ld = c.k, .transposed = true});
        const std::vector<float> actual =
            product(Int8WeightOperand{.values = reinterpret_cast<const int8_t*>(q.values.data()),
                                      .scales = reinterpret_cast<const float*>(q.scales.data()),
                                      .group = q.group});
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            const size_t at = static_cast<size_t>(i * c.n + j);
            ASSERT_EQ(actual[at], expected[at]) << "at " << i << "," << j;
            double exact = 0.0, magnitude = 0.0;
            for (int64_t p = 0; p < c.k; ++p) {
              const double term = static_cast<double>(a[static_cast<size_t>(i * c.k + p)]) *
                                  load_float(rows.data(), widened, j * c.k + p);
              exact += term;
              magnitude += std::fabs(term);
            }
            ASSERT_NEAR(actual[at], exact, 1e-6 * magnitude + 1e-30) << "at " << i << "," << j;
          }
      }
}

INSTANTIATE_TEST_SUITE_P(Kernels, PackedGemmTest, ::testing::ValuesIn(supported_kernels()), [](const auto& info) {
  switch (info.param) {
    case GemmKernelChoice::Portable:
      return "Portable";
    case GemmKernelChoice::Avx2:
      return "Avx2";
    case GemmKernelChoice::Avx512:
      return "Avx512";
    case GemmKernelChoice::Amx:
      return "Amx";
    default:
      return "Best";
  }
});

// C [m, n] (NaN-filled first) of a prepacked fp32 A [m, k] times the patch matrix of `s`, gathered while packing.
std::vector<float> prepacked_times_patches(const std::vector<std::byte>& a_bytes, int64_t m, int64_t k,
                                           const Im2colOperand& s, ThreadPool& pool) {
  const int64_t n = s.out_h * s.out_w;
  ScratchSpace scratch;
  PackedGemm gemm({.m = m, .n = n, .k = k, .a_prepacked = true}, scratch);
  scratch.allocate(pool.size());
  const PackedMatrix packed = PackedMatrix::pack(GemmSide::A, a_bytes.data(), Elem::F32, m, k);
  std::vector<float> c(static_cast<size_t>(m * n), kNaN);
  gemm.run(&packed, s, {reinterpret_cast<std::byte*>(c.data()), Elem::F32, n}, {}, pool, scratch);
  return c;
}

// The B operand gathered from a convolution input equals the explicit patch matrix.
TEST(PackedGemm, Im2colOperandMatchesExplicitPatches) {
  struct Geometry {
    int64_t channels, height, width, kh, kw, sh, sw, ph, pw, dh, dw;
  };
  for (const Geometry& g : {Geometry{3, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1}, Geometry{2, 8, 7, 3, 2, 2, 1, 0, 1, 1, 1},
                            Geometry{4, 10, 10, 3, 3, 2, 2, 2, 2, 2, 2}, Geometry{1, 5, 40, 1, 5, 1, 3, 0, 2, 1, 1},
                            Geometry{3, 23, 41, 7, 7, 2, 2, 3, 3, 1, 1}}) {
    Im2colOperand s{nullptr, g.channels, g.height, g.width, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, 0, 0};
    s.out_h = (g.height + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
    s.out_w = (g.width + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
    const std::vector<float> input = values(g.channels, g.height * g.width, 2);
    s.input = input.data();
    const int64_t k = g.channels * g.kh * g.kw, n = s.out_h * s.out_w, m = 7;
    const std::vector<float> patches = test::explicit_patch_matrix(s);
    const std::vector<float> a = values(m, k, 9);
    const std::vector<std::byte> a_bytes = store(a, m, k, Elem::F32, k, false);
    for (int threads : {1, 2}) {
      set_gemm_kernel_choice(threads == 1 ? GemmKernelChoice::Portable : GemmKernelChoice::Best);
      ThreadPool pool(threads);
      const std::vector<float> c = prepacked_times_patches(a_bytes, m, k, s, pool);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0.0;
          for (int64_t p = 0; p < k; ++p)
            sum += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * patches[static_cast<size_t>(p * n + j)];
          ASSERT_EQ(c[static_cast<size_t>(i * n + j)], static_cast<float>(sum)) << i << "," << j;
        }
    }
  }
  set_gemm_kernel_choice(GemmKernelChoice::Best);
}

// Kernels wider than the taps whose in-row lanes are worked out once per panel (16), strided and padded, and
// output rows narrower than a panel: the patch matrix gathered while packing equals the explicit one.
TEST(PackedGemm, Im2colOperandWithWideKernels) {
  for (const auto [width, kw, sw, pw] : {std::array<int64_t, 4>{40, 19, 1, 9}, std::array<int64_t, 4>{45, 17, 2, 3},
                                         std::array<int64_t, 4>{9, 21, 3, 10}}) {
    const int64_t channels = 2, height = 3, kh = 1;
    Im2colOperand s{nullptr, channels, height, width, kh, kw, 1, sw, 0, pw, 1, 1, height, 0};
    s.out_w = (width + 2 * pw - kw) / sw + 1;
    const std::vector<float> input = values(channels, height * width, 4);
    s.input = input.data();
    const int64_t k = channels * kw, n = s.out_h * s.out_w, m = 5;
    const std::vector<float> a = values(m, k, 6);
    const std::vector<std::byte> a_bytes = store(a, m, k, Elem::F32, k, false);
    for (GemmKernelChoice kernel : {GemmKernelChoice::Portable, GemmKernelChoice::Best}) {
      set_gemm_kernel_choice(kernel);
      ThreadPool pool(2);
      const std::vector<float> c = prepacked_times_patches(a_bytes, m, k, s, pool);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t oy = 0; oy < s.out_h; ++oy)
          for (int64_t ox = 0; ox < s.out_w; ++ox) {
            double sum = 0.0;
            for (int64_t ch = 0; ch < channels; ++ch)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t ix = ox * sw - pw + kx;
                if (ix < 0 || ix >= width) continue;
                sum += static_cast<double>(a[static_cast<size_t>(i * k + ch * kw + kx)]) *
                       input[static_cast<size_t>((ch * height + oy) * width + ix)];
              }
            ASSERT_EQ(c[static_cast<size_t>(i * n + oy * s.out_w + ox)], static_cast<float>(sum))
                << "width " << width << " kernel " << kw << " at " << i << "," << oy << "," << ox;
          }
    }
  }
  set_gemm_kernel_choice(GemmKernelChoice::Best);
}

// Products whose workers split the rows pack B once for all of them (a strided B, and a convolution's patches
// gathered while packing, straight and from stride phases): every element equals the one-thread product.
TEST(PackedGemm, BPackedOnceForAllWorkers) {
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& c : {Case{256, 196, 1024}, Case{512, 49, 2048}, Case{512, 784, 128}}) {
    const std::vector<float> a = values(c.m, c.k, 3), b = values(c.k, c.n, 5);
    const std::vector<std::byte> a_bytes = store(a, c.m, c.k, Elem::F32, c.k, false);
    const std::vector<std::byte> b_bytes = store(b, c.k, c.n, Elem::F32, c.n, false);
    const PackedMatrix packed = PackedMatrix::pack(GemmSide::A, a_bytes.data(), Elem::F32, c.m, c.k);
    std::vector<float> expected;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      ScratchSpace scratch;
      PackedGemm gemm({.m = c.m, .n = c.n, .k = c.k, .a_prepacked = true}, scratch);
      scratch.allocate(pool.size());
      if (threads != 3) EXPECT_EQ(gemm.packs_b_once(threads), threads == 2) << c.m << "x" << c.n << "x" << c.k;
      std::vector<float> out(static_cast<size_t>(c.m * c.n), kNaN);
      gemm.run(&packed, StridedOperand{b_bytes.data(), Elem::F32, c.n},
               {reinterpret_cast<std::byte*>(out.data()), Elem::F32, c.n}, {}, pool, scratch);
      if (threads == 1) {
        expected = out;
        for (float value : out) ASSERT_FALSE(std::isnan(value));
        continue;
      }
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], expected[i]) << "element " << i << " on " << threads;
    }
  }
  // A 3x3 stride-2 convolution over a 14x14 input (7x7 outputs, as in layer 4 of a ResNet): patches gathered
  // straight and from stride phases.
  Im2colOperand s{nullptr, 128, 14, 14, 3, 3, 2, 2, 1, 1, 1, 1, 7, 7};
  const std::vector<float> input = values(128, 14 * 14, 8);
  s.input = input.data();
  std::vector<float> phases(static_cast<size_t>(im2col_phase_floats(s)));
  const int64_t m = 256, k = 128 * 9;
  const std::vector<float> a = values(m, k, 9);
  const std::vector<std::byte> a_bytes = store(a, m, k, Elem::F32, k, false);
  std::vector<float> expected;
  for (bool phased : {false, true})
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      Im2colOperand operand = s;
      if (phased) {
        split_im2col_phases(s, phases.data(), &pool);
        operand.phases = phases.data();
      }
      ScratchSpace scratch;
      PackedGemm gemm({.m = m, .n = 49, .k = k, .a_prepacked = true}, scratch);
      EXPECT_EQ(gemm.packs_b_once(threads), threads > 1);
      const std::vector<float> c = prepacked_times_patches(a_bytes, m, k, operand, pool);
      if (expected.empty()) {
        expected = c;
        continue;
      }
      for (size_t i = 0; i < c.size(); ++i)
        ASSERT_EQ(c[i], expected[i]) << "element " << i << (phased ? " from phases" : "") << " on " << threads;
    }
}

// The message of the error `run` throws, or "" when it throws none.
template <class Run>
std::string error_of(const Run& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PackedGemm, MisusedInt8WeightOperandsAreErrors) {
  ThreadPool pool(1);
  ScratchSpace scratch;
  PackedGemm gemm({.m = 2, .n = 3, .k = 4}, scratch);
  scratch.allocate(pool.size());
  std::vector<float> a(8, 1.0f), c(6, -7.0f), scales(3, 0.5f);
  const std::vector<int8_t> values = {1, 2, 3, 4, -1, -2, -3, -4, 0, 1, 0, 1};
  const auto* a_data = reinterpret_cast<const std::byte*>(a.data());
  const GemmOutput out{reinterpret_cast<std::byte*>(c.data()), Elem::F32, 3};
  const Int8WeightOperand weight{.values = values.data(), .scales = scales.data(), .group = 4};
  const auto run = [&](const GemmOperand& lhs, const GemmOperand& rhs) {
    return error_of([&] { gemm.run(lhs, rhs, out, {}, pool, scratch); });
  };
  const StridedOperand x{a_data, Elem::F32, 4};
  EXPECT_NE(run(weight, x).find("only B can be an int8 weight operand"), std::string::npos);
  Int8WeightOperand no_group = weight;
  no_group.group = 0;
  EXPECT_NE(run(x, no_group).find("positive scale group"), std::string::npos);
  Int8WeightOperand no_scales = weight;
  no_scales.scales = nullptr;
  EXPECT_NE(run(x, no_scales).find("no values or no scales"), std::string::npos);
  EXPECT_EQ(c, std::vector<float>(6, -7.0f)) << "a rejected product wrote its output";
  EXPECT_EQ(run(x, weight), "");
  EXPECT_EQ(c, (std::vector<float>{5.0f, -5.0f, 1.0f, 5.0f, -5.0f, 1.0f}));
}

TEST(PackedGemm, MismatchedOperandsAreErrors) {
  ThreadPool pool(1);
  ScratchSpace scratch;
  PackedGemm gemm({.m = 4, .n = 5, .k = 3, .b_prepacked = true}, scratch);
  scratch.allocate(pool.size());
  std::vector<float> a(20, 1.0f), c(20, 0.0f);
  const auto* a_data = reinterpret_cast<const std::byte*>(a.data());
  const GemmOutput out{reinterpret_cast<std::byte*>(c.data()), Elem::F32, 5};
  const PackedMatrix wrong = PackedMatrix::pack(GemmSide::B, a_data, Elem::F32, 3, 4);
  const PackedMatrix as_a = PackedMatrix::pack(GemmSide::A, a_data, Elem::F32, 3, 4);
  EXPECT_THROW(gemm.run(StridedOperand{a_data, Elem::F32, 3}, &wrong, out, {}, pool, scratch), Error);
  EXPECT_THROW(gemm.run(StridedOperand{a_data, Elem::F32, 3}, &as_a, out, {}, pool, scratch), Error);
  EXPECT_THROW(
      gemm.run(StridedOperand{a_data, Elem::F32, 3}, StridedOperand{a_data, Elem::F32, 5}, out, {}, pool, scratch),
      Error);
  const PackedMatrix right = PackedMatrix::pack(GemmSide::B, a_data, Elem::F32, 3, 5, 5);
  EXPECT_THROW(gemm.run(StridedOperand{a_data, Elem::F32, 2}, &right, out, {}, pool, scratch), Error);
  EXPECT_THROW(gemm.run(StridedOperand{a_data, Elem::I64, 3}, &right, out, {}, pool, scratch), Error);
  EXPECT_THROW(gemm.run(StridedOperand{a_data, Elem::F32, 3}, &right, {out.data, Elem::F32, 4}, {}, pool, scratch),
               Error);
  EXPECT_THROW(PackedMatrix::pack(GemmSide::A, a_data, Elem::I64, 2, 2), Error);
  EXPECT_THROW(PackedMatrix::pack(GemmSide::A, a_data, Elem::F32, 2, 3, 2), Error);
  EXPECT_NO_THROW(gemm.run(StridedOperand{a_data, Elem::F32, 3}, &right, out, {}, pool, scratch));
  EXPECT_EQ(c[0], 3.0f);
}

// Every stored value of a packed operand, padding included, as raw bytes.
std::vector<std::byte> packed_bytes(const PackedMatrix& m) {
  const std::byte* first = m.panel(0);
  return std::vector<std::byte>(first, first + m.bytes());
}

// Each logical element of a packed operand sits where offset_of says; everything else is zero padding.
TEST(PackedMatrix, OffsetOfLocatesEveryElementAndTheRestIsZero) {
  for (GemmSide side : {GemmSide::A, GemmSide::B})
    for (Elem elem : {Elem::F32, Elem::BF16})
      for (int64_t rows : {1, 5, 6, 7, 17, 33})
        for (int64_t cols : {1, 3, 16, 19}) {
          SCOPED_TRACE(testing::Message() << "side " << static_cast<int>(side) << " elem " << static_cast<int>(elem)
                                          << " " << rows << "x" << cols);
          const std::vector<float> v = values(rows, cols, 7);
          const std::vector<std::byte> bytes = store(v, rows, cols, elem, cols, false);
          const PackedMatrix packed = PackedMatrix::pack(side, bytes.data(), elem, rows, cols);
          std::vector<bool> used(packed.bytes() / elem_size(elem), false);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              const size_t at = packed.offset_of(r, c);
              ASSERT_LT(at, used.size());
              ASSERT_FALSE(used[at]) << r << "," << c;
              used[at] = true;
              ASSERT_EQ(load_float(packed.panel(0), elem, static_cast<int64_t>(at)),
                        round_to(elem, v[static_cast<size_t>(r * cols + c)]))
                  << r << "," << c;
            }
          for (size_t i = 0; i < used.size(); ++i)
            if (!used[i]) ASSERT_EQ(load_float(packed.panel(0), elem, static_cast<int64_t>(i)), 0.0f) << i;
        }
}

// The same for a bf16 weight [n, k] prepacked as an interleaved B [k, n], packed alone, over a pool and into an
// arena.
TEST(PackedMatrix, InterleavedOffsetOfLocatesEveryElementAndTheRestIsZero) {
  for (GemmKernelChoice kernel : {GemmKernelChoice::Portable, GemmKernelChoice::Best}) {
    set_gemm_kernel_choice(kernel);
    for (int64_t n : {1, 5, 16, 19, 40})
      for (int64_t k : {1, 3, 8, 17, 300}) {
        SCOPED_TRACE(testing::Message() << n << "x" << k << " kernel " << static_cast<int>(kernel));
        const int64_t ld = k + 3;
        const std::vector<float> v = values(n, k, 7);
        const std::vector<std::byte> bytes = store(v, n, k, Elem::BF16, ld, false);
        const auto* bits = reinterpret_cast<const uint16_t*>(bytes.data());
        const PackedMatrix packed = PackedMatrix::pack_interleaved_bf16(bits, n, k, ld);
        ASSERT_TRUE(packed.interleaved());
        ASSERT_EQ(packed.rows(), k);
        ASSERT_EQ(packed.cols(), n);
        std::vector<bool> used(packed.bytes() / 2, false);
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < n; ++j) {
            const size_t at = packed.offset_of(p, j);
            ASSERT_LT(at, used.size());
            ASSERT_FALSE(used[at]) << p << "," << j;
            used[at] = true;
            ASSERT_EQ(load_float(packed.panel(0), Elem::BF16, static_cast<int64_t>(at)),
                      v[static_cast<size_t>(j * k + p)])
                << p << "," << j;
          }
        for (size_t i = 0; i < used.size(); ++i)
          if (!used[i]) ASSERT_EQ(load_float(packed.panel(0), Elem::BF16, static_cast<int64_t>(i)), 0.0f) << i;
        ThreadPool pool(2);
        ASSERT_EQ(packed_bytes(PackedMatrix::pack_interleaved_bf16(bits, n, k, ld, &pool)), packed_bytes(packed));
        auto arena = std::make_shared<ZeroedArena>();
        PackedMatrix in_arena;
        {
          const PackingArenaScope scope(arena);
          in_arena = PackedMatrix::pack_interleaved_bf16(bits, n, k, ld, &pool);
        }
        ASSERT_EQ(arena->used_bytes(), packed.bytes());
        arena.reset();  // the matrix keeps the arena alive
        ASSERT_TRUE(in_arena.interleaved());
        ASSERT_EQ(packed_bytes(in_arena), packed_bytes(packed));
      }
  }
  set_gemm_kernel_choice(GemmKernelChoice::Best);
  EXPECT_THROW(PackedMatrix::pack_interleaved_bf16(nullptr, 4, 8, 7), Error);
}

// A zeroed operand filled through offset_of is the packed operand.
TEST(PackedMatrix, ZeroedFilledInPlaceEqualsPacked) {
  for (GemmSide side : {GemmSide::A, GemmSide::B}) {
    const int64_t rows = 13, cols = 21;
    const std::vector<float> v = values(rows, cols, 3);
    const std::vector<std::byte> bytes = store(v, rows, cols, Elem::F32, cols, false);
    PackedMatrix filled = PackedMatrix::zeroed(side, Elem::F32, rows, cols);
    EXPECT_EQ(filled.side(), side);
    EXPECT_EQ(filled.rows(), rows);
    EXPECT_EQ(filled.cols(), cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        reinterpret_cast<float*>(filled.mutable_panel(0))[filled.offset_of(r, c)] =
            v[static_cast<size_t>(r * cols + c)];
    EXPECT_EQ(packed_bytes(filled), packed_bytes(PackedMatrix::pack(side, bytes.data(), Elem::F32, rows, cols)));
  }
  EXPECT_THROW(PackedMatrix::zeroed(GemmSide::A, Elem::I64, 2, 2), Error);
  EXPECT_THROW(PackedMatrix::zeroed(GemmSide::B, Elem::F32, -1, 2), Error);
}

// Packing over a pool's threads, or into an arena, stores the same bytes as packing alone; every layout, storage
// type and vector path, with sizes that leave a partial last panel.
TEST(PackedMatrix, PoolAndArenaPackTheSameBytes) {
  for (GemmKernelChoice kernel : {GemmKernelChoice::Portable, GemmKernelChoice::Best}) {
    set_gemm_kernel_choice(kernel);
    for (GemmSide side : {GemmSide::A, GemmSide::B})
      for (bool transposed : {false, true})
        for (Elem elem : {Elem::F32, Elem::F16, Elem::BF16})
          for (int64_t rows : {1, 7, 301})
            for (int64_t cols : {5, 17, 260}) {
              SCOPED_TRACE(testing::Message() << "side " << static_cast<int>(side) << " transposed " << transposed
                                              << " elem " << static_cast<int>(elem) << " " << rows << "x" << cols
                                              << " kernel " << static_cast<int>(kernel));
              const int64_t ld = (transposed ? rows : cols) + 3;
              const std::vector<std::byte> bytes = store(values(rows, cols, 5), rows, cols, elem, ld, transposed);
              const PackedMatrix alone = PackedMatrix::pack(side, bytes.data(), elem, rows, cols, ld, transposed);
              ThreadPool pool(2);
              const PackedMatrix pooled =
                  PackedMatrix::pack(side, bytes.data(), elem, rows, cols, ld, transposed, &pool);
              ASSERT_EQ(packed_bytes(pooled), packed_bytes(alone));
              auto arena = std::make_shared<ZeroedArena>();
              PackedMatrix in_arena;
              {
                const PackingArenaScope scope(arena);
                in_arena = PackedMatrix::pack(side, bytes.data(), elem, rows, cols, ld, transposed, &pool);
              }
              arena.reset();  // the matrix keeps the arena alive
              ASSERT_EQ(packed_bytes(in_arena), packed_bytes(alone));
            }
  }
  set_gemm_kernel_choice(GemmKernelChoice::Best);
}

// Blocks of an arena are zero, 64-byte aligned and disjoint, small ones sharing a mapping and large ones getting
// their own; outside a scope, matrices are not taken from the arena.
TEST(ZeroedArena, BlocksAreZeroAlignedAndDisjoint) {
  auto arena = std::make_shared<ZeroedArena>();
  std::vector<std::pair<std::byte*, size_t>> blocks;
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{100}, size_t{5} << 20, size_t{40} << 20, size_t{3000},
                       size_t{0}, size_t{31} << 20}) {
    std::byte* block = arena->allocate(bytes, "a test").data;
    ASSERT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u);
    for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(block[i], std::byte{0});
    if (bytes) ASSERT_EQ(block[bytes - 1], std::byte{0});
    std::fill(block, block + bytes, std::byte{0x5a});
    blocks.emplace_back(block, bytes);
  }
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      const auto [a, a_bytes] = blocks[i];
      const auto [b, b_bytes] = blocks[j];
      EXPECT_TRUE(a + std::max<size_t>(a_bytes, 1) <= b || b + std::max<size_t>(b_bytes, 1) <= a) << i << "," << j;
    }
  EXPECT_EQ(blocks[1].first, blocks[0].first + 64);  // consecutive small blocks share a chunk
  EXPECT_GE(arena->used_bytes(), (size_t{76} << 20) + 3000);
  arena->advise_huge_pages();
  {
    const PackingArenaScope scope(arena);
    const size_t before = arena->used_bytes();
    const PackedMatrix packed = PackedMatrix::zeroed(GemmSide::A, Elem::F32, 6, 16);
    EXPECT_EQ(arena->used_bytes(), before + packed.bytes());
  }
  const size_t after = arena->used_bytes();
  const PackedMatrix outside = PackedMatrix::zeroed(GemmSide::A, Elem::F32, 6, 16);
  EXPECT_EQ(arena->used_bytes(), after);
  EXPECT_EQ(load_float(outside.panel(0), Elem::F32, 0), 0.0f);
}

}  // namespace
}  // namespace npusim::cpu
