// The AMX tiles of the packed GEMM for two bf16 operands: sums of 16 x 16 fp32 (up to 2 x 2 of them per call) over
// A as rows of bf16 (16 rows of 32 depth values per tile) and B in depth pairs (16 pairs of 16 columns per tile,
// exactly a B panel's layout in packed_gemm.cpp). Compiled for AMX with function attributes only; packed_gemm.cpp
// calls them when the CPU reports usable AMX-BF16 tiles.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/packed_gemm_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace npusim::cpu::gemm_detail {

namespace {

#define NPUSIM_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

// The layout ldtilecfg reads (palette 1): bytes per row and rows of each of the 16 tile registers.
struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles 0-3: sums (row tile r, column tile c at 2 r + c); 4-5: A row tiles; 6-7: B column tiles. All 16 rows of
// 64 bytes.
constexpr int kTiles = 8;
constexpr int64_t kTileBytes = 64;

template <int Rows, int Cols>
NPUSIM_AMX void tiles(int64_t depth_tiles, const uint16_t* a, int64_t a_ld, const uint32_t* b0, const uint32_t* b1,
                      float* c, int64_t ldc, bool accumulate) {
  const auto c_stride = static_cast<size_t>(ldc) * sizeof(float);
  const auto a_stride = static_cast<size_t>(a_ld) * sizeof(uint16_t);
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    if constexpr (Cols == 2) _tile_loadd(1, c + 16, c_stride);
    if constexpr (Rows == 2) _tile_loadd(2, c + 16 * ldc, c_stride);
    if constexpr (Rows == 2 && Cols == 2) _tile_loadd(3, c + 16 * ldc + 16, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (Cols == 2) _tile_zero(1);
    if constexpr (Rows == 2) _tile_zero(2);
    if constexpr (Rows == 2 && Cols == 2) _tile_zero(3);
  }
  for (int64_t t = 0; t < depth_tiles; ++t) {
    // 32 depth values of A, 16 depth pairs of B: a B panel advances 16 pairs x 16 columns per tile.
    _tile_loadd(4, a + t * 32, a_stride);
    if constexpr (Rows == 2) _tile_loadd(5, a + 16 * a_ld + t * 32, a_stride);
    _tile_loadd(6, b0 + t * 256, kTileBytes);
    if constexpr (Cols == 2) _tile_loadd(7, b1 + t * 256, kTileBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Cols == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (Rows == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (Rows == 2 && Cols == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  if constexpr (Cols == 2) _tile_stored(1, c + 16, c_stride);
  if constexpr (Rows == 2) _tile_stored(2, c + 16 * ldc, c_stride);
  if constexpr (Rows == 2 && Cols == 2) _tile_stored(3, c + 16 * ldc + 16, c_stride);
}

}  // namespace

NPUSIM_AMX void amx_configure() {
  TileConfig config;
  for (int t = 0; t < kTiles; ++t) {
    config.bytes_per_row[t] = kTileBytes;
    config.rows[t] = 16;
  }
  // GCC 12's _tile_loadconfig does not tell the optimizer that it reads the configuration: it dropped the stores
  // above and loaded stack garbage (a general protection fault on Sapphire Rapids). The operand says so here.
  asm volatile("ldtilecfg %0" : : "m"(config));
}

NPUSIM_AMX void amx_release() { _tile_release(); }

void amx_bf16_tiles(int rows, int cols, int64_t depth_tiles, const uint16_t* a, int64_t a_ld, const uint32_t* b0,
                    const uint32_t* b1, float* c, int64_t ldc, bool accumulate) {
  if (rows == 2)
    return cols == 2 ? tiles<2, 2>(depth_tiles, a, a_ld, b0, b1, c, ldc, accumulate)
                     : tiles<2, 1>(depth_tiles, a, a_ld, b0, b1, c, ldc, accumulate);
  return cols == 2 ? tiles<1, 2>(depth_tiles, a, a_ld, b0, b1, c, ldc, accumulate)
                   : tiles<1, 1>(depth_tiles, a, a_ld, b0, b1, c, ldc, accumulate);
}

}  // namespace npusim::cpu::gemm_detail

#endif
