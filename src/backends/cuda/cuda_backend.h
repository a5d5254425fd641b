#pragma once
// The CUDA backend: device memory (one arena per program, weights uploaded once at prepare), one stream, a CUDA
// kernel per node chosen at prepare time, nodes without one run on the host on the registry's reference (the
// prepared program lists them), and the whole run captured once into a CUDA graph and replayed when every node
// runs on the GPU.
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace npusim::cuda {

struct CudaOptions {
  // Fill all activation memory with 0xff bytes before every run (NaN for floats), so that an element a kernel
  // forgets to write shows in the outputs.
  bool poison_memory = false;
  // Capture the run into a CUDA graph after the first run and replay it ($NPUSIM_CUDA_GRAPHS=0 turns it off).
  bool use_graphs = true;
  // Fuse decode's one-row linears at prepare time: q/k/v as one GEMV, gate/up with the silu_mul, residual adds
  // into the GEMV ($NPUSIM_CUDA_FUSE=0 turns it off).
  bool fuse_kernels = true;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(CudaOptions options = {}) : options_(options) {}
  BackendCapabilities capabilities() const override;
  std::unique_ptr<PreparedProgram> prepare(const Program& program,
                                           const std::vector<std::pair<ValueId, Tensor>>& weights) override;
  std::unique_ptr<PreparedProgram> prepare_with_state(const Program& program,
                                                      const std::vector<std::pair<ValueId, Tensor>>& weights,
                                                      const std::vector<std::pair<std::string, std::string>>& state,
                                                      const PreparedProgram* share_with = nullptr) override;

 private:
  CudaOptions options_;
};

// Whether a prepared program of this backend runs as one CUDA graph launch: its captured kernels with the copies of
// its inputs and outputs (false before its second run).
bool replays_graph(const PreparedProgram& program);
// The nodes (kernels, memsets) of its captured kernels' graph, without the run's copies; 0 before capture.
size_t captured_graph_nodes(const PreparedProgram& program);
// The launches it runs on its second stream beside the main one (the cache prefetches of decode attention).
size_t side_launches(const PreparedProgram& program);
// The device time of one replay of its captured graph (inputs as the last run left them, no copies in or out, no
// host synchronization between replays), in milliseconds over `replays` back-to-back replays; fails before capture.
double graph_replay_milliseconds(PreparedProgram& program, int replays);
// Why its run could not be captured into a CUDA graph (it then runs launch by launch) or its copies not wrapped
// around that graph (they are then enqueued on their own); empty when both were done or not yet tried.
std::string graph_capture_failure(const PreparedProgram& program);

// Whether convolutions may run on cuDNN here (libcudnn.so.9 loaded), and how many convolutions of the programs
// prepared so far in this process run on it.
bool cudnn_available();
size_t cudnn_convolutions_chosen();

// The GPU the backend runs on, as "NAME (sm_XY)"; fails with "cuda backend: no CUDA device: ..." without one.
std::string gpu_name();

}  // namespace npusim::cuda
