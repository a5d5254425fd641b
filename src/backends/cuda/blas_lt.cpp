#include "backends/cuda/blas_lt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#include "backends/cuda/cuda_util.h"
#include "npusim/error.h"

namespace npusim::cuda {

struct Blas::Api {
  cublasStatus_t (*create)(cublasLtHandle_t*);
  const char* (*status_string)(cublasStatus_t);
  cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t);
  cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*, size_t);
  cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t);
  cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*layout_set)(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void*, size_t);
  cublasStatus_t (*preference_create)(cublasLtMatmulPreference_t*);
  cublasStatus_t (*preference_destroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*preference_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void*,
                                   size_t);
  cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                              cublasLtMatmulHeuristicResult_t[], int*);
  cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
                           const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t, void*,
                           cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t);
};

// The descriptors of one plan: the matmul (epilogue and bias pointer included), and the layouts of A, B and of
// C and D (one layout: C is read in D's place).
struct GemmPlan::Descriptors {
  const Blas::Api* api = nullptr;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;

  ~Descriptors() {
    if (matmul) api->desc_destroy(matmul);
    for (cublasLtMatrixLayout_t layout : {a, b, cd})
      if (layout) api->layout_destroy(layout);
  }
};

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kCandidates = 16;

cudaDataType data_type(int elem) {
  switch (elem) {
    case kF16:
      return CUDA_R_16F;
    case kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

struct Choice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  double milliseconds = 0.0;
};

ChoiceCache<Choice>& choice_cache() {
  static ChoiceCache<Choice> cache;
  return cache;
}

const char* bias_name(GemmSpec::Bias bias) {
  switch (bias) {
    case GemmSpec::Bias::PerColumn:
      return "bias/col";
    case GemmSpec::Bias::PerRow:
      return "bias/row";
    default:
      return "nobias";
  }
}

}  // namespace

bool gemm_tuning_enabled() { return !environment_is("NPUSIM_CUDA_GEMM_TUNE", "0"); }

namespace {

// Twice the L2 cache, overwritten before each timed launch so that it starts cold, as a layer's weights do in a
// real run (back to back, the same GEMM would find its operands in L2).
const DeviceBuffer& cache_flush_buffer(const std::string& where) {
  static std::once_flag once;
  static DeviceBuffer* buffer = nullptr;
  std::call_once(once, [&] {
    int device = 0, l2_bytes = 0;
    NPUSIM_CUDA_CHECK(cudaGetDevice(&device), where + ": timing a GEMM");
    NPUSIM_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), where + ": timing a GEMM");
    buffer = new DeviceBuffer(2 * static_cast<size_t>(std::max(l2_bytes, 1 << 20)), "flushing the L2 cache");
  });
  return *buffer;
}

}  // namespace

double time_on_stream(cudaStream_t stream, const std::function<void()>& launch, const std::string& where) {
  constexpr int kRepetitions = 5;
  const std::string what = where + ": timing a GEMM";
  const DeviceBuffer& flush = cache_flush_buffer(where);
  cudaEvent_t start = nullptr, stop = nullptr;
  NPUSIM_CUDA_CHECK(cudaEventCreate(&start), what);
  const cudaError_t created = cudaEventCreate(&stop);
  if (created != cudaSuccess) cudaEventDestroy(start);
  NPUSIM_CUDA_CHECK(created, what);
  auto release = [&] {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  };
  std::vector<float> times;
  try {
    launch();  // warm-up: first-use costs (module loading) stay out of the times
    for (int i = 0; i < kRepetitions; ++i) {
      NPUSIM_CUDA_CHECK(cudaMemsetAsync(flush.data(), i, flush.size(), stream), what);
      NPUSIM_CUDA_CHECK(cudaEventRecord(start, stream), what);
      launch();
      NPUSIM_CUDA_CHECK(cudaEventRecord(stop, stream), what);
      NPUSIM_CUDA_CHECK(cudaEventSynchronize(stop), what);
      float milliseconds = 0.0f;
      NPUSIM_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop), what);
      times.push_back(milliseconds);
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Blas* Blas::instance() {
  static std::once_flag once;
  static Blas* blas = nullptr;
  std::call_once(once, [] {
    if (environment_is("NPUSIM_CUDA_NO_CUBLAS", "1")) return;
    void* library = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!library) library = dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
    if (!library) return;
    auto api = std::make_unique<Api>();
    const bool complete = resolve_symbol(library, "cublasLtCreate", api->create) &&
                          resolve_symbol(library, "cublasLtGetStatusString", api->status_string) &&
                          resolve_symbol(library, "cublasLtMatmulDescCreate", api->desc_create) &&
                          resolve_symbol(library, "cublasLtMatmulDescDestroy", api->desc_destroy) &&
                          resolve_symbol(library, "cublasLtMatmulDescSetAttribute", api->desc_set) &&
                          resolve_symbol(library, "cublasLtMatrixLayoutCreate", api->layout_create) &&
                          resolve_symbol(library, "cublasLtMatrixLayoutDestroy", api->layout_destroy) &&
                          resolve_symbol(library, "cublasLtMatrixLayoutSetAttribute", api->layout_set) &&
                          resolve_symbol(library, "cublasLtMatmulPreferenceCreate", api->preference_create) &&
                          resolve_symbol(library, "cublasLtMatmulPreferenceDestroy", api->preference_destroy) &&
                          resolve_symbol(library, "cublasLtMatmulPreferenceSetAttribute", api->preference_set) &&
                          resolve_symbol(library, "cublasLtMatmulAlgoGetHeuristic", api->heuristic) &&
                          resolve_symbol(library, "cublasLtMatmul", api->matmul);
    if (!complete) return;
    cublasLtHandle_t handle = nullptr;
    if (api->create(&handle) != CUBLAS_STATUS_SUCCESS) return;
    // A fixed workspace, so that no GEMM allocates while a CUDA graph is being captured.
    void* workspace = nullptr;
    if (cudaMalloc(&workspace, kWorkspaceBytes) != cudaSuccess) return;
    blas = new Blas();  // lives for the whole process, like the CUDA context
    blas->api_ = std::move(api);
    blas->handle_ = handle;
    blas->workspace_ = workspace;
  });
  return blas;
}

GemmPlan::~GemmPlan() = default;

void GemmPlan::run(cudaStream_t stream, const GemmOperands& operands, const std::string& where) const {
  const Descriptors& d = *descriptors_;
  const float alpha = 1.0f;
  const void* c = beta_ != 0.0f ? operands.c : operands.d;
  const void* lt_a = row_order_ ? operands.a : operands.b;
  const void* lt_b = row_order_ ? operands.b : operands.a;
  const cublasStatus_t status = d.api->matmul(d.handle, d.matmul, &alpha, lt_a, d.a, lt_b, d.b, &beta_, c, d.cd,
                                              operands.d, d.cd, &d.algo, d.workspace, d.workspace_bytes, stream);
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuda backend: " + where + ": cublasLtMatmul failed: " + d.api->status_string(status));
}

std::shared_ptr<const GemmPlan> Blas::plan(const GemmSpec& spec, const GemmOperands& operands, cudaStream_t stream,
                                           const std::string& where) {
  auto check = [&](cublasStatus_t status, const char* call) {
    if (status != CUBLAS_STATUS_SUCCESS)
      fail("cuda backend: " + where + ": " + call + " failed: " + api_->status_string(status));
  };
  const bool row_order = spec.bias == GemmSpec::Bias::PerRow;
  const cudaDataType type = data_type(spec.elem);
  const int64_t bytes = element_bytes(spec.elem);

  std::shared_ptr<GemmPlan> plan(new GemmPlan());
  plan->operands_ = operands;
  plan->beta_ = spec.accumulate ? 1.0f : 0.0f;
  plan->row_order_ = row_order;
  plan->descriptors_ = std::make_unique<GemmPlan::Descriptors>();
  GemmPlan::Descriptors& d = *plan->descriptors_;
  d.api = api_.get();
  d.handle = static_cast<cublasLtHandle_t>(handle_);
  d.workspace = workspace_;

  // Row order: D[rows, cols] = A · op(B) as written. Column order (cuBLASLt's own): the same bytes are
  // Dᵀ[cols, rows] = op(B)ᵀ · Aᵀ, so Lt's A is our B and Lt's B our A.
  struct Layout {
    uint64_t rows, cols;
    int64_t ld, batch_stride;
  };
  Layout lt_a, lt_b, lt_d;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  const auto r = static_cast<uint64_t>(spec.rows), c = static_cast<uint64_t>(spec.cols),
             k = static_cast<uint64_t>(spec.depth);
  if (row_order) {
    lt_a = {r, k, spec.depth, spec.a_batch_stride};
    lt_b = spec.b_transposed ? Layout{c, k, spec.depth, spec.b_batch_stride}
                             : Layout{k, c, spec.cols, spec.b_batch_stride};
    trans_b = spec.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_d = {r, c, spec.cols, spec.d_batch_stride};
  } else {
    lt_a = spec.b_transposed ? Layout{k, c, spec.depth, spec.b_batch_stride}
                             : Layout{c, k, spec.cols, spec.b_batch_stride};
    trans_a = spec.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_b = {k, r, spec.depth, spec.a_batch_stride};
    lt_d = {c, r, spec.cols, spec.d_batch_stride};
  }
  auto make_layout = [&](const Layout& layout, cublasLtMatrixLayout_t& made) {
    check(api_->layout_create(&made, type, layout.rows, layout.cols, layout.ld), "cublasLtMatrixLayoutCreate");
    if (row_order) {
      const int32_t order = CUBLASLT_ORDER_ROW;
      check(api_->layout_set(made, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order),
            "cublasLtMatrixLayoutSetAttribute(ORDER)");
    }
    if (spec.batch > 1) {
      const auto count = static_cast<int32_t>(spec.batch);
      check(api_->layout_set(made, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
            "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
      check(api_->layout_set(made, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &layout.batch_stride,
                             sizeof layout.batch_stride),
            "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  };
  make_layout(lt_a, d.a);
  make_layout(lt_b, d.b);
  make_layout(lt_d, d.cd);

  check(api_->desc_create(&d.matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const auto op_a = static_cast<int32_t>(trans_a), op_b = static_cast<int32_t>(trans_b);
  check(api_->desc_set(d.matmul, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
        "cublasLtMatmulDescSetAttribute(TRANSA)");
  check(api_->desc_set(d.matmul, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
        "cublasLtMatmulDescSetAttribute(TRANSB)");
  const bool bias = spec.bias != GemmSpec::Bias::None;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias && spec.relu)
    epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;
  else if (bias)
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  else if (spec.relu)
    epilogue = CUBLASLT_EPILOGUE_RELU;
  check(api_->desc_set(d.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
        "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (bias)
    check(api_->desc_set(d.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &operands.bias, sizeof operands.bias),
          "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");

  const bool batched = spec.batch > 1;
  const uint32_t align_a = address_alignment(operands.a, batched ? spec.a_batch_stride * bytes : 0);
  const uint32_t align_b = address_alignment(operands.b, batched ? spec.b_batch_stride * bytes : 0);
  const uint32_t align_d = address_alignment(operands.d, batched ? spec.d_batch_stride * bytes : 0);
  const uint32_t align_c =
      spec.accumulate ? address_alignment(operands.c, batched ? spec.d_batch_stride * bytes : 0) : align_d;
  const uint32_t align_bias = bias ? address_alignment(operands.bias, 0) : 256u;
  const bool tune = gemm_tuning_enabled();
  const std::string key =
      std::to_string(spec.rows) + "x" + std::to_string(spec.cols) + "x" + std::to_string(spec.depth) + " b" +
      std::to_string(spec.batch) + "/" + std::to_string(spec.a_batch_stride) + "/" +
      std::to_string(spec.b_batch_stride) + "/" + std::to_string(spec.d_batch_stride) + " e" +
      std::to_string(spec.elem) + (spec.b_transposed ? " bT " : " bN ") + bias_name(spec.bias) +
      (spec.accumulate ? " acc" : "") + (spec.relu ? " relu" : "") + " align " + std::to_string(align_a) + "/" +
      std::to_string(align_b) + "/" + std::to_string(align_c) + "/" + std::to_string(align_d) + "/" +
      std::to_string(align_bias) + (tune ? " tuned" : " first");

  if (const std::optional<Choice> cached = choice_cache().find(key)) {
    if (!cached->found) return nullptr;
    d.algo = cached->algo;
    d.workspace_bytes = cached->workspace_bytes;
    plan->milliseconds_ = cached->milliseconds;
    return plan;
  }

  cublasLtMatmulPreference_t preference = nullptr;
  check(api_->preference_create(&preference), "cublasLtMatmulPreferenceCreate");
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCandidates);
  int returned = 0;
  try {
    auto set = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value, const char* call) {
      check(api_->preference_set(preference, attribute, &value, sizeof value), call);
    };
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes},
        "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    // Split-K partial sums stay in fp32: summed in 16-bit storage they would lose precision.
    if (spec.elem != kF32)
      set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE},
          "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, row_order ? align_a : align_b,
        "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, row_order ? align_b : align_a,
        "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c,
        "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)");
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d,
        "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)");
    const cublasStatus_t status =
        api_->heuristic(d.handle, d.matmul, d.a, d.b, d.cd, d.cd, preference, kCandidates, results.data(), &returned);
    // NOT_SUPPORTED: no algorithm at all for this problem (e.g. an epilogue in row order); the caller falls back.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check(status, "cublasLtMatmulAlgoGetHeuristic");
    if (status != CUBLAS_STATUS_SUCCESS) returned = 0;
  } catch (...) {
    api_->preference_destroy(preference);
    throw;
  }
  api_->preference_destroy(preference);

  std::vector<const cublasLtMatmulHeuristicResult_t*> candidates;
  for (int i = 0; i < returned; ++i)
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS &&
        results[static_cast<size_t>(i)].workspaceSize <= kWorkspaceBytes)
      candidates.push_back(&results[static_cast<size_t>(i)]);

  Choice choice;
  double first_ms = 0.0;
  size_t chosen_index = 0;
  if (!candidates.empty() && !tune) {
    choice = {true, candidates[0]->algo, candidates[0]->workspaceSize, 0.0};
  } else {
    double best = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < candidates.size(); ++i) {
      d.algo = candidates[i]->algo;
      d.workspace_bytes = candidates[i]->workspaceSize;
      double ms = std::numeric_limits<double>::infinity();
      try {
        ms = time_on_stream(
            stream, [&] { plan->run(stream, where); }, where);
      } catch (const Error&) {
        // A candidate that refuses these operands is skipped; the others still compete.
        cudaGetLastError();
      }
      if (i == 0) first_ms = ms;
      if (ms < best) {
        best = ms;
        chosen_index = i;
        choice = {true, candidates[i]->algo, candidates[i]->workspaceSize, ms};
      }
    }
  }
  if (environment_is("NPUSIM_CUDA_GEMM_LOG", "1"))
    std::fprintf(stderr, "npusim gemm: %s (%s): %s order, %zu candidates, first %.4f ms, chosen #%zu %.4f ms\n",
                 key.c_str(), where.c_str(), row_order ? "row" : "column", candidates.size(), first_ms, chosen_index,
                 choice.milliseconds);
  choice_cache().store(key, choice);
  if (!choice.found) return nullptr;
  d.algo = choice.algo;
  d.workspace_bytes = choice.workspace_bytes;
  plan->milliseconds_ = choice.milliseconds;
  return plan;
}

}  // namespace npusim::cuda
