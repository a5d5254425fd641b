#pragma once
// Winograd F(4x4, 3x3) and F(2x2, 3x3) for 3x3, stride-1, ungrouped convolutions: the weights are transformed and
// packed once; per run the input tiles are transformed into alpha^2 matrices [Cin, tiles], multiplied by the
// transformed weights with alpha^2 independent packed GEMMs, and transformed back with bias, residual and
// activation applied on the way out. 4x (F4) or 2.25x (F2) fewer multiplications than the direct product.
#include <memory>
#include <vector>

#include "backends/cpu/packed_gemm.h"

namespace npusim::cpu {

class WinogradConv {
 public:
  struct Geometry {
    int64_t in_channels = 0, out_channels = 0;
    int64_t height = 0, width = 0;  // input plane
    int64_t pad_h = 0, pad_w = 0;
    int64_t out_h = 0, out_w = 0;
  };

  // Whether Winograd beats the direct GEMM for this geometry (it needs enough channels to amortize transforms).
  static bool suitable(const Geometry& g);
  // Transforms and packs the weight [Cout, Cin, 3, 3] (fp32/fp16/bf16), over the pool's threads when one is given;
  // reserves per-worker scratch. With `channel_scales` (one per output channel), the weight transformed is
  // float(w * scale) (a BatchNorm folded in on the way, as scale_rows folds it).
  WinogradConv(const Geometry& g, const std::byte* weight, Elem weight_elem, ScratchSpace& scratch,
               ThreadPool* pool = nullptr, const double* channel_scales = nullptr);
  // Floats of workspace run() needs (the caller places it, e.g. in the shared scratch).
  int64_t workspace_floats() const;
  // One sample: out[Cout, out_h * out_w] = epilogue(conv(input [Cin, height, width])), bias per output channel
  // and residual laid out like the output (row stride out_h * out_w).
  void run(const float* input, float* workspace, const GemmOutput& out, const GemmEpilogue& epilogue, ThreadPool& pool,
           const ScratchSpace& scratch) const;

 private:
  // U[xi] = G w G^T per transform point xi, computed in double and written straight into its packed place.
  void transform_weights(const std::byte* weight, Elem weight_elem, ThreadPool* pool, const double* channel_scales);

  Geometry g_;
  int tile_ = 4;  // output tile side m; alpha = m + 2
  int64_t tiles_h_ = 0, tiles_w_ = 0;
  bool tiles_as_rows_ = false;         // GEMM as V^T · U^T (few tiles) instead of U · V
  std::vector<PackedMatrix> weights_;  // per transform point
  PackedGemm gemm_;
};

}  // namespace npusim::cpu
