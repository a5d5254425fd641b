#pragma once
// The CUDA kernels as host-callable launchers, with plain types only so that nvcc and the host compiler both read
// this header. Element codes are those of cpu::Elem (F32, F16, BF16, I64, Bool); floats compute in fp32.
// Every launcher enqueues on `stream` and returns cudaGetLastError()'s code (0 on success).
#include <cuda_runtime.h>

#include <cstdint>

namespace npusim::cuda {

constexpr int kMaxRank = 8;
enum ElemCode : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI64 = 3, kBool = 4 };
// Bytes of one element of a float storage code.
inline int64_t element_bytes(int elem) { return elem == kF32 ? 4 : 2; }

// A logical shape and, per operand, element strides (0 where an operand broadcasts). Operand 0 is the output.
struct Indexer {
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
  int64_t strides[4][kMaxRank] = {};
};

struct Operand {
  const void* data = nullptr;
  int elem = kF32;
};

enum class BinaryOp : int {
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
  BitwiseAnd,
  BitwiseOr,
  BitwiseXor,
  AddRelu,
  SiluMul,
};
enum class UnaryOp : int { Relu, Silu, Sigmoid, Tanh, Gelu, GeluTanh, Neg, Exp, Identity };

// out[i] = src[j] over the indexer's shape (operand 0 = dst, 1 = src), converting elements.
cudaError_t launch_copy(cudaStream_t stream, const Indexer& index, void* dst, int dst_elem, Operand src);
// out = a op b (b may be a scalar: b.data null, the scalar given as double and int64), with add/sub's alpha.
cudaError_t launch_binary(cudaStream_t stream, BinaryOp op, const Indexer& index, void* out, int out_elem, Operand a,
                          Operand b, double scalar, int64_t int_scalar, double alpha, int64_t int_alpha);
cudaError_t launch_unary(cudaStream_t stream, UnaryOp op, int64_t count, void* out, int out_elem, Operand in);
// out = cond ? a : b; a null `b` takes `other`.
cudaError_t launch_where(cudaStream_t stream, const Indexer& index, void* out, int out_elem, Operand cond, Operand a,
                         Operand b, double other);
// out = x * cos + rotate_half(x) * sin; operands 1..3 of the indexer are x, cos, sin.
cudaError_t launch_rope(cudaStream_t stream, const Indexer& index, int64_t width, void* out, int out_elem, Operand x,
                        Operand cos, Operand sin);
cudaError_t launch_rms_norm(cudaStream_t stream, int64_t rows, int64_t row_size, double eps, void* out, int out_elem,
                            Operand x, Operand weight);
// (x - mean) / sqrt(var + eps) per row of `row_size`, times weight[c] and plus bias[c] where given (null data: none);
// the rows' mean and 1/sqrt(var + eps) go to mean_out and rstd_out where given (native_layer_norm).
cudaError_t launch_layer_norm(cudaStream_t stream, int64_t rows, int64_t row_size, double eps, void* out, int out_elem,
                              Operand x, Operand weight, Operand bias, Operand mean_out, Operand rstd_out);
// Rows of `table` [vocab, width] by int64 indices; an index out of range sets *error to 1 and writes zeros.
cudaError_t launch_embedding(cudaStream_t stream, int64_t count, int64_t vocab, int64_t width, void* out, int out_elem,
                             Operand table, const int64_t* indices, int* error);
// out (already holding the input) gets source's slices at index along a dim: out [outer, dim_size, inner],
// source [outer, index_count, inner].
cudaError_t launch_index_copy(cudaStream_t stream, int64_t outer, int64_t dim_size, int64_t inner, int64_t index_count,
                              void* out, int out_elem, Operand source, const int64_t* index, int* error);

// A decoder layer's rotary embeddings and KV-cache writes in one launch (decode fusion), each a job over its own
// elements: a rope into its output, a rope straight into a cache slot, or a copy of a source into a cache slot.
// Cache slots follow index_copy: element i of the [outer, index_count, inner] source goes to slice index[j] of the
// [outer, dim_size, inner] cache; an index out of range sets *error.
enum class RopeCacheKind : int { RopeToOutput, RopeToCache, CopyToCache };
struct RopeCacheJob {
  RopeCacheKind kind = RopeCacheKind::RopeToOutput;
  int64_t count = 0;
  Indexer ix;         // ropes: operand 0 the output, 1..3 x, cos, sin (as launch_rope)
  int64_t width = 0;  // ropes: the rotated last dim
  void* out = nullptr;
  int out_elem = kF32;
  Operand x, cos, sin;
  int64_t dim_size = 0, inner = 1, index_count = 0;
  // A copy reads source element (outer o, index j, inner e) at o * source_outer_stride + j * source_index_stride + e.
  int64_t source_outer_stride = 0, source_index_stride = 0;
  const int64_t* index = nullptr;
  int* error = nullptr;
};
constexpr int kRopeCacheMaxJobs = 4;
struct RopeCacheBatch {
  RopeCacheJob jobs[kRopeCacheMaxJobs];
  int count = 0;
};
cudaError_t launch_rope_cache(cudaStream_t stream, const RopeCacheBatch& batch);

// self[index0, index1, ...] over self's leading dims: the index tensors (int64) broadcast over `broadcast`
// (operands 1..count of the indexer hold their strides), then `inner` trailing elements per position. An index out
// of range sets *error to 1.
struct GatherParams {
  int count = 0;
  const int64_t* index[3] = {};
  int64_t dim_size[3] = {};
  int64_t dim_stride[3] = {};
  int64_t inner = 1;
};
cudaError_t launch_index(cudaStream_t stream, const Indexer& broadcast, const GatherParams& g, void* out, int out_elem,
                         Operand self, int* error);

// C[m, n] = A[m, k] · B[n, k]ᵀ (+ bias[n]), fp32 accumulation, any float storage.
cudaError_t launch_linear(cudaStream_t stream, int64_t m, int64_t n, int64_t k, void* c, int c_elem, Operand a,
                          Operand b, Operand bias);
// c[m, n] += bias[n] (bias broadcast over rows), then the activation.
cudaError_t launch_bias_activation(cudaStream_t stream, int64_t m, int64_t n, void* c, int c_elem, Operand bias,
                                   UnaryOp activation);

struct ConvParams {
  int64_t batch, in_channels, in_h, in_w, out_channels, out_h, out_w, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  UnaryOp activation;
  float min_val, max_val;  // hardtanh only (activation Identity with clamp when use_clamp)
  bool use_clamp;
};
// Direct convolution with bias, residual (same shape as out) and activation fused.
cudaError_t launch_conv2d(cudaStream_t stream, const ConvParams& p, void* out, int out_elem, Operand x, Operand w,
                          Operand bias, Operand residual);

// The columns of a convolution's GEMM for `samples` samples from x on: col[sample][(ci, kh, kw), (oh, ow)] (zeros
// in the padding). With `rows` past Cin·kh·kw, the first extra row is ones and the rest zeros (a bias column
// appended to the weights then adds the bias in the GEMM itself).
cudaError_t launch_im2col(cudaStream_t stream, const ConvParams& p, int64_t samples, int64_t rows, void* col,
                          Operand x);
// out[b, c, pixel] = activation(out + bias[c] + residual), the epilogue of a convolution run as a GEMM.
cudaError_t launch_conv_epilogue(cudaStream_t stream, const ConvParams& p, void* out, int out_elem, Operand bias,
                                 Operand residual);

// y[n] = x[k] · W[n, k]ᵀ + bias[n], one row of activations (decode), bf16/fp16/fp32 storage, fp32 accumulation.
cudaError_t launch_gemv(cudaStream_t stream, int64_t n, int64_t k, void* y, int elem, const void* x, const void* w,
                        Operand bias);

// Several GEMVs over the same activation row in one launch (decode's q/k/v, gate/up): y = x · Wᵀ + bias +
// residual per segment, all in the storage `elem` (residual and bias may be null).
constexpr int kGemvMaxSegments = 4;
struct GemvSegment {
  const void* w = nullptr;  // [rows, k]
  void* y = nullptr;        // [rows]
  Operand bias;             // [rows] or null
  Operand residual;         // [rows] or null, added after the bias
  int64_t rows = 0;
};
// An RMSNorm applied to the activation row first (the fused normalization of a decoder layer): x is replaced
// by x / sqrt(mean(x^2) + eps) * weight, rounded to the storage as the rms_norm kernel writes it; the weight [k]
// is in the same storage as x.
struct GemvNorm {
  bool enabled = false;
  const void* weight = nullptr;
  int elem = kF32;
  double eps = 0.0;
};
// How a GEMV launch spreads its work: warps per task (1, 2 or 4) and 16-byte vectors of each row in flight per lane
// (2, 4 or 8). {0, 0} takes gemv_default_shape; the benchmarks sweep the others.
struct GemvShape {
  int parts = 0, unroll = 0;
};
// The shape launches take for `tasks` outputs (a gate row with its up row is one) of length k.
GemvShape gemv_default_shape(int64_t tasks, int64_t k, int elem);
cudaError_t launch_gemv_batch(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvSegment* segments,
                              int count, const GemvNorm& norm, GemvShape shape = {});
// The gated MLP's first half in one launch: y = silu(x · Wgᵀ + bg) * (x · Wuᵀ + bu), both weights [rows, k].
cudaError_t launch_gemv_gated(cudaStream_t stream, int64_t k, int elem, const void* x, const GemvSegment& gate,
                              const GemvSegment& up, const GemvNorm& norm, GemvShape shape = {});
// Whether launch_gemv takes rows of length k in this storage (rows of whole 16-byte vectors; x and w 16-byte
// aligned).
bool gemv_supports(int64_t k, int elem);

struct PoolParams {
  int64_t planes, in_h, in_w, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w;
};
cudaError_t launch_max_pool2d(cudaStream_t stream, const PoolParams& p, void* out, int out_elem, Operand x);
cudaError_t launch_adaptive_avg_pool2d(cudaStream_t stream, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w, void* out, int out_elem, Operand x);

struct AttentionParams {
  int64_t batch, q_heads, k_heads, v_heads, length, source, embed, value_embed;
  float scale;
  bool causal, zero_masked_rows;
  // Mask strides over [batch (flattened), head, row, column]; a null mask is none.
  const void* mask;
  int mask_elem;
  int64_t mask_batch_stride, mask_head_stride, mask_row_stride, mask_column_stride;
  const int64_t* cache_position;  // null: every position; else positions 0..max(cache_position)
  int64_t cache_position_count;
  // cache_position holds its values before the run's first kernel (a graph input): kernels may read it before
  // waiting for the kernel ahead of them.
  bool positions_ready;
  bool tensor_cores;  // several query rows per head may take the tensor-core form (attention_mma.h)
  // The output as [batch, length, q_heads, value_embed] instead of [batch, q_heads, length, value_embed] (the
  // tensor-core form only).
  bool heads_inner_output;
};
// Scratch floats the split (flash-decoding) form needs: one query row per head against a longer cache, its keys
// split over blocks and combined by a second kernel. 0: the single-kernel form runs.
int64_t attention_scratch_floats(const AttentionParams& p);
// `scratch` holds attention_scratch_floats(p) floats, or is null for the single-kernel form.
cudaError_t launch_attention(cudaStream_t stream, const AttentionParams& p, void* out, int out_elem, Operand q,
                             Operand k, Operand v, float* scratch);
// Whether one of the attention kernels takes these parameters, given scratch of attention_scratch_floats(p) floats
// (only the single-block form is bounded: it holds embed + source floats of a row in shared memory).
bool attention_supported(const AttentionParams& p, Operand k, Operand v);

// cos, sin [rows, 2 * half] from inv_freq [half] (fp32) and int64 positions [rows].
cudaError_t launch_rotary_embedding(cudaStream_t stream, int64_t rows, int64_t half, float scaling, void* cos,
                                    void* sin, int out_elem, Operand inv_freq, const int64_t* positions);

// softmax (log_softmax with `log`) over the last dim of [rows, width].
cudaError_t launch_softmax(cudaStream_t stream, int64_t rows, int64_t width, void* out, int out_elem, Operand x,
                           bool log);

// Fills `bytes` bytes at `data` with `value` (poisoning before a run).
cudaError_t launch_fill_bytes(cudaStream_t stream, void* data, uint8_t value, size_t bytes);

}  // namespace npusim::cuda
