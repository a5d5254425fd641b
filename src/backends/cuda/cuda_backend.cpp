#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "backends/cuda/cache_prefetch.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/device_kernels.h"
#include "backends/cuda/fusion_planner.h"
#include "compiler/graph_edit.h"
#include "npusim/op_registry.h"
#include "runtime/state_pairs.h"
#include "runtime/weight_transforms.h"

namespace npusim::cuda {

namespace {

using compiler::Placement;
using cpu::storage_elem;

constexpr size_t kAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

DType storage_dtype(Elem elem) {
  switch (elem) {
    case Elem::F32:
      return DType::Float32;
    case Elem::F16:
      return DType::Float16;
    case Elem::BF16:
      return DType::BFloat16;
    case Elem::I64:
      return DType::Int64;
    case Elem::Bool:
      return DType::Bool;
  }
  return DType::Float32;
}

std::string node_label(const Node& node) { return node.name + " (" + node.op + ")"; }

bool graphs_enabled_by_environment() { return !environment_is("NPUSIM_CUDA_GRAPHS", "0"); }

bool fusion_enabled_by_environment() { return !environment_is("NPUSIM_CUDA_FUSE", "0"); }

// Host bytes of a device value.
std::vector<std::byte> download(const std::byte* data, size_t bytes, cudaStream_t stream, const std::string& where) {
  std::vector<std::byte> host(bytes);
  if (bytes == 0) return host;
  NPUSIM_CUDA_CHECK(cudaMemcpyAsync(host.data(), data, bytes, cudaMemcpyDeviceToHost, stream), where);
  NPUSIM_CUDA_CHECK(cudaStreamSynchronize(stream), where);
  return host;
}

void upload(std::byte* data, const void* host, size_t bytes, cudaStream_t stream, const std::string& where) {
  if (bytes == 0) return;
  NPUSIM_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, stream), where);
  NPUSIM_CUDA_CHECK(cudaStreamSynchronize(stream), where);
}

// The node on the host: inputs copied down, the registry's reference, outputs copied back up.
Launch host_launch(const OpContext& ctx) {
  const Node* node = &ctx.node;
  std::vector<DeviceValue> inputs = ctx.inputs, outputs = ctx.outputs;
  return [node, inputs, outputs](cudaStream_t stream) {
    const std::string where = "node '" + node->name + "' (" + node->op + ") on the host";
    std::vector<Tensor> host_inputs;
    for (const DeviceValue& in : inputs) {
      const std::vector<std::byte> bytes = download(in.data, in.bytes(), stream, where);
      host_inputs.push_back(cpu::storage_to_tensor(bytes.data(), in.elem, in.meta.shape));
    }
    std::vector<TensorMeta> metas;
    for (const DeviceValue& out : outputs) metas.push_back(out.meta);
    const std::vector<Tensor> results = node->def->reference(node->attrs, host_inputs, metas);
    if (results.size() != outputs.size())
      fail("the reference produced " + std::to_string(results.size()) + " outputs, expected " +
           std::to_string(outputs.size()));
    for (size_t i = 0; i < results.size(); ++i) {
      const DeviceValue& out = outputs[i];
      if (results[i].shape() != out.meta.shape)
        fail("the reference output " + std::to_string(i) + " has shape " + shape_string(results[i].shape()) +
             ", expected " + shape_string(out.meta.shape));
      std::vector<std::byte> bytes(out.bytes());
      cpu::tensor_to_storage(results[i], bytes.data(), out.elem);
      upload(out.data, bytes.data(), bytes.size(), stream, where);
    }
  };
}

struct PreparedNode {
  const Node* node;
  Launch launch;
  bool host = false;
};

class CudaPreparedProgram final : public PreparedProgram {
 public:
  CudaPreparedProgram(const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights,
                      const CudaOptions& options, const std::vector<std::pair<std::string, std::string>>& state = {},
                      const PreparedProgram* share_state_with = nullptr)
      : graph_(program.graph),
        plan_(program.plan),
        floats_(cpu::float_storage(program.compute_dtype)),
        options_(options) {
    check_supported(graph_);
    if (plan_.values.size() != graph_.values.size())
      fail(graph_.source + ": the memory plan covers " + std::to_string(plan_.values.size()) +
           " values, the graph has " + std::to_string(graph_.values.size()));
    ensure_device();
    NPUSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      graph_.source + ": creating a stream");
    elems_ = cpu::value_storage_elems(graph_, floats_);
    upload_weights(weights);
    state_.add(resolve_state(state, share_state_with));
    place_values();
    build_kernels();
    allocate_staging();
  }

  ~CudaPreparedProgram() override {
    release_graph();
    release_events();
    if (stream_) cudaStreamDestroy(stream_);
  }

  NamedTensors run(const std::map<std::string, Tensor>& inputs) override {
    if (options_.poison_memory)
      NPUSIM_CUDA_CHECK(launch_fill_bytes(stream_, arena_.data(), 0xff, arena_.size()), graph_.source + ": poisoning");
    stage_inputs(inputs);
    if (can_capture() && !graph_exec_ && runs_ > 0) capture();
    if (run_exec_) {
      NPUSIM_CUDA_CHECK(cudaGraphLaunch(run_exec_, stream_), graph_.source + ": replaying the CUDA graph");
    } else {
      enqueue_input_copies();
      if (graph_exec_)
        NPUSIM_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_), graph_.source + ": replaying the CUDA graph");
      else
        enqueue_all(profiling_);
      enqueue_output_copies();
    }
    NamedTensors outputs = finish_outputs();
    if (profiling_ && !graph_exec_) read_timings();
    ++runs_;
    return outputs;
  }

  int64_t planned_bytes() const override { return plan_.arena_bytes + plan_.persistent_bytes; }
  int64_t allocated_bytes() const override {
    return static_cast<int64_t>(arena_.size() + weight_memory_.size() + state_bytes_ + flags_.size());
  }
  void set_profiling(bool on) override {
    profiling_ = on;
    if (on) release_graph();  // a replayed graph has no per-kernel timings
  }
  std::vector<KernelTiming> last_timings() const override { return timings_; }
  std::vector<std::string> fallback_nodes() const override {
    std::vector<std::string> nodes;
    for (const PreparedNode& k : kernels_)
      if (k.host) nodes.push_back(node_label(*k.node));
    return nodes;
  }
  bool replays_graph() const { return run_exec_ != nullptr; }  // the whole run, copies included, as one graph
  const std::string& capture_failure() const { return capture_failure_; }
  size_t graph_nodes() const { return graph_exec_ ? graph_nodes_ : 0; }
  size_t side_launches() const { return side_launches_.size(); }

  double time_replays(int replays) {
    if (!graph_exec_) fail(graph_.source + ": no captured CUDA graph to time (run the program first)");
    return replay_milliseconds(graph_exec_, stream_, replays, graph_.source + ": timing graph replays");
  }

  // ---- state kept between runs (see PreparedProgram::bind_state) ----

  void bind_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                  const PreparedProgram* share_with) override {
    state_.add(resolve_state(input_output_pairs, share_with));
    release_graph();
    place_values();
    build_kernels();
    allocate_staging();
  }

  void write_state(const std::string& input, const Tensor& value) override {
    const StateSlot* slot = state_.of_input(input);
    if (!slot) fail(graph_.source + ": no state is kept for input '" + input + "'");
    const Value& meta = graph_.value(slot->input);
    if (value.shape() != meta.meta.shape || reference_dtype(value.dtype()) != reference_dtype(meta.meta.dtype))
      fail(graph_.source + ": state '" + input + "' is " + shape_string(meta.meta.shape) + " " +
           std::string(dtype_name(meta.meta.dtype)) + ", got " + shape_string(value.shape()) + " " +
           std::string(dtype_name(value.dtype())));
    std::vector<std::byte> bytes(slot->memory->size());
    cpu::tensor_to_storage(value.to_reference(), bytes.data(), elem_of(slot->input));
    upload(slot->memory->data(), bytes.data(), bytes.size(), stream_,
           graph_.source + ": writing state '" + input + "'");
  }

  Tensor read_state(const std::string& input) const override {
    const StateSlot* slot = state_.of_input(input);
    if (!slot) fail(graph_.source + ": no state is kept for input '" + input + "'");
    const std::vector<std::byte> bytes = download(slot->memory->data(), slot->memory->size(), stream_,
                                                  graph_.source + ": reading state '" + input + "'");
    return cpu::storage_to_tensor(bytes.data(), elem_of(slot->input), graph_.value(slot->input).meta.shape);
  }

 private:
  using StateSlot = npusim::StateSlot<DeviceBuffer>;

  // ---- element types and weights ----

  Elem elem_of(ValueId id) const { return elems_[static_cast<size_t>(id)]; }

  size_t storage_bytes(ValueId id) const {
    return static_cast<size_t>(shape_numel(graph_.value(id).meta.shape)) * cpu::elem_size(elem_of(id));
  }

  // Every weight a node or the outputs read, in storage form, uploaded into one allocation.
  void upload_weights(const std::vector<std::pair<ValueId, Tensor>>& binding) {
    const std::vector<Tensor> given = resolve_weights(graph_, binding);
    std::vector<ValueId> used;
    for (size_t i = 0; i < given.size(); ++i)
      if (given[i].defined()) used.push_back(static_cast<ValueId>(i));

    size_t total = 0;
    for (ValueId id : used) total += aligned(storage_bytes(id));
    weight_memory_ = DeviceBuffer(total, graph_.source + ": weights");
    weight_addresses_.assign(graph_.values.size(), nullptr);
    size_t offset = 0;
    for (ValueId id : used) {
      const Elem elem = elem_of(id);
      const Tensor& tensor = given[static_cast<size_t>(id)];
      std::byte* address = weight_memory_.data() + offset;
      const std::string where = graph_.source + ": uploading weight '" + graph_.value(id).name + "'";
      if (tensor.dtype() == storage_dtype(elem)) {
        upload(address, tensor.bytes(), storage_bytes(id), stream_, where);
      } else {
        std::vector<std::byte> bytes(storage_bytes(id));
        cpu::tensor_to_storage(tensor, bytes.data(), elem);
        upload(address, bytes.data(), bytes.size(), stream_, where);
      }
      weight_addresses_[static_cast<size_t>(id)] = address;
      offset += aligned(storage_bytes(id));
    }
  }

  // ---- memory: every live value its own arena slot (no reuse), views alias their input, state its own buffer ----

  void place_values() {
    addresses_.assign(graph_.values.size(), nullptr);
    view_of_.assign(graph_.values.size(), kNoValue);
    std::vector<bool> live(graph_.values.size(), false);
    for (ValueId id : graph_.inputs) live[static_cast<size_t>(id)] = true;
    for (const Node& node : graph_.nodes)
      for (ValueId id : node.outputs) live[static_cast<size_t>(id)] = true;
    std::vector<int64_t> offsets(graph_.values.size(), -1);
    size_t arena_bytes = 0;
    for (size_t i = 0; i < graph_.values.size(); ++i) {
      const auto id = static_cast<ValueId>(i);
      const Value& value = graph_.value(id);
      if (value.kind == ValueKind::Weight) {
        addresses_[i] = weight_addresses_[i];
        continue;
      }
      if (!live[i] || state_.of_value(id)) continue;
      if (value.producer >= 0) {
        const Node& producer = graph_.nodes[static_cast<size_t>(value.producer)];
        if (output_aliases_input(producer, graph_) && valid_view(id, producer.inputs[0])) {
          view_of_[i] = producer.inputs[0];
          continue;
        }
      }
      offsets[i] = static_cast<int64_t>(arena_bytes);
      arena_bytes += aligned(std::max<size_t>(storage_bytes(id), 1));
    }
    arena_ = DeviceBuffer(arena_bytes, graph_.source + ": the activation arena");
    for (size_t i = 0; i < graph_.values.size(); ++i)
      if (offsets[i] >= 0) addresses_[i] = arena_.data() + offsets[i];
    for (const StateSlot& slot : state_.all())
      for (ValueId id : {slot.input, slot.output}) addresses_[static_cast<size_t>(id)] = slot.memory->data();
    for (size_t i = 0; i < graph_.values.size(); ++i)
      if (view_of_[i] != kNoValue && !addresses_[static_cast<size_t>(root_of(static_cast<ValueId>(i)))])
        fail(graph_.source + ": value '" + graph_.values[i].name + "' is a view of a value with no memory");
  }

  bool valid_view(ValueId id, ValueId root) const {
    if (root < 0 || static_cast<size_t>(root) >= graph_.values.size() || root == id) return false;
    if (state_.of_value(id)) return false;
    return storage_bytes(root) == storage_bytes(id) && elem_of(root) == elem_of(id);
  }

  ValueId root_of(ValueId id) const {
    for (size_t steps = 0; view_of_[static_cast<size_t>(id)] != kNoValue; ++steps) {
      if (steps > graph_.values.size())
        fail(graph_.source + ": the memory plan's views of '" + graph_.value(id).name + "' form a cycle");
      id = view_of_[static_cast<size_t>(id)];
    }
    return id;
  }

  DeviceValue value_at(ValueId id) const {
    return DeviceValue{addresses_[static_cast<size_t>(root_of(id))], elem_of(id), graph_.value(id).meta};
  }

  // ---- kernels ----

  void build_kernels() {
    kernels_.clear();
    timings_.clear();
    flags_ = DeviceBuffer(std::max<size_t>(graph_.nodes.size(), 1) * sizeof(int), graph_.source + ": error flags");
    scratch_ = std::make_shared<SharedScratch>();
    const FusionSite site{graph_, [this](ValueId id) { return value_at(id); },
                          [this](ValueId id) { return state_.of_value(id) != nullptr; },
                          [this](ValueId id) { return view_of_[static_cast<size_t>(id)] != kNoValue; },
                          [this](size_t n) { return context_of(n); }};
    FusionPlan fusion = options_.fuse_kernels && fusion_enabled_by_environment()
                            ? plan_fusions(site)
                            : FusionPlan::none(graph_.nodes.size());
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      if (fusion.fused_away[n]) continue;
      const Node& node = graph_.nodes[n];
      if (std::optional<FusedLaunch>& fused = fusion.launches[n]) {
        kernels_.push_back({&node, std::move(fused->launch), false});
        timings_.push_back({node.name, fused->label, 0.0});
        continue;
      }
      const OpContext ctx = context_of(n);
      kernels_.push_back(make_kernel(ctx));
      timings_.push_back({node.name, node.op, 0.0});
    }
    std::vector<size_t> kernel_nodes;
    for (const PreparedNode& kernel : kernels_)
      kernel_nodes.push_back(static_cast<size_t>(kernel.node - graph_.nodes.data()));
    side_launches_ = plan_cache_prefetches(graph_, kernel_nodes, [this](size_t n) { return context_of(n); });
    if (!side_launches_.empty() && !side_stream_) side_stream_ = std::make_unique<SideStream>(graph_.source);
    for (const StateSlot& slot : state_.all())
      if (addresses_[static_cast<size_t>(root_of(slot.output))] != slot.memory->data())
        fail(graph_.source + ": state '" + slot.input_name + "' is not updated in place");
  }

  OpContext context_of(size_t n) const {
    const Node& node = graph_.nodes[n];
    OpContext ctx{node, {}, {}, {}, reinterpret_cast<int*>(flags_.data()) + n, stream_, scratch_};
    for (ValueId id : node.inputs) {
      ctx.inputs.push_back(value_at(id));
      ctx.inputs_ready_at_start.push_back(ready_at_start(id));
    }
    for (ValueId id : node.outputs) ctx.outputs.push_back(value_at(id));
    return ctx;
  }

  // Whether `id` holds its values before the run's first kernel: produced by no node and not a state (states are
  // updated in place during the run).
  bool ready_at_start(ValueId id) const { return graph_.value(id).producer < 0 && !state_.of_value(id); }

  // The op's CUDA kernel, or the host fallback. A factory that rejects the node's attributes leaves the verdict
  // to the reference, which reports it with the node's name when the node runs.
  PreparedNode make_kernel(const OpContext& ctx) {
    auto it = op_table().find(ctx.node.op);
    if (it != op_table().end()) {
      try {
        if (std::optional<Launch> launch = it->second(ctx)) return {&ctx.node, std::move(*launch), false};
      } catch (const Error&) {
      }
    }
    return {&ctx.node, host_launch(ctx), true};
  }

  bool can_capture() const {
    if (!options_.use_graphs || profiling_ || !graphs_enabled_by_environment()) return false;
    return std::none_of(kernels_.begin(), kernels_.end(), [](const PreparedNode& k) { return k.host; });
  }

  void enqueue_all(bool timed) {
    const std::string where = graph_.source + ": clearing the error flags";
    NPUSIM_CUDA_CHECK(cudaMemsetAsync(flags_.data(), 0, flags_.size(), stream_), where);
    if (timed) ensure_events();
    size_t side = 0;
    for (size_t i = 0; i < kernels_.size(); ++i) {
      try {
        for (; side < side_launches_.size() && side_launches_[side].before_kernel == i; ++side) {
          side_stream_->fork(stream_);
          side_launches_[side].launch(side_stream_->stream());
        }
        if (timed) NPUSIM_CUDA_CHECK(cudaEventRecord(events_[2 * i], stream_), "profiling");
        kernels_[i].launch(stream_);
        if (timed) NPUSIM_CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], stream_), "profiling");
      } catch (const Error& error) {
        const Node& node = *kernels_[i].node;
        fail(graph_.source + ": node '" + node.name + "' (" + node.source_op + "): " + error.what());
      }
    }
    if (!side_launches_.empty()) side_stream_->join(stream_);
  }

  // One capture of the whole run; a capture that fails leaves the program running launch by launch.
  void capture() {
    if (const cudaError_t begun = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
        begun != cudaSuccess) {
      cudaGetLastError();
      options_.use_graphs = false;
      capture_failure_ = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(begun);
      return;
    }
    try {
      enqueue_all(false);
    } catch (const Error& error) {
      capture_failure_ = error.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (ended == cudaSuccess && graph && cudaGraphGetNodes(graph, nullptr, &graph_nodes_) != cudaSuccess)
      graph_nodes_ = 0;
    if (capture_failure_.empty() && ended != cudaSuccess)
      capture_failure_ = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
    if (capture_failure_.empty() && graph) {
      if (const cudaError_t made = cudaGraphInstantiate(&graph_exec_, graph, 0); made != cudaSuccess)
        capture_failure_ = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
    }
    if (!capture_failure_.empty() || !graph) {
      cudaGetLastError();
      graph_exec_ = nullptr;
      options_.use_graphs = false;
    }
    if (graph_exec_) build_run_graph(graph);
    if (graph) cudaGraphDestroy(graph);
  }

  // The whole run as one submission: the inputs' copies in, the captured kernels (a child graph), the outputs' and
  // error flags' copies out. The kernels keep their own executable graph, which time_replays times as the PyTorch peer
  // times its graph. Where the run graph cannot be made, runs enqueue the copies around the kernels' graph.
  void build_run_graph(cudaGraph_t kernels) {
    cudaGraph_t run = nullptr;
    if (const cudaError_t made = cudaGraphCreate(&run, 0); made != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    cudaError_t status = cudaSuccess;
    std::vector<cudaGraphNode_t> copies_in;
    for (size_t input = 0; input < graph_.inputs.size() && status == cudaSuccess; ++input) {
      const PinnedBuffer& staged = input_staging_[input];
      if (staged.size() == 0) continue;
      cudaGraphNode_t node = nullptr;
      status = cudaGraphAddMemcpyNode1D(&node, run, nullptr, 0, value_at(graph_.inputs[input]).data, staged.data(),
                                        staged.size(), cudaMemcpyHostToDevice);
      copies_in.push_back(node);
    }
    cudaGraphNode_t body = nullptr;
    if (status == cudaSuccess)
      status = cudaGraphAddChildGraphNode(&body, run, copies_in.data(), copies_in.size(), kernels);
    for (size_t output = 0; output < graph_.outputs.size() && status == cudaSuccess; ++output) {
      const PinnedBuffer& staged = output_staging_[output];
      if (staged.size() == 0) continue;
      cudaGraphNode_t node = nullptr;
      status = cudaGraphAddMemcpyNode1D(&node, run, &body, 1, staged.data(), value_at(graph_.outputs[output]).data,
                                        staged.size(), cudaMemcpyDeviceToHost);
    }
    cudaGraphNode_t flags = nullptr;
    if (status == cudaSuccess)
      status = cudaGraphAddMemcpyNode1D(&flags, run, &body, 1, flag_staging_.data(), flags_.data(), flags_.size(),
                                        cudaMemcpyDeviceToHost);
    if (status == cudaSuccess) status = cudaGraphInstantiate(&run_exec_, run, 0);
    if (status != cudaSuccess) {
      cudaGetLastError();
      run_exec_ = nullptr;
      capture_failure_ = std::string("the run's graph (copies around the kernels): ") + cudaGetErrorString(status);
    }
    cudaGraphDestroy(run);
  }

  void release_graph() {
    if (run_exec_) cudaGraphExecDestroy(run_exec_);
    run_exec_ = nullptr;
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
  }

  void ensure_events() {
    if (events_.size() == 2 * kernels_.size()) return;
    release_events();
    events_.resize(2 * kernels_.size());
    for (cudaEvent_t& event : events_) NPUSIM_CUDA_CHECK(cudaEventCreate(&event), "creating a profiling event");
  }

  void release_events() {
    for (cudaEvent_t event : events_)
      if (event) cudaEventDestroy(event);
    events_.clear();
  }

  void read_timings() {
    for (size_t i = 0; i < kernels_.size() && 2 * i + 1 < events_.size(); ++i) {
      float ms = 0.0f;
      NPUSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]), "reading a profiling event");
      timings_[i].milliseconds = ms;
    }
  }

  // `flags` holds one int per node.
  void check_error_flags(const int* flags) const {
    for (size_t i = 0; i < graph_.nodes.size(); ++i)
      if (flags[i])
        fail(graph_.source + ": node '" + graph_.nodes[i].name + "' (" + graph_.nodes[i].source_op +
             "): an index is out of range");
  }

  // ---- inputs and outputs ----
  // Inputs, outputs and error flags pass through page-locked host buffers made at prepare, so that a run allocates
  // nothing and its copies run as DMA.

  void allocate_staging() {
    input_staging_.clear();
    output_staging_.clear();
    for (ValueId id : graph_.inputs)
      input_staging_.emplace_back(state_.of_input(graph_.value(id).name) ? 0 : value_at(id).bytes(),
                                  graph_.source + ": input '" + graph_.value(id).name + "'");
    for (ValueId id : graph_.outputs)
      output_staging_.emplace_back(state_.of_output(id) ? 0 : value_at(id).bytes(),
                                   graph_.source + ": output '" + graph_.value(id).name + "'");
    flag_staging_ = PinnedBuffer(flags_.size(), graph_.source + ": error flags");
  }

  // Checks the inputs and converts each into its page-locked staging buffer (copied to the device by the run's graph
  // or by enqueue_input_copies).
  void stage_inputs(const std::map<std::string, Tensor>& inputs) {
    for (const auto& [name, tensor] : inputs) find_graph_io(graph_, graph_.inputs, name, "input");
    for (size_t input = 0; input < graph_.inputs.size(); ++input) {
      const ValueId id = graph_.inputs[input];
      const Tensor* tensor = checked_input(graph_, inputs, id, state_.of_input(graph_.value(id).name) != nullptr);
      const PinnedBuffer& staged = input_staging_[input];
      if (!tensor || staged.size() == 0) continue;
      // The previous run's copy out of the staging buffer has finished: finish_outputs synchronized the stream.
      cpu::tensor_to_storage(*tensor, staged.data(), elem_of(id));
    }
  }

  void enqueue_input_copies() {
    for (size_t input = 0; input < graph_.inputs.size(); ++input) {
      const PinnedBuffer& staged = input_staging_[input];
      if (staged.size() == 0) continue;
      NPUSIM_CUDA_CHECK(cudaMemcpyAsync(value_at(graph_.inputs[input]).data, staged.data(), staged.size(),
                                        cudaMemcpyHostToDevice, stream_),
                        graph_.source + ": copying input '" + graph_.value(graph_.inputs[input]).name + "'");
    }
  }

  void enqueue_output_copies() {
    for (size_t output = 0; output < graph_.outputs.size(); ++output) {
      const PinnedBuffer& staged = output_staging_[output];
      if (staged.size() > 0)
        NPUSIM_CUDA_CHECK(cudaMemcpyAsync(staged.data(), value_at(graph_.outputs[output]).data, staged.size(),
                                          cudaMemcpyDeviceToHost, stream_),
                          graph_.source + ": copying output '" + graph_.value(graph_.outputs[output]).name + "'");
    }
    NPUSIM_CUDA_CHECK(
        cudaMemcpyAsync(flag_staging_.data(), flags_.data(), flags_.size(), cudaMemcpyDeviceToHost, stream_),
        graph_.source + ": reading the error flags");
  }

  // Waits for the run and converts its outputs out of their staging buffers.
  NamedTensors finish_outputs() {
    NPUSIM_CUDA_CHECK(cudaStreamSynchronize(stream_), graph_.source + ": running the program");
    check_error_flags(reinterpret_cast<const int*>(flag_staging_.data()));
    NamedTensors outputs;
    for (size_t output = 0; output < graph_.outputs.size(); ++output) {
      const ValueId id = graph_.outputs[output];
      if (state_.of_output(id)) continue;
      outputs.emplace_back(graph_.value(id).name, cpu::storage_to_tensor(output_staging_[output].data(), elem_of(id),
                                                                         graph_.value(id).meta.shape));
    }
    return outputs;
  }

  // ---- state ----

  // Checks the pairs and gives each its memory: the shared program's for the same input, else a new cleared buffer.
  std::vector<StateSlot> resolve_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                                       const PreparedProgram* share_with) {
    const auto* other = dynamic_cast<const CudaPreparedProgram*>(share_with);
    if (share_with && !other) fail(graph_.source + ": state can only be shared with a program of the CUDA backend");
    return state_.resolve(
        graph_, plan_, input_output_pairs, other ? &other->state_ : nullptr,
        [this](ValueId input, ValueId output) { return elem_of(input) == elem_of(output); },
        [this](ValueId id) { return storage_bytes(id); },
        [this](const StateSlot& slot) {
          auto memory = std::make_shared<DeviceBuffer>(storage_bytes(slot.input),
                                                       graph_.source + ": state '" + slot.input_name + "'");
          NPUSIM_CUDA_CHECK(cudaMemset(memory->data(), 0, memory->size()), graph_.source + ": clearing state");
          state_bytes_ += memory->size();
          return memory;
        });
  }

  Graph graph_;
  compiler::MemoryPlan plan_;
  Elem floats_;
  CudaOptions options_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer weight_memory_;
  DeviceBuffer arena_;
  DeviceBuffer flags_;
  std::vector<PinnedBuffer> input_staging_;   // by index in graph_.inputs; empty for state
  std::vector<PinnedBuffer> output_staging_;  // by index in graph_.outputs; empty for state
  PinnedBuffer flag_staging_;
  StateSlots<DeviceBuffer> state_;
  size_t state_bytes_ = 0;
  std::vector<Elem> elems_;                   // by ValueId: how each value is stored
  std::vector<std::byte*> weight_addresses_;  // by ValueId
  std::vector<std::byte*> addresses_;         // by ValueId; unused for views
  std::vector<ValueId> view_of_;              // by ValueId: the value a view aliases, or kNoValue
  std::vector<PreparedNode> kernels_;
  std::vector<SideLaunch> side_launches_;    // on side_stream_, forked from the main stream before their kernels
  std::unique_ptr<SideStream> side_stream_;  // made when there are side launches
  std::vector<KernelTiming> timings_;
  std::shared_ptr<SharedScratch> scratch_;  // shared by the launches, e.g. im2col's columns
  std::vector<cudaEvent_t> events_;
  cudaGraphExec_t graph_exec_ = nullptr;  // the kernels
  cudaGraphExec_t run_exec_ = nullptr;    // the whole run: copies in, the kernels, copies out
  size_t graph_nodes_ = 0;
  std::string capture_failure_;  // why the run could not be captured, when it could not
  int64_t runs_ = 0;
  bool profiling_ = false;
};

}  // namespace

BackendCapabilities CudaBackend::capabilities() const {
  BackendCapabilities caps;
  caps.name = "cuda";
  caps.compute_dtypes = {DType::Float32, DType::Float16, DType::BFloat16};
  caps.ops = kernel_ops();
  caps.reference_fallback = true;
  return caps;
}

std::unique_ptr<PreparedProgram> CudaBackend::prepare(const Program& program,
                                                      const std::vector<std::pair<ValueId, Tensor>>& weights) {
  check_environment();
  return std::make_unique<CudaPreparedProgram>(program, weights, options_);
}

std::unique_ptr<PreparedProgram> CudaBackend::prepare_with_state(
    const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights,
    const std::vector<std::pair<std::string, std::string>>& state, const PreparedProgram* share_with) {
  check_environment();
  return std::make_unique<CudaPreparedProgram>(program, weights, options_, state, share_with);
}

bool replays_graph(const PreparedProgram& program) {
  const auto* cuda = dynamic_cast<const CudaPreparedProgram*>(&program);
  return cuda && cuda->replays_graph();
}

std::string graph_capture_failure(const PreparedProgram& program) {
  const auto* cuda = dynamic_cast<const CudaPreparedProgram*>(&program);
  return cuda ? cuda->capture_failure() : std::string();
}

double graph_replay_milliseconds(PreparedProgram& program, int replays) {
  auto* cuda = dynamic_cast<CudaPreparedProgram*>(&program);
  if (!cuda) fail("graph replay timing: the program is not prepared on the CUDA backend");
  return cuda->time_replays(replays);
}

size_t side_launches(const PreparedProgram& program) {
  const auto* cuda = dynamic_cast<const CudaPreparedProgram*>(&program);
  return cuda ? cuda->side_launches() : 0;
}

size_t captured_graph_nodes(const PreparedProgram& program) {
  const auto* cuda = dynamic_cast<const CudaPreparedProgram*>(&program);
  return cuda ? cuda->graph_nodes() : 0;
}

std::string gpu_name() { return device_name(); }

}  // namespace npusim::cuda
