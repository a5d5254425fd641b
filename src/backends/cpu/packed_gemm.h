#pragma once
// Blocked, packed GEMM for the CPU backend: C[m, n] = epilogue(A[m, k] · B[k, n]), accumulated in fp32.
//
// Either operand may be a weight packed once at prepare time (PackedMatrix: panels kept in fp32, fp16 or bf16 and
// converted to fp32 inside the kernel, so half-precision weights never exist in fp32 whole); the other one is packed
// during the product from a strided matrix (fp32/fp16/bf16) or, for B, straight from a convolution's input
// (Im2colOperand: no im2col matrix is ever materialized) or from an int8 weight and its scales (Int8WeightOperand). The
// product runs on the backend's ThreadPool with packing buffers that PackedGemm reserves per worker in the ScratchSpace
// when it is planned, so a run allocates nothing. Micro-kernel (chosen at run time by CPU features): 6x32 / 6x16 /
// 12x32 / 12x16 AVX-512 over one or two A and B panels, 6x16 AVX2+FMA, or portable C++ (fp32 panels take the AVX2 tile
// on AMD's AVX-512 CPUs, where it measured faster, but for a row-major B the AVX-512 tiles read in place).
//
// Typical use, at prepare time:   PackedMatrix w = PackedMatrix::pack(GemmSide::B, weight, elem, k, n, k, true);
//                                 PackedGemm gemm({.m = m, .n = n, .k = k, .b_prepacked = true}, ctx.scratch);
// and in the kernel closure:      gemm.run(StridedOperand{x, x_elem, k}, &w, {out, out_elem, n}, epilogue,
//                                          pool, scratch);
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/zeroed_memory.h"

namespace npusim::cpu {

// The micro-tile: rows of A (height of an A panel) and columns of B (width of a B panel) per micro-kernel call.
inline constexpr int64_t kGemmTileRows = 6;
inline constexpr int64_t kGemmTileCols = 16;

enum class GemmSide : uint8_t { A, B };

// A constant operand packed once: A [m, k] as panels of kGemmTileRows rows, or B [k, n] as panels of
// kGemmTileCols columns; each panel is k-major and zero-padded, values kept in their storage type.
class PackedMatrix {
 public:
  PackedMatrix() = default;
  // Packs the operand of logical shape [rows, cols] ([m, k] for A, [k, n] for B) whose element (r, c) is
  // data[r * ld + c], or data[c * ld + r] when `transposed` (a linear weight [n, k] used as B); ld 0 means dense.
  // `elem` is F32, F16 or BF16 and stays the panels' type. With a pool, its threads share the panels (at prepare
  // time most of the cost is the first touch of fresh pages, which two threads take about twice as fast).
  // With `line_scales` (fp32 only), line l (row l of A, column l of B) is stored multiplied by line_scales[l], each
  // value rounded once from double (a BatchNorm folded into the weight while it is packed, as scale_rows folds it).
  static PackedMatrix pack(GemmSide side, const std::byte* data, Elem elem, int64_t rows, int64_t cols, int64_t ld = 0,
                           bool transposed = false, ThreadPool* pool = nullptr, const double* line_scales = nullptr);
  // An all-zero packed operand for callers that compute the values straight into their packed places (see
  // offset_of), so that the logical matrix never exists on its own.
  static PackedMatrix zeroed(GemmSide side, Elem elem, int64_t rows, int64_t cols);
  // A linear weight [n, k] of bf16 bits (row stride ld) as B [k, n] in the order the AVX2 tile widens without a
  // shuffle (see interleaved()): what a product packs from such a weight on every run, packed once. With a pool, its
  // threads share the panels; the storage comes from the packing arena as pack()'s does.
  static PackedMatrix pack_interleaved_bf16(const uint16_t* weight, int64_t n, int64_t k, int64_t ld,
                                            ThreadPool* pool = nullptr);

  GemmSide side() const { return side_; }
  Elem elem() const { return elem_; }
  int64_t rows() const { return rows_; }                                  // logical rows: m for A, k for B
  int64_t cols() const { return cols_; }                                  // logical cols: k for A, n for B
  int64_t depth() const { return side_ == GemmSide::A ? cols_ : rows_; }  // k
  size_t bytes() const { return bytes_; }
  // The values are in place already: the storage came written from the packing arena (packed weights mapped from a
  // file, see PackingArenaScope); pack() then returns it as it is, and callers that compute values into a zeroed()
  // operand skip that.
  bool prewritten() const { return prewritten_; }
  // Whether each depth step of a (bf16, B) panel holds its columns in the order 0 8 1 9 ... 7 15: 32-bit lane i then
  // has column i in its low half and column i + 8 in its high half.
  bool interleaved() const { return interleaved_; }
  // Panel `p` (k-major, kGemmTileRows or kGemmTileCols values per k step) in the packed storage type.
  const std::byte* panel(int64_t p) const { return data_ + static_cast<size_t>(p) * panel_bytes_; }
  std::byte* mutable_panel(int64_t p) { return data_ + static_cast<size_t>(p) * panel_bytes_; }
  // Where logical element (r, c) lives, in elements from the start of the storage.
  size_t offset_of(int64_t r, int64_t c) const {
    const int64_t width = side_ == GemmSide::A ? kGemmTileRows : kGemmTileCols;
    const int64_t line = side_ == GemmSide::A ? r : c, step = side_ == GemmSide::A ? c : r;
    const int64_t slot = interleaved_ ? line % (width / 2) * 2 + line % width / (width / 2) : line % width;
    return static_cast<size_t>(line / width) * (panel_bytes_ / elem_size(elem_)) +
           static_cast<size_t>(step * width + slot);
  }

 private:
  // The layout of a packed [rows, cols] operand, with no storage yet.
  static PackedMatrix shaped(GemmSide side, Elem elem, int64_t rows, int64_t cols);
  // Zeroed storage for the layout: a block of the thread's packing arena (see PackingArenaScope), else a buffer of
  // its own on `pages`.
  void take_storage(Pages pages);

  GemmSide side_ = GemmSide::A;
  Elem elem_ = Elem::F32;
  int64_t rows_ = 0, cols_ = 0;
  size_t panel_bytes_ = 0;
  std::shared_ptr<const void> owner_;  // what keeps the storage alive: a buffer of its own, or the arena
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
  bool prewritten_ = false;
  bool interleaved_ = false;
};

// Maps the storage of freshly made packed operands in before they are written, in pieces over the pool's threads
// (one call per piece: cheaper than a page fault at the first write of each 4 KiB page).
void prefault_storage(const std::vector<PackedMatrix*>& matrices, ThreadPool* pool);

// While a scope is alive, the PackedMatrix::pack and ::zeroed calls of its thread take their storage from `arena`
// (each matrix keeps the arena alive), so that the weights a program packs at prepare time share a few large
// mappings; outside any scope each matrix has a buffer of its own. Scopes nest.
// Each block is tagged with the owner named last (a node), its place among that owner's blocks and the operand's
// shape: an arena that starts with blocks written before (see ZeroedArena) hands the same owner the same blocks.
class PackingArenaScope {
 public:
  explicit PackingArenaScope(std::shared_ptr<ZeroedArena> arena);
  ~PackingArenaScope();
  PackingArenaScope(const PackingArenaScope&) = delete;
  PackingArenaScope& operator=(const PackingArenaScope&) = delete;
  // Names what packs next; its blocks are counted from the first again.
  void set_owner(const std::string& owner);

 private:
  std::shared_ptr<ZeroedArena> previous_;
  std::string previous_owner_;
  uint64_t previous_count_ = 0;
};

// An operand read in place and packed during the product: element (r, c) of its logical [rows, cols] matrix is
// data[r * ld + c], or data[c * ld + r] when `transposed`. `elem` is F32, F16 or BF16.
struct StridedOperand {
  const std::byte* data = nullptr;
  Elem elem = Elem::F32;
  int64_t ld = 0;
  bool transposed = false;
};

// The B operand of a convolution over one sample and one group: [channels * kernel_h * kernel_w, out_h * out_w],
// row (channel, ky, kx), column = output pixel oy * out_w + ox, gathered from the fp32 input while packing (zero
// where a tap reads padding).
struct Im2colOperand {
  const float* input = nullptr;  // [channels, height, width], contiguous
  int64_t channels = 0, height = 0, width = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t out_h = 0, out_w = 0;
  // Optionally (strided convolutions), the input as split_im2col_phases writes it: the packing then copies runs of
  // pixels with no bounds checks. Null: packed from `input`.
  const float* phases = nullptr;
};

// Whether packing `s` from its split phases pays for the split: strided taps along output rows long enough to fill
// whole panels with one run each (shorter rows pack faster straight from the input).
bool im2col_phases_pay(const Im2colOperand& s);
// Floats split_im2col_phases writes for `s`.
int64_t im2col_phase_floats(const Im2colOperand& s);
// Splits the zero-padded input of `s` by its strides: phase (ry, rx) of channel c holds the padded rows ry,
// ry + stride_h, ... and columns rx, rx + stride_w, ..., so that a tap's values for consecutive output pixels of one
// row are consecutive. Only the phases some tap reads are written. Over the pool's threads when one is given.
void split_im2col_phases(const Im2colOperand& s, float* phases, ThreadPool* pool);

// A linear weight [n, k] in symmetric int8 (QuantizedWeight's layout) as B [k, n], column j of B being row j of the
// weight: element (p, j) is values[j * k + p] * scales[j * groups + p / group], groups = ceil(k / group). It is
// widened while it is packed during the product, as QuantizedWeight::dequantize_row widens it: to fp32, or to bf16
// depth pairs (each value times its scale rounded to nearest even) where the product multiplies bf16 pairs (a bf16
// A on a CPU with AVX-512 BF16). No widened copy of the weight is ever made.
struct Int8WeightOperand {
  const int8_t* values = nullptr;
  const float* scales = nullptr;
  int64_t group = 0;  // depth values per scale: k for one scale per weight row
};

// One side of a product: a prepacked weight (owned by the caller, alive while the product runs), a strided matrix,
// or (B only) a convolution input or an int8 weight.
using GemmOperand = std::variant<const PackedMatrix*, StridedOperand, Im2colOperand, Int8WeightOperand>;

enum class GemmActivation : uint8_t { None, Relu, Clamp };

struct UnaryStep;  // backends/cpu/elementwise.h

// What happens to each fp32 sum before it is stored, in this order: + bias, + residual, activation, then `unary`.
struct GemmEpilogue {
  const float* bias = nullptr;  // fp32, one per row (m values) or, with bias_per_column, one per column (n values)
  bool bias_per_column = false;
  const std::byte* residual = nullptr;  // [m, n], row stride residual_ld; may be the output itself
  Elem residual_elem = Elem::F32;
  int64_t residual_ld = 0;
  GemmActivation activation = GemmActivation::None;
  float low = -std::numeric_limits<float>::infinity();  // Clamp bounds (ReLU6: 0 and 6)
  float high = std::numeric_limits<float>::infinity();
  // Any other activation (SiLU, hardswish, GELU, ...), applied to each row of C as it is finished, while it is in
  // the cache; null for none.
  const UnaryStep* unary = nullptr;
};

// Where C goes: element (i, j) at data[i * ld + j] (in elements), stored as `elem` (F32, F16 or BF16).
struct GemmOutput {
  std::byte* data = nullptr;
  Elem elem = Elem::F32;
  int64_t ld = 0;
};

namespace gemm_detail {
// Where the AVX-512 tiles store a tile's finished sums themselves, through the epilogue, instead of into the sums
// buffer for a pass of its own: the tile's live rows and columns of an fp32 C at c (row stride ldc), + bias (per row
// or per column, at the tile's first), + an fp32 residual, then ReLU or the clamp, in store_rows's order.
struct TileOutput {
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t rows = 0, cols = 0;
  const float* row_bias = nullptr;
  const float* column_bias = nullptr;
  const float* residual = nullptr;
  int64_t residual_ld = 0;
  GemmActivation activation = GemmActivation::None;
  float low = 0.0f, high = 0.0f;
};
}  // namespace gemm_detail

// The sizes of one product and which sides come prepacked, fixed at prepare time.
struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool a_prepacked = false;  // A is a PackedMatrix (else a StridedOperand)
  bool b_prepacked = false;  // B is a PackedMatrix (else a StridedOperand or an Im2colOperand)
  int max_threads = 0;       // at most this many pool workers; 0: as many as the pool has and the size justifies
};

// One planned product: blocking chosen and per-worker scratch reserved once, then run any number of times.
class PackedGemm {
 public:
  PackedGemm() = default;
  // Plans the product (call at prepare time); reserves its per-worker packing buffers in `scratch`.
  PackedGemm(const GemmSpec& spec, ScratchSpace& scratch);
  // C = epilogue(A · B) over the pool, with `scratch` allocated; fails (npusim::Error, before any work) when an
  // operand does not match the spec.
  void run(const GemmOperand& a, const GemmOperand& b, const GemmOutput& c, const GemmEpilogue& epilogue,
           ThreadPool& pool, const ScratchSpace& scratch) const;
  // The whole product on the calling thread with pool worker `worker`'s scratch, for callers that spread several
  // independent products over the pool themselves (inside their own parallel_for).
  void run_on_worker(const GemmOperand& a, const GemmOperand& b, const GemmOutput& c, const GemmEpilogue& epilogue,
                     int worker, const ScratchSpace& scratch) const;
  const GemmSpec& spec() const { return spec_; }
  // Whether a run over a pool of `threads` keeps the whole product on one worker (too small to split).
  bool single_worker(int threads) const;
  // Whether a run over a pool of `threads` packs B once for all its workers, in a pass before the product, instead
  // of each worker packing the columns it multiplies (for tests and measurements).
  bool packs_b_once(int threads) const;

 private:
  void check(const GemmOperand& a, const GemmOperand& b, const GemmOutput& c, const GemmEpilogue& epilogue) const;

  // Where worker 0's scratch holds B packed whole for every worker (after the worker's own buffers).
  float* shared_b_of(const ScratchSpace& scratch) const;

  GemmSpec spec_;
  int64_t kc_ = 0, mc_ = 0, nc_ = 0;  // cache blocking: depth, rows and columns per block
  int64_t shared_b_floats_ = 0;       // B packed whole, when it may be shared (0: never)
  int64_t whole_a_floats_ = 0;        // per worker: a strided A packed whole, once per run (0: per block)
};

// Sums [rows, cols] (row stride ld_sums, changed in place) through `epilogue` into C at (row0, col0), the way a
// product stores its sums (bias per row of C, or per column; residual element (i, j) at residual_ld * i + j): for
// kernels that compute sums of their own, such as Winograd's output transform.
void store_through_epilogue(float* sums, int64_t ld_sums, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                            const GemmOutput& c, const GemmEpilogue& epilogue);

// Which micro-kernel products use: the best one this CPU supports, or a given one (for tests and measurements).
// Amx is Avx512 with the products of two bf16 operands on AMX tiles.
enum class GemmKernelChoice : uint8_t { Best, Portable, Avx2, Avx512, Amx };
// Selects the micro-kernel for all later products (not while a product runs); a choice the CPU lacks runs the
// portable kernel.
void set_gemm_kernel_choice(GemmKernelChoice choice);
// Whether this CPU can run `choice` (Best and Portable always).
bool gemm_kernel_supported(GemmKernelChoice choice);
// The kernel family products use now (never Best).
GemmKernelChoice gemm_active_kernel();
// True when products use a vector micro-kernel (AVX2+FMA or AVX-512).
bool gemm_uses_avx2();

}  // namespace npusim::cpu
