#pragma once
// The one small interface every backend implements. Everything expensive (kernel selection, parameter packing,
// allocation, weight conversion and upload) happens in `prepare`; `run` binds inputs, executes, and returns
// outputs without allocating on the hot path beyond the returned tensors.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "npusim/graph.h"
#include "npusim/tensor.h"
#include "program/program.h"
#include "runtime/reference_executor.h"

namespace npusim {

struct BackendCapabilities {
  std::string name;
  std::vector<DType> compute_dtypes;  // storage dtypes of floating activations it accepts
  std::vector<std::string> ops;       // canonical op names with a kernel
  bool reference_fallback = false;    // other registry ops still run, on the registry's reference implementation

  bool has_kernel(const std::string& op) const;
  // Whether the backend can run the op at all: a kernel, or the fallback for an op the registry knows.
  bool supports(const std::string& op) const;
};

// Per-kernel timing, filled when profiling is on.
struct KernelTiming {
  std::string node;
  std::string op;
  double milliseconds = 0.0;
};

// What preparing a program cost: wall time (binding weights, placing buffers, choosing kernels, packing and
// transforming weights) and the bytes of weights the backend laid out anew for its kernels.
struct PrepareCost {
  double milliseconds = 0.0;
  int64_t packed_bytes = 0;
  int64_t mapped_bytes = 0;        // of packed_bytes, mapped from packed-weights files instead of packed
  std::vector<std::string> notes;  // what became of the packed-weights files, one line each
};

class PreparedProgram {
 public:
  virtual ~PreparedProgram() = default;
  // Inputs by graph input name; outputs in graph output order, named, converted to fp32 for floats.
  virtual NamedTensors run(const std::map<std::string, Tensor>& inputs) = 0;
  virtual int64_t planned_bytes() const = 0;    // arena + persistent buffers from the memory plan
  virtual int64_t allocated_bytes() const = 0;  // what prepare actually allocated
  virtual PrepareCost prepare_cost() const { return {}; }
  virtual void set_profiling(bool on) = 0;
  virtual std::vector<KernelTiming> last_timings() const = 0;
  // Nodes that run the registry's reference implementation instead of a kernel, as "name (op)".
  virtual std::vector<std::string> fallback_nodes() const { return {}; }
  // Writes the weights this preparation packed for its kernels to the pack cache (BackendOptions::pack_cache), where
  // it did not map them from there; what became of them, one line each. Apart from prepare, so that a caller may
  // first deliver a result.
  virtual std::vector<std::string> keep_packed_weights() { return {}; }

  // State kept on the backend between runs (a KV cache). Each pair names a graph input and the graph output that
  // is its next value; the output then shares the input's persistent buffer, so a run updates it in place (an
  // index_copy writes only its new rows). Afterwards `run` takes state inputs only when they are to be replaced
  // (absent: the buffer keeps what the last run left, zeros at first) and returns only the other outputs.
  // With `share_with` (a program prepared by the same backend), inputs it already keeps as state use the same
  // buffers: the prefill and decode programs of one session update one cache.
  virtual void bind_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                          const PreparedProgram* share_with = nullptr) {
    (void)input_output_pairs;
    (void)share_with;
    fail("this backend cannot keep state between runs");
  }
  // A copy of the state kept for a graph input (fp32 for floats).
  virtual Tensor read_state(const std::string& input) const { fail("no state is kept for input '" + input + "'"); }
  // Replaces the state kept for a graph input (same shape, any dtype of the same kind).
  virtual void write_state(const std::string& input, const Tensor& value) {
    (void)value;
    fail("no state is kept for input '" + input + "'");
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendCapabilities capabilities() const = 0;
  // `weights` is the binding for program.graph (see WeightStore::bind), in any stored dtype.
  virtual std::unique_ptr<PreparedProgram> prepare(const Program& program,
                                                   const std::vector<std::pair<ValueId, Tensor>>& weights) = 0;
  // `prepare` with state bound from the start (see PreparedProgram::bind_state): no buffer is set aside for the
  // state values first.
  virtual std::unique_ptr<PreparedProgram> prepare_with_state(
      const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights,
      const std::vector<std::pair<std::string, std::string>>& state, const PreparedProgram* share_with = nullptr) {
    std::unique_ptr<PreparedProgram> prepared = prepare(program, weights);
    prepared->bind_state(state, share_with);
    return prepared;
  }
};

// How linear layers keep their weights: as stored, or quantized once at prepare time to symmetric int8 with fp32
// scales (per output channel, or per group of `quantization_group` input values when that is a multiple of 8).
enum class WeightQuantization : uint8_t { None, Int8 };

// What every backend is made with.
struct BackendOptions {
  int threads = 0;  // CPU threads counting the caller (the CPU backend, and host work of others); 0: all
  WeightQuantization weights = WeightQuantization::None;
  int64_t quantization_group = 0;  // 0: one scale per output channel
  // CPU backend: a directory where packed weights are kept between processes (see backends/cpu/pack_cache.h): prepare
  // maps what an earlier process kept there, PreparedProgram::keep_packed_weights writes what it packed.
  std::string pack_cache;
  // CPU backend: constant bf16 linear weights kept in 12 bits per value, without loss (backends/cpu/compact_bf16.h).
  bool compact_bf16 = false;
};

// "cpu" (the default) or "cuda". Fails naming the backend when it is unknown or not built in.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});

}  // namespace npusim
