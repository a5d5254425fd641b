#include "backends/cuda/cudnn_conv.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#include "backends/cuda/blas_lt.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_util.h"
#include "npusim/error.h"

// The few types and values of cuDNN 9's legacy API used here, declared by hand: the backend builds where cuDNN is
// not installed, and resolves the functions at run time. Checked against the real header where there is one.
namespace npusim::cuda::dnn {

using Status = int;
using Handle = struct cudnnContext*;
using TensorDescriptor = struct cudnnTensorStruct*;
using FilterDescriptor = struct cudnnFilterStruct*;
using ConvolutionDescriptor = struct cudnnConvolutionStruct*;
using ActivationDescriptor = struct cudnnActivationStruct*;

constexpr Status kSuccess = 0;
constexpr int kDataFloat = 0, kDataHalf = 2, kDataBFloat16 = 9;
constexpr int kTensorNchw = 0;
constexpr int kCrossCorrelation = 1;
constexpr int kTensorOpMath = 1, kFmaMath = 3;
constexpr int kActivationRelu = 1, kActivationIdentity = 5;
constexpr int kNotPropagateNan = 0;
constexpr int kAlgoImplicitPrecompGemm = 1, kAlgoFft = 4, kAlgoFftTiling = 5, kAlgoWinogradNonfused = 7;
constexpr int kAlgoCount = 8;

struct AlgoPerf {
  int algo;
  Status status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
};

}  // namespace npusim::cuda::dnn

#if __has_include(<cudnn.h>)
#include <cudnn.h>
namespace npusim::cuda::dnn {
static_assert(kSuccess == CUDNN_STATUS_SUCCESS && kDataFloat == CUDNN_DATA_FLOAT && kDataHalf == CUDNN_DATA_HALF &&
              kDataBFloat16 == CUDNN_DATA_BFLOAT16 && kTensorNchw == CUDNN_TENSOR_NCHW &&
              kCrossCorrelation == CUDNN_CROSS_CORRELATION && kTensorOpMath == CUDNN_TENSOR_OP_MATH &&
              kFmaMath == CUDNN_FMA_MATH && kActivationRelu == CUDNN_ACTIVATION_RELU &&
              kActivationIdentity == CUDNN_ACTIVATION_IDENTITY && kNotPropagateNan == CUDNN_NOT_PROPAGATE_NAN &&
              kAlgoImplicitPrecompGemm == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM &&
              kAlgoFft == CUDNN_CONVOLUTION_FWD_ALGO_FFT && kAlgoFftTiling == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
              kAlgoWinogradNonfused == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED &&
              kAlgoCount == CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
static_assert(sizeof(AlgoPerf) == sizeof(cudnnConvolutionFwdAlgoPerf_t) &&
              offsetof(AlgoPerf, status) == offsetof(cudnnConvolutionFwdAlgoPerf_t, status) &&
              offsetof(AlgoPerf, memory) == offsetof(cudnnConvolutionFwdAlgoPerf_t, memory) &&
              offsetof(AlgoPerf, math_type) == offsetof(cudnnConvolutionFwdAlgoPerf_t, mathType));
}  // namespace npusim::cuda::dnn
#endif

namespace npusim::cuda {

using namespace dnn;

struct Cudnn::Api {
  size_t (*get_version)();
  const char* (*error_string)(Status);
  Status (*create)(Handle*);
  Status (*set_stream)(Handle, cudaStream_t);
  Status (*create_tensor)(TensorDescriptor*);
  Status (*destroy_tensor)(TensorDescriptor);
  Status (*set_tensor_4d)(TensorDescriptor, int format, int type, int n, int c, int h, int w);
  Status (*create_filter)(FilterDescriptor*);
  Status (*destroy_filter)(FilterDescriptor);
  Status (*set_filter_4d)(FilterDescriptor, int type, int format, int k, int c, int h, int w);
  Status (*create_convolution)(ConvolutionDescriptor*);
  Status (*destroy_convolution)(ConvolutionDescriptor);
  Status (*set_convolution_2d)(ConvolutionDescriptor, int pad_h, int pad_w, int stride_h, int stride_w, int dilation_h,
                               int dilation_w, int mode, int compute_type);
  Status (*set_math_type)(ConvolutionDescriptor, int);
  Status (*set_group_count)(ConvolutionDescriptor, int);
  Status (*output_dim)(ConvolutionDescriptor, TensorDescriptor, FilterDescriptor, int*, int*, int*, int*);
  Status (*create_activation)(ActivationDescriptor*);
  Status (*destroy_activation)(ActivationDescriptor);
  Status (*set_activation)(ActivationDescriptor, int mode, int nan_propagation, double coefficient);
  Status (*algorithms)(Handle, TensorDescriptor, FilterDescriptor, ConvolutionDescriptor, TensorDescriptor, int, int*,
                       AlgoPerf*);
  Status (*forward)(Handle, const void* alpha, TensorDescriptor, const void* x, FilterDescriptor, const void* w,
                    ConvolutionDescriptor, int algo, void* workspace, size_t workspace_bytes, const void* beta,
                    TensorDescriptor, void* y);
  Status (*bias_activation_forward)(Handle, const void* alpha1, TensorDescriptor, const void* x, FilterDescriptor,
                                    const void* w, ConvolutionDescriptor, int algo, void* workspace,
                                    size_t workspace_bytes, const void* alpha2, TensorDescriptor, const void* z,
                                    TensorDescriptor, const void* bias, ActivationDescriptor, TensorDescriptor,
                                    void* y);
};

// The descriptors of one plan (x, w, y and z share y's; the bias [1, Cout, 1, 1]) and, for a fused plan, the
// activation and a zero bias when the node has none (cuDNN's fused call always adds one).
struct CudnnConvolution::Descriptors {
  const Cudnn::Api* api = nullptr;
  Handle handle = nullptr;
  TensorDescriptor x = nullptr, y = nullptr, bias = nullptr;
  FilterDescriptor w = nullptr;
  ConvolutionDescriptor convolution = nullptr;
  ActivationDescriptor activation = nullptr;
  std::unique_ptr<DeviceBuffer> zero_bias;

  ~Descriptors() {
    for (TensorDescriptor tensor : {x, y, bias})
      if (tensor) api->destroy_tensor(tensor);
    if (w) api->destroy_filter(w);
    if (convolution) api->destroy_convolution(convolution);
    if (activation) api->destroy_activation(activation);
  }
};

namespace {

// Algorithms whose workspace is larger are not considered (FFT at large batches asks for gigabytes).
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

int data_type(int elem) {
  switch (elem) {
    case kF16:
      return kDataHalf;
    case kBF16:
      return kDataBFloat16;
    default:
      return kDataFloat;
  }
}

// 16-bit storage keeps to the GEMM-like and fused Winograd algorithms: the FFT and non-fused Winograd ones may hold
// their transforms in 16 bits, a precaution (not measured here) for the tolerance of a direct sum.
bool algorithm_allowed(int algo, int elem) {
  if (elem == kF32) return true;
  return algo != kAlgoFft && algo != kAlgoFftTiling && algo != kAlgoWinogradNonfused;
}

bool fits_int(int64_t value) { return value >= 0 && value <= std::numeric_limits<int>::max(); }

struct Choice {
  bool found = false;
  int algo = 0;
  size_t workspace_bytes = 0;
  double milliseconds = 0.0;
};

ChoiceCache<Choice>& choice_cache() {
  static ChoiceCache<Choice> cache;
  return cache;
}

std::string problem_key(const CudnnConvRequest& r, bool fused) {
  const ConvParams& p = r.p;
  std::string key;
  auto append = [&key](int64_t value, char separator) {
    key += std::to_string(value);
    key += separator;
  };
  for (const int64_t v : {p.batch, p.in_channels, p.in_h, p.in_w, p.out_channels, p.out_h, p.out_w, p.kernel_h,
                          p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups})
    append(v, ',');
  append(r.elem, ' ');
  if (fused) {
    key += "fused";
    if (r.bias.data) key += " bias";
    if (r.residual.data) key += " residual";
    if (p.activation == UnaryOp::Relu) key += " relu";
  }
  key += " align ";
  for (const void* pointer : {r.x, r.w, static_cast<const void*>(r.y)}) append(address_alignment(pointer), '/');
  if (fused && r.residual.data) append(address_alignment(r.residual.data), '/');
  return key;
}

std::atomic<size_t> chosen_count{0};

}  // namespace

ConvPath conv_path_from_environment() {
  const char* text = std::getenv("NPUSIM_CUDA_CONV");
  if (!text) return ConvPath::Timed;
  const std::string path(text);
  if (path == "lt") return ConvPath::Lt;
  if (path == "cudnn") return ConvPath::Cudnn;
  return ConvPath::Timed;
}

bool cudnn_available() { return Cudnn::instance() != nullptr; }
size_t cudnn_convolutions_chosen() { return chosen_count.load(); }
void count_cudnn_convolution_chosen() { ++chosen_count; }

Cudnn::~Cudnn() = default;

Cudnn* Cudnn::instance() {
  static std::once_flag once;
  static Cudnn* cudnn = nullptr;
  std::call_once(once, [] {
    if (environment_is("NPUSIM_CUDA_NO_CUDNN", "1")) return;
    try {
      ensure_device();  // the handle belongs to the backend's device
    } catch (const Error&) {
      return;
    }
    void* library = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!library) return;
    auto api = std::make_unique<Api>();
    const bool complete =
        resolve_symbol(library, "cudnnGetVersion", api->get_version) &&
        resolve_symbol(library, "cudnnGetErrorString", api->error_string) &&
        resolve_symbol(library, "cudnnCreate", api->create) &&
        resolve_symbol(library, "cudnnSetStream", api->set_stream) &&
        resolve_symbol(library, "cudnnCreateTensorDescriptor", api->create_tensor) &&
        resolve_symbol(library, "cudnnDestroyTensorDescriptor", api->destroy_tensor) &&
        resolve_symbol(library, "cudnnSetTensor4dDescriptor", api->set_tensor_4d) &&
        resolve_symbol(library, "cudnnCreateFilterDescriptor", api->create_filter) &&
        resolve_symbol(library, "cudnnDestroyFilterDescriptor", api->destroy_filter) &&
        resolve_symbol(library, "cudnnSetFilter4dDescriptor", api->set_filter_4d) &&
        resolve_symbol(library, "cudnnCreateConvolutionDescriptor", api->create_convolution) &&
        resolve_symbol(library, "cudnnDestroyConvolutionDescriptor", api->destroy_convolution) &&
        resolve_symbol(library, "cudnnSetConvolution2dDescriptor", api->set_convolution_2d) &&
        resolve_symbol(library, "cudnnSetConvolutionMathType", api->set_math_type) &&
        resolve_symbol(library, "cudnnSetConvolutionGroupCount", api->set_group_count) &&
        resolve_symbol(library, "cudnnGetConvolution2dForwardOutputDim", api->output_dim) &&
        resolve_symbol(library, "cudnnCreateActivationDescriptor", api->create_activation) &&
        resolve_symbol(library, "cudnnDestroyActivationDescriptor", api->destroy_activation) &&
        resolve_symbol(library, "cudnnSetActivationDescriptor", api->set_activation) &&
        resolve_symbol(library, "cudnnGetConvolutionForwardAlgorithm_v7", api->algorithms) &&
        resolve_symbol(library, "cudnnConvolutionForward", api->forward) &&
        resolve_symbol(library, "cudnnConvolutionBiasActivationForward", api->bias_activation_forward);
    if (!complete) return;
    const size_t version = api->get_version();
    if (version < 90000 || version >= 100000) return;
    Handle handle = nullptr;
    if (api->create(&handle) != kSuccess) return;
    cudnn = new Cudnn();  // lives for the whole process, like the CUDA context
    cudnn->api_ = std::move(api);
    cudnn->handle_ = handle;
  });
  return cudnn;
}

bool Cudnn::can_fuse(const CudnnConvRequest& r) {
  const bool something = r.bias.data || r.residual.data || r.p.activation == UnaryOp::Relu;
  return something && !r.p.use_clamp && (r.p.activation == UnaryOp::Identity || r.p.activation == UnaryOp::Relu) &&
         (!r.bias.data || r.bias.elem == r.elem) && (!r.residual.data || r.residual.elem == r.elem);
}

CudnnConvolution::~CudnnConvolution() = default;

void CudnnConvolution::run(cudaStream_t stream, void* workspace, const std::string& where) const {
  const Descriptors& d = *descriptors_;
  auto check = [&](Status status, const char* call) {
    if (status != kSuccess) fail("cuda backend: " + where + ": " + call + " failed: " + d.api->error_string(status));
  };
  check(d.api->set_stream(d.handle, stream), "cudnnSetStream");
  const CudnnConvRequest& r = request_;
  const float one = 1.0f, zero = 0.0f;
  if (!fused_) {
    check(d.api->forward(d.handle, &one, d.x, r.x, d.w, r.w, d.convolution, algorithm_, workspace, workspace_bytes_,
                         &zero, d.y, r.y),
          "cudnnConvolutionForward");
    return;
  }
  // y = act(conv(x) + alpha2 · z + bias); without a residual z is y itself with alpha2 = 0, which cuDNN skips.
  const float alpha2 = r.residual.data ? 1.0f : 0.0f;
  const void* z = r.residual.data ? r.residual.data : r.y;
  const void* bias = r.bias.data ? r.bias.data : d.zero_bias->data();
  check(d.api->bias_activation_forward(d.handle, &one, d.x, r.x, d.w, r.w, d.convolution, algorithm_, workspace,
                                       workspace_bytes_, &alpha2, d.y, z, d.bias, bias, d.activation, d.y, r.y),
        "cudnnConvolutionBiasActivationForward");
}

std::shared_ptr<const CudnnConvolution> Cudnn::plan(const CudnnConvRequest& request, bool fused, cudaStream_t stream,
                                                    const std::string& where) {
  const ConvParams& p = request.p;
  if (fused && !can_fuse(request)) return nullptr;
  if (p.groups < 1 || p.in_channels % p.groups != 0 || p.out_channels % p.groups != 0) return nullptr;
  const int64_t in_elems = p.batch * p.in_channels * p.in_h * p.in_w,
                out_elems = p.batch * p.out_channels * p.out_h * p.out_w;
  for (const int64_t v : {p.batch, p.in_channels, p.in_h, p.in_w, p.out_channels, p.kernel_h, p.kernel_w, p.stride_h,
                          p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups, in_elems, out_elems})
    if (!fits_int(v)) return nullptr;
  if (in_elems == 0 || out_elems == 0 || p.kernel_h * p.kernel_w * p.in_channels == 0) return nullptr;

  auto check = [&](Status status, const char* call) {
    if (status != kSuccess) fail("cuda backend: " + where + ": " + call + " failed: " + api_->error_string(status));
  };
  std::shared_ptr<CudnnConvolution> plan(new CudnnConvolution());
  plan->request_ = request;
  plan->fused_ = fused;
  plan->descriptors_ = std::make_unique<CudnnConvolution::Descriptors>();
  CudnnConvolution::Descriptors& d = *plan->descriptors_;
  d.api = api_.get();
  d.handle = static_cast<Handle>(handle_);
  const int type = data_type(request.elem);
  auto i = [](int64_t v) { return static_cast<int>(v); };

  check(api_->create_tensor(&d.x), "cudnnCreateTensorDescriptor");
  check(api_->set_tensor_4d(d.x, kTensorNchw, type, i(p.batch), i(p.in_channels), i(p.in_h), i(p.in_w)),
        "cudnnSetTensor4dDescriptor(x)");
  check(api_->create_filter(&d.w), "cudnnCreateFilterDescriptor");
  check(api_->set_filter_4d(d.w, type, kTensorNchw, i(p.out_channels), i(p.in_channels / p.groups), i(p.kernel_h),
                            i(p.kernel_w)),
        "cudnnSetFilter4dDescriptor");
  check(api_->create_convolution(&d.convolution), "cudnnCreateConvolutionDescriptor");
  check(api_->set_convolution_2d(d.convolution, i(p.pad_h), i(p.pad_w), i(p.stride_h), i(p.stride_w), i(p.dilation_h),
                                 i(p.dilation_w), kCrossCorrelation, kDataFloat),
        "cudnnSetConvolution2dDescriptor");
  // Tensor cores for 16-bit storage; fp32 stays on FMA kernels (TF32 would miss fp32's tolerance).
  check(api_->set_math_type(d.convolution, request.elem == kF32 ? kFmaMath : kTensorOpMath),
        "cudnnSetConvolutionMathType");
  check(api_->set_group_count(d.convolution, i(p.groups)), "cudnnSetConvolutionGroupCount");
  int n = 0, c = 0, h = 0, w = 0;
  check(api_->output_dim(d.convolution, d.x, d.w, &n, &c, &h, &w), "cudnnGetConvolution2dForwardOutputDim");
  if (n != p.batch || c != p.out_channels || h != p.out_h || w != p.out_w) return nullptr;
  check(api_->create_tensor(&d.y), "cudnnCreateTensorDescriptor");
  check(api_->set_tensor_4d(d.y, kTensorNchw, type, n, c, h, w), "cudnnSetTensor4dDescriptor(y)");
  if (fused) {
    check(api_->create_tensor(&d.bias), "cudnnCreateTensorDescriptor");
    check(api_->set_tensor_4d(d.bias, kTensorNchw, type, 1, c, 1, 1), "cudnnSetTensor4dDescriptor(bias)");
    check(api_->create_activation(&d.activation), "cudnnCreateActivationDescriptor");
    const int mode = p.activation == UnaryOp::Relu ? kActivationRelu : kActivationIdentity;
    check(api_->set_activation(d.activation, mode, kNotPropagateNan, 0.0), "cudnnSetActivationDescriptor");
    if (!request.bias.data) {
      const size_t bytes = static_cast<size_t>(c * element_bytes(request.elem));
      d.zero_bias = std::make_unique<DeviceBuffer>(bytes, where + ": cuDNN's zero bias");
      NPUSIM_CUDA_CHECK(cudaMemset(d.zero_bias->data(), 0, bytes), where + ": cuDNN's zero bias");
    }
  }

  const std::string key = problem_key(request, fused);
  if (const std::optional<Choice> cached = choice_cache().find(key)) {
    if (!cached->found) return nullptr;
    plan->algorithm_ = cached->algo;
    plan->workspace_bytes_ = cached->workspace_bytes;
    plan->milliseconds_ = cached->milliseconds;
    return plan;
  }

  AlgoPerf results[kAlgoCount] = {};
  int returned = 0;
  check(api_->algorithms(d.handle, d.x, d.w, d.convolution, d.y, kAlgoCount, &returned, results),
        "cudnnGetConvolutionForwardAlgorithm_v7");
  std::vector<const AlgoPerf*> candidates;
  size_t largest_workspace = 0;
  for (int k = 0; k < std::min(returned, kAlgoCount); ++k) {
    const AlgoPerf& result = results[k];
    if (result.status != kSuccess || result.memory > kMaxWorkspaceBytes ||
        !algorithm_allowed(result.algo, request.elem))
      continue;
    // The fused call without ReLU takes only the precomputed implicit GEMM.
    if (fused && p.activation != UnaryOp::Relu && result.algo != kAlgoImplicitPrecompGemm) continue;
    candidates.push_back(&result);
    largest_workspace = std::max(largest_workspace, result.memory);
  }

  Choice choice;
  if (!candidates.empty()) {
    const DeviceBuffer workspace(std::max<size_t>(largest_workspace, 256), where + ": cuDNN workspace for timing");
    double best = std::numeric_limits<double>::infinity();
    for (const AlgoPerf* candidate : candidates) {
      plan->algorithm_ = candidate->algo;
      plan->workspace_bytes_ = candidate->memory;
      double ms = std::numeric_limits<double>::infinity();
      try {
        ms = time_on_stream(
            stream, [&] { plan->run(stream, workspace.data(), where); }, where);
      } catch (const Error&) {
        // An algorithm that refuses this problem (or this fusion) is skipped; the others still compete.
        cudaGetLastError();
      }
      if (ms < best) {
        best = ms;
        choice = {true, candidate->algo, candidate->memory, ms};
      }
    }
    NPUSIM_CUDA_CHECK(cudaStreamSynchronize(stream), where + ": timing cuDNN algorithms");
  }
  if (environment_is("NPUSIM_CUDA_CONV_LOG", "1"))
    std::fprintf(stderr, "npusim cudnn: %s (%s): %zu candidates, chosen algo %d %.4f ms\n", key.c_str(), where.c_str(),
                 candidates.size(), choice.found ? choice.algo : -1, choice.milliseconds);
  choice_cache().store(key, choice);
  if (!choice.found) return nullptr;
  plan->algorithm_ = choice.algo;
  plan->workspace_bytes_ = choice.workspace_bytes;
  plan->milliseconds_ = choice.milliseconds;
  return plan;
}

}  // namespace npusim::cuda
