#pragma once
// Decode attention reads its whole key/value cache every step. The cache rows it will read are fetched into L2 on a
// second stream from the kernel that computes its query (the projection GEMV) on, so that the cache's reads overlap
// the kernels between instead of following them.
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace npusim::cuda {

// A launch for the second stream, started when the main stream reaches launch `before_kernel`.
struct SideLaunch {
  size_t before_kernel;
  Launch launch;
};

// The cache prefetches of a program's decode attention nodes; `kernel_nodes` holds the node each main-stream launch
// stands at, in launch order. Sorted by before_kernel.
std::vector<SideLaunch> plan_cache_prefetches(const Graph& graph, const std::vector<size_t>& kernel_nodes,
                                              const std::function<OpContext(size_t)>& context_of);

// A second stream whose work forks from the main stream and joins back into it (inside a graph capture as well).
class SideStream {
 public:
  explicit SideStream(const std::string& where);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t stream() const { return stream_; }
  // The side stream waits for the work enqueued on `main` so far.
  void fork(cudaStream_t main);
  // `main` waits for the work enqueued on the side stream so far.
  void join(cudaStream_t main);

 private:
  std::string where_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
};

}  // namespace npusim::cuda
