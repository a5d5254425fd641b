#pragma once
// The x86 kernels the packed GEMM (packed_gemm.cpp) calls from the files compiled for their instruction sets:
// packed_gemm_avx512.cpp and packed_gemm_amx.cpp. Called only where the CPU reports them (see packed_gemm.h).
#include <cstdint>

#include "backends/cpu/packed_gemm.h"

namespace npusim::cpu::gemm_detail {

// How far ahead the tiles ask for a prepacked A into L2: 4 KiB where the panels are read again for later columns
// (further would evict them), 16 KiB where a product has a single column step and each panel is read once
// (ResNet-50's 14x14 and 7x7 Winograd convolutions on Zen 5, alternated in one process: 0.61-0.64 -> 0.53-0.59 and
// 0.87-0.94 -> 0.80-0.86 ms).
inline constexpr int64_t kReusedAFar = 4096, kStreamedAFar = 16384;

// B's rows b_step bytes apart; with `out`, a tile's sums go through its epilogue into C instead of into c.
using PairKernel = void (*)(int64_t kc, const float* a, const std::byte* b0, const std::byte* b1, int64_t b_step,
                            float* c, int64_t ldc, bool accumulate, const TileOutput* out);
// 6x32 over two B panels when `pair`, else 6x16 (b1 unused); with `streamed_a`, A's panels are asked for as read
// once (kStreamedAFar), else as read again for later columns.
PairKernel avx512_kernel(Elem b_elem, bool pair, bool streamed_a);
using RowsKernel = void (*)(int64_t kc, const float* a0, const float* a1, const std::byte* b0, const std::byte* b1,
                            int64_t b_step, float* c, int64_t ldc, bool accumulate, const TileOutput* out);
RowsKernel avx512_rows12_kernel(Elem b_elem, bool pair, bool streamed_a);  // the same over two A panels (12 rows)
using Bf16PairKernel = void (*)(int64_t pairs, const uint32_t* a, const uint32_t* b0, const uint32_t* b1, float* c,
                                int64_t ldc, bool accumulate);
Bf16PairKernel avx512_bf16_pair_kernel(bool pair);
// Whole panels of an int8 weight's lines from line0 as bf16 depth pairs (see pack_b_pairs; each value times its scale
// rounded to nearest even), 16 depth values at a time; returns the pairs packed: the caller packs the rest. Needs
// AVX-512 BF16, and the weight's scale groups in whole runs of eight (or one group per line).
int64_t pack_int8_pairs_avx512(const Int8WeightOperand& b, int64_t k, int64_t line0, int64_t panels, uint32_t* dst);
// One panel of a convolution's patch matrix with AVX-512 permutes; false, writing nothing, where it cannot.
bool pack_im2col_panel_permuted(const Im2colOperand& s, int64_t k, int64_t pixel0, int64_t width, float* panel);
// packed_gemm_amx.cpp: this thread's tile registers set up for amx_bf16_tiles, and given back.
void amx_configure();
void amx_release();
// rows x cols (1 or 2 each) tiles of 16 x 16 sums at c (row stride ldc) (+)= A · B over depth_tiles tiles of 32
// depth values: A bf16 row-major (a_ld values per row), B panels in depth pairs (b1 the panel after b0).
void amx_bf16_tiles(int rows, int cols, int64_t depth_tiles, const uint16_t* a, int64_t a_ld, const uint32_t* b0,
                    const uint32_t* b1, float* c, int64_t ldc, bool accumulate);

}  // namespace npusim::cpu::gemm_detail
