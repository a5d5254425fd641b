#include "backends/cuda/cache_prefetch.h"

#include <algorithm>
#include <optional>

#include "backends/cuda/cuda_util.h"
#include "ops/op_util.h"

namespace npusim::cuda {
namespace {

// The matrix product (a linear, usually) that computes an attention's query, through at most a few ops between (view,
// transpose, rope); nothing when there is none.
std::optional<size_t> query_projection(const Graph& graph, const Node& attention) {
  constexpr int kMostSteps = 8;
  ValueId id = attention.inputs[0];
  for (int step = 0; step < kMostSteps; ++step) {
    const int producer = graph.value(id).producer;
    if (producer < 0) return std::nullopt;
    const Node& node = graph.nodes[static_cast<size_t>(producer)];
    if (ops::is_matrix_product(node.op)) return static_cast<size_t>(producer);
    if (node.inputs.empty()) return std::nullopt;
    id = node.inputs[0];
  }
  return std::nullopt;
}

}  // namespace

std::vector<SideLaunch> plan_cache_prefetches(const Graph& graph, const std::vector<size_t>& kernel_nodes,
                                              const std::function<OpContext(size_t)>& context_of) {
  std::vector<SideLaunch> side;
  for (size_t i = 0; i < kernel_nodes.size(); ++i) {
    const Node& node = graph.nodes[kernel_nodes[i]];
    if (node.op != "attention") continue;
    const std::optional<size_t> projection = query_projection(graph, node);
    if (!projection) continue;
    std::optional<Launch> launch = cache_prefetch_launch(context_of(kernel_nodes[i]));
    if (!launch) continue;
    // The last launch at or before the projection: the projection's own, or the one before it where the projection
    // is fused into a launch standing at a later node.
    size_t start = 0;
    for (size_t j = 0; j < i; ++j)
      if (kernel_nodes[j] <= *projection) start = j;
    side.push_back({start, std::move(*launch)});
  }
  std::stable_sort(side.begin(), side.end(),
                   [](const SideLaunch& a, const SideLaunch& b) { return a.before_kernel < b.before_kernel; });
  return side;
}

SideStream::SideStream(const std::string& where) : where_(where) {
  NPUSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where_ + ": creating a second stream");
  NPUSIM_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming), where_ + ": creating a fork event");
  NPUSIM_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming), where_ + ": creating a join event");
}

SideStream::~SideStream() {
  if (joined_) cudaEventDestroy(joined_);
  if (forked_) cudaEventDestroy(forked_);
  if (stream_) cudaStreamDestroy(stream_);
}

void SideStream::fork(cudaStream_t main) {
  NPUSIM_CUDA_CHECK(cudaEventRecord(forked_, main), where_ + ": forking to the second stream");
  NPUSIM_CUDA_CHECK(cudaStreamWaitEvent(stream_, forked_, 0), where_ + ": forking to the second stream");
}

void SideStream::join(cudaStream_t main) {
  NPUSIM_CUDA_CHECK(cudaEventRecord(joined_, stream_), where_ + ": joining the second stream");
  NPUSIM_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0), where_ + ": joining the second stream");
}

}  // namespace npusim::cuda
