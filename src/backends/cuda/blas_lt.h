#pragma once
// GEMMs on cuBLASLt (libcublasLt.so), opened at run time. A plan is made once at prepare time: descriptors,
// layouts, the fused epilogue and an algorithm, chosen by timing the heuristic's candidates on the node's own
// buffers (choices are kept process-wide per problem, so identical layers time once). Running a plan only enqueues
// one cublasLtMatmul: nothing allocates or synchronizes, so it may run inside CUDA-graph capture.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

// D[rows, cols] (row-major, per batch entry) = A[rows, depth] · B, + C when accumulating, + the bias, then ReLU.
struct GemmSpec {
  enum class Bias { None, PerColumn, PerRow };

  int64_t rows = 0, cols = 0, depth = 0;
  int elem = kF32;             // storage of A, B, C, D and the bias (kF32, kF16 or kBF16); fp32 compute
  bool b_transposed = false;   // B stored [cols, depth] (a linear's weight) rather than [depth, cols]
  int64_t batch = 1;           // strided-batched when > 1
  int64_t a_batch_stride = 0;  // elements between batch entries; 0 repeats the matrix
  int64_t b_batch_stride = 0;
  int64_t d_batch_stride = 0;  // C's too
  Bias bias = Bias::None;      // bias[cols] added to every row, or bias[rows] to every column
  bool accumulate = false;     // beta = 1 with C (laid out like D)
  bool relu = false;           // applied last
};

struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // read when accumulating
  const void* bias = nullptr;
  void* d = nullptr;
};

class GemmPlan {
 public:
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  // Enqueues the GEMM on the operands the plan was made with; throws npusim::Error naming `where` on failure.
  void run(cudaStream_t stream, const std::string& where) const { run(stream, operands_, where); }
  // The same on other buffers of the same alignment (the bias stays the plan's).
  void run(cudaStream_t stream, const GemmOperands& operands, const std::string& where) const;
  // The chosen algorithm's time at prepare (0 when the heuristic's first answer was taken untimed).
  double milliseconds() const { return milliseconds_; }
  bool row_major_output() const { return row_order_; }

 private:
  friend class Blas;
  GemmPlan() = default;
  struct Descriptors;
  std::unique_ptr<Descriptors> descriptors_;
  GemmOperands operands_;
  float beta_ = 0.0f;
  double milliseconds_ = 0.0;
  bool row_order_ = false;
};

// cuBLASLt, process-wide.
class Blas {
 public:
  // The instance, or null when libcublasLt cannot be loaded ($NPUSIM_CUDA_NO_CUBLAS=1 also says no).
  static Blas* instance();

  // A plan for `spec` on `operands`, its algorithm timed on `stream` (before any capture; D is overwritten), or
  // null when cuBLASLt has no algorithm for it. $NPUSIM_CUDA_GEMM_TUNE=0 takes the heuristic's first answer.
  // Throws npusim::Error naming `where` when a cuBLASLt or CUDA call fails.
  std::shared_ptr<const GemmPlan> plan(const GemmSpec& spec, const GemmOperands& operands, cudaStream_t stream,
                                       const std::string& where);

 private:
  Blas() = default;
  friend class GemmPlan;
  struct Api;
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
};

// Whether GEMM algorithms are chosen by timing ($NPUSIM_CUDA_GEMM_TUNE, default on).
bool gemm_tuning_enabled();

// The mean time of `launch` on `stream` over a few repetitions after a warm-up, in milliseconds.
double time_on_stream(cudaStream_t stream, const std::function<void()>& launch, const std::string& where);

}  // namespace npusim::cuda
