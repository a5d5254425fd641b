#pragma once
// Convolutions on cuDNN's legacy API (libcudnn.so.9, opened at run time like cuBLASLt: nothing is linked and no
// cuDNN header is needed to build). A plan is made once at prepare time: the descriptors and an algorithm, chosen by
// timing the heuristic's candidates on the node's own buffers (choices are kept process-wide per problem). Running
// a plan only enqueues one cuDNN call with the workspace it is given: nothing allocates or synchronizes, so it may
// run inside CUDA-graph capture.
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

// One NCHW convolution: sizes, groups and epilogue from `p`; x, w and y in the storage `elem` (kF32, kF16 or kBF16).
struct CudnnConvRequest {
  ConvParams p{};
  int elem = kF32;
  const void* x = nullptr;
  const void* w = nullptr;
  void* y = nullptr;
  Operand bias{nullptr, kF32};      // [Cout], or null
  Operand residual{nullptr, kF32};  // shaped like y, or null
};

class CudnnConvolution {
 public:
  ~CudnnConvolution();
  CudnnConvolution(const CudnnConvolution&) = delete;
  CudnnConvolution& operator=(const CudnnConvolution&) = delete;

  // Enqueues the convolution on `stream` with `workspace` (at least workspace_bytes()); throws npusim::Error naming
  // `where` and the cuDNN call on failure.
  void run(cudaStream_t stream, void* workspace, const std::string& where) const;
  // Whether cuDNN applies the bias, the residual and the ReLU itself (cudnnConvolutionBiasActivationForward);
  // otherwise the plan is the convolution alone and the caller runs the epilogue.
  bool fused() const { return fused_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  int algorithm() const { return algorithm_; }
  double milliseconds() const { return milliseconds_; }

 private:
  friend class Cudnn;
  CudnnConvolution() = default;
  struct Descriptors;
  std::unique_ptr<Descriptors> descriptors_;
  CudnnConvRequest request_;
  bool fused_ = false;
  int algorithm_ = 0;
  size_t workspace_bytes_ = 0;
  double milliseconds_ = 0.0;
};

// cuDNN, process-wide.
class Cudnn {
 public:
  // The instance, or null when libcudnn.so.9 cannot be loaded, is not version 9, or $NPUSIM_CUDA_NO_CUDNN=1.
  static Cudnn* instance();
  // Whether a request's epilogue fits cudnnConvolutionBiasActivationForward: bias and residual in the storage and
  // ReLU or nothing after them (no clamp), with something to fuse.
  static bool can_fuse(const CudnnConvRequest& request);

  // A plan for `request`, fused (the epilogue in cuDNN; only when can_fuse) or the convolution alone, its algorithm
  // timed on `stream` (before any capture; y is overwritten), or null when cuDNN takes no algorithm for it.
  // Throws npusim::Error naming `where` when a cuDNN or CUDA call fails.
  std::shared_ptr<const CudnnConvolution> plan(const CudnnConvRequest& request, bool fused, cudaStream_t stream,
                                               const std::string& where);

  ~Cudnn();

 private:
  Cudnn() = default;
  friend class CudnnConvolution;
  struct Api;
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
};

// How convolutions choose between cuDNN and the other paths ($NPUSIM_CUDA_CONV: "lt" keeps cuDNN out, "cudnn"
// takes it wherever it has an algorithm; otherwise the fastest at prepare).
enum class ConvPath { Timed, Lt, Cudnn };
ConvPath conv_path_from_environment();

// Counts a convolution whose launch runs on cuDNN (cudnn_convolutions_chosen() in cuda_backend.h reads it).
void count_cudnn_convolution_chosen();

}  // namespace npusim::cuda
