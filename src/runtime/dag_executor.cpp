#include "runtime/dag_executor.h"

#include <chrono>

#include "compiler/graph_edit.h"
#include "compiler/memory_plan.h"
#include "runtime/coverage.h"
#include "runtime/weight_transforms.h"

namespace npusim {

namespace {

using Clock = std::chrono::steady_clock;
using compiler::Side;

double microseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

std::string node_label(const Node& node) { return node.name + " (" + node.op + ")"; }

// The registry's reference implementations as a backend: the oracle, and a fallback that runs every op the
// registry knows. Floats are computed and stored in fp32.
class ReferencePreparedProgram final : public PreparedProgram {
 public:
  ReferencePreparedProgram(const Program& program, std::vector<std::pair<ValueId, Tensor>> weights)
      : program_(program) {
    if (program.compute_dtype != DType::Float32)
      fail(program.graph.source + ": the reference backend stores activations as float32, not " +
           std::string(dtype_name(program.compute_dtype)));
    const Graph& graph = program_.graph;
    std::vector<bool> bound(graph.values.size(), false);
    for (const auto& [id, tensor] : weights) bound.at(static_cast<size_t>(id)) = true;
    for (ValueId id : graph.weights) {
      const Value& value = graph.value(id);
      if (bound[static_cast<size_t>(id)] || value.transform) continue;
      for (const std::string* key : {&value.weight_key, &value.name})
        if (auto it = graph.constants.find(*key); it != graph.constants.end()) {
          weights.emplace_back(id, it->second);
          break;
        }
    }
    add_derived_weights(graph, weights);
    executor_ = std::make_unique<ReferenceExecutor>(graph, weights);
    timings_.reserve(graph.nodes.size());
  }

  NamedTensors run(const std::map<std::string, Tensor>& inputs) override {
    if (!profiling_) return executor_->run(inputs);
    timings_.clear();
    auto last = Clock::now();
    NamedTensors outputs = executor_->run(inputs, [&](const Node& node, const std::vector<Tensor>&) {
      const auto now = Clock::now();
      timings_.push_back({node.name, node.op, std::chrono::duration<double, std::milli>(now - last).count()});
      last = now;
    });
    return outputs;
  }

  int64_t planned_bytes() const override { return program_.plan.arena_bytes + program_.plan.persistent_bytes; }
  int64_t allocated_bytes() const override { return 0; }  // allocates as it runs
  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<KernelTiming> last_timings() const override { return timings_; }
  std::vector<std::string> fallback_nodes() const override {
    std::vector<std::string> nodes;
    for (const Node& node : program_.graph.nodes) nodes.push_back(node_label(node));
    return nodes;
  }

 private:
  Program program_;
  std::unique_ptr<ReferenceExecutor> executor_;
  std::vector<KernelTiming> timings_;
  bool profiling_ = false;
};

class ReferenceBackend final : public Backend {
 public:
  BackendCapabilities capabilities() const override {
    BackendCapabilities caps;
    caps.name = "reference";
    caps.compute_dtypes = {DType::Float32};
    caps.reference_fallback = true;
    return caps;
  }
  std::unique_ptr<PreparedProgram> prepare(const Program& program,
                                           const std::vector<std::pair<ValueId, Tensor>>& weights) override {
    return std::make_unique<ReferencePreparedProgram>(program, weights);
  }
};

// Builds the graph of one partition, adding each value of the whole graph it touches once.
class PartitionGraphBuilder {
 public:
  PartitionGraphBuilder(const Graph& whole, const compiler::Partition& partition, size_t index)
      : whole_(whole), local_(whole.values.size(), kNoValue) {
    graph_.model_name = whole.model_name;
    graph_.pytorch_version = whole.pytorch_version;
    graph_.source = whole.source + " partition #" + std::to_string(index);
    for (ValueId id : partition.inputs) graph_.inputs.push_back(add_input(id));
    for (int32_t n : partition.nodes) add_node(whole.nodes.at(static_cast<size_t>(n)));
    for (ValueId id : partition.outputs) graph_.outputs.push_back(local(id));
    compiler::renumber_producers(graph_);
  }

  Graph take_graph() { return std::move(graph_); }
  std::vector<ValueId> take_values() { return std::move(values_); }

 private:
  ValueId add(ValueId id, Value value) {
    const auto local_id = static_cast<ValueId>(graph_.values.size());
    graph_.values.push_back(std::move(value));
    values_.push_back(id);
    local_[static_cast<size_t>(id)] = local_id;
    return local_id;
  }

  ValueId add_input(ValueId id) {
    Value value = whole_.value(id);
    value.kind = ValueKind::GraphInput;
    value.producer = -1;
    value.producer_slot = 0;
    value.weight_key.clear();
    value.transform.reset();
    return add(id, std::move(value));
  }

  // A value read or written by the partition's nodes; weights bring their transform sources and constants.
  ValueId local(ValueId id) {
    if (const ValueId known = local_.at(static_cast<size_t>(id)); known != kNoValue) return known;
    Value value = whole_.value(id);
    if (value.kind == ValueKind::Weight) {
      if (value.transform)
        for (int32_t& source : value.transform->sources)
          if (source >= 0) source = local(source);
      for (const std::string* key : {&value.weight_key, &value.name})
        if (auto it = whole_.constants.find(*key); it != whole_.constants.end()) graph_.constants.insert(*it);
    }
    const ValueKind kind = value.kind;
    const ValueId local_id = add(id, std::move(value));
    if (kind == ValueKind::Weight) graph_.weights.push_back(local_id);
    return local_id;
  }

  void add_node(Node node) {
    for (ValueId& id : node.inputs) id = local(id);
    for (ValueId& id : node.outputs) id = local(id);
    graph_.nodes.push_back(std::move(node));
  }

  const Graph& whole_;
  Graph graph_;
  std::vector<ValueId> local_;   // by whole ValueId
  std::vector<ValueId> values_;  // by local ValueId
};

// A tensor moved to the other side, stored as the program stores the value.
Tensor transfer_copy(const Tensor& tensor, DType stored) {
  Tensor moved = tensor.to(stored);
  return moved.bytes() == tensor.bytes() ? moved.clone() : moved;
}

}  // namespace

std::unique_ptr<Backend> make_partition_backend(const std::string& name, const BackendOptions& options) {
  if (name == "reference") return std::make_unique<ReferenceBackend>();
  return make_backend(name, options);
}

BackendMaker partition_backends(const BackendOptions& options) {
  return [options](const std::string& name) { return make_partition_backend(name, options); };
}

PartitionProgram partition_program(const Program& program, const compiler::PartitionPlan& plan, size_t partition) {
  PartitionGraphBuilder builder(program.graph, plan.partitions.at(partition), partition);
  PartitionProgram part;
  part.program.producer = program.producer;
  part.program.target = program.target;
  part.program.compute_dtype = program.compute_dtype;
  part.program.disabled_passes = program.disabled_passes;
  part.program.graph = builder.take_graph();
  part.program.plan = compiler::plan_memory(part.program.graph, program.compute_dtype, program.plan.alignment);
  part.values = builder.take_values();
  return part;
}

struct DagExecutor::Stage {
  int32_t partition = 0;
  Side side = Side::Target;
  std::string label;
  std::string backend_name;
  PartitionProgram part;
  std::vector<ValueId> inputs;        // whole ValueIds, in the stage graph's input order
  std::vector<ValueId> outputs;       // whole ValueIds, in the stage graph's output order
  std::vector<int64_t> kernel_bytes;  // by stage node
  std::vector<double> kernel_flops;   // by stage node
  std::map<std::string, size_t> node_index;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<PreparedProgram> prepared;
};

DagExecutor::DagExecutor(const Program& program, compiler::PartitionPlan plan,
                         const std::vector<std::pair<ValueId, Tensor>>& weights, const BackendMaker& make_backend)
    : graph_(program.graph), plan_(std::move(plan)), whole_(plan_.partitions.size() <= 1) {
  if (plan_.partition_of_node.size() != graph_.nodes.size())
    fail(graph_.source + ": the partition plan covers " + std::to_string(plan_.partition_of_node.size()) +
         " nodes, the program has " + std::to_string(graph_.nodes.size()));
  if (whole_) {
    stages_.push_back(whole_stage(program));
  } else {
    for (size_t p = 0; p < plan_.partitions.size(); ++p) stages_.push_back(partition_stage(program, p));
    collect_output_weights(weights);
  }
  for (const auto& stage : stages_) prepare_stage(*stage, weights, make_backend);
}

std::unique_ptr<DagExecutor::Stage> DagExecutor::whole_stage(const Program& program) const {
  auto stage = std::make_unique<Stage>();
  stage->part.program = program;
  for (size_t i = 0; i < graph_.values.size(); ++i) stage->part.values.push_back(static_cast<ValueId>(i));
  stage->inputs = graph_.inputs;
  stage->outputs = graph_.outputs;
  if (plan_.partitions.empty()) {  // no nodes
    stage->backend_name = plan_.backend;
    stage->label = plan_.target + " (" + plan_.backend + ")";
  } else {
    stage->side = plan_.partitions[0].side;
    stage->backend_name = plan_.partitions[0].backend;
    stage->label = plan_.label(plan_.partitions[0]);
  }
  return stage;
}

std::unique_ptr<DagExecutor::Stage> DagExecutor::partition_stage(const Program& program, size_t index) const {
  const compiler::Partition& partition = plan_.partitions[index];
  auto stage = std::make_unique<Stage>();
  stage->partition = static_cast<int32_t>(index);
  stage->part = partition_program(program, plan_, index);
  stage->inputs = partition.inputs;
  stage->outputs = partition.outputs;
  stage->side = partition.side;
  stage->backend_name = partition.backend;
  stage->label = plan_.label(partition);
  return stage;
}

void DagExecutor::prepare_stage(Stage& stage, const std::vector<std::pair<ValueId, Tensor>>& weights,
                                const BackendMaker& make_backend) {
  const Program& part = stage.part.program;
  for (size_t n = 0; n < part.graph.nodes.size(); ++n) {
    const Node& node = part.graph.nodes[n];
    stage.kernel_bytes.push_back(kernel_bytes(part.graph, node, part.plan, part.compute_dtype));
    stage.kernel_flops.push_back(kernel_flops(part.graph, node));
    stage.node_index[node.name] = n;
  }
  // The weight binding in the stage's own ValueIds.
  std::vector<ValueId> local(graph_.values.size(), kNoValue);
  for (size_t i = 0; i < stage.part.values.size(); ++i)
    local[static_cast<size_t>(stage.part.values[i])] = static_cast<ValueId>(i);
  std::vector<std::pair<ValueId, Tensor>> bound;
  for (const auto& [id, tensor] : weights)
    if (id >= 0 && static_cast<size_t>(id) < local.size() && local[static_cast<size_t>(id)] != kNoValue)
      bound.emplace_back(local[static_cast<size_t>(id)], tensor);
  stage.backend = make_backend(stage.backend_name);
  stage.prepared = stage.backend->prepare(part, bound);
}

// Graph outputs that are weights are not produced by any partition: the executor returns them itself.
void DagExecutor::collect_output_weights(const std::vector<std::pair<ValueId, Tensor>>& weights) {
  output_weights_.resize(graph_.outputs.size());
  for (size_t i = 0; i < graph_.outputs.size(); ++i) {
    const Value& value = graph_.value(graph_.outputs[i]);
    if (value.kind != ValueKind::Weight) continue;
    for (const auto& [id, tensor] : weights)
      if (id == graph_.outputs[i]) output_weights_[i] = tensor.to_reference();
    if (auto it = graph_.constants.find(value.weight_key);
        !output_weights_[i].defined() && it != graph_.constants.end())
      output_weights_[i] = it->second.to_reference();
    if (!output_weights_[i].defined())
      fail(graph_.source + ": graph output '" + value.name + "' is a weight with no value");
  }
}

DagExecutor::~DagExecutor() = default;

const Program& DagExecutor::stage_program(size_t stage) const { return stages_.at(stage)->part.program; }

void DagExecutor::record_kernels(const Stage& stage, double start_us) {
  double cursor = start_us;
  for (const KernelTiming& timing : stage.prepared->last_timings()) {
    KernelRecord record{timing.node, timing.op, stage.partition, cursor, timing.milliseconds * 1e3};
    if (auto it = stage.node_index.find(timing.node); it != stage.node_index.end()) {
      record.bytes = stage.kernel_bytes[it->second];
      record.flops = stage.kernel_flops[it->second];
    }
    cursor += record.duration_us;
    profile_.kernels.push_back(std::move(record));
  }
}

// One run in progress: the values each side holds, by whole ValueId, and when the run started.
struct DagExecutor::RunState {
  std::vector<std::vector<Tensor>> held;  // by side
  Clock::time_point start;
  double now_us() const { return microseconds_since(start); }
};

NamedTensors DagExecutor::run(const std::map<std::string, Tensor>& inputs) {
  RunState state{{}, Clock::now()};
  if (profiling_) profile_ = RunProfile{};
  if (whole_) {
    NamedTensors outputs = stages_[0]->prepared->run(inputs);
    finish_stage(*stages_[0], 0.0, state);
    return outputs;
  }
  const std::vector<Tensor> ordered = check_inputs(graph_, inputs);
  state.held.assign(2, std::vector<Tensor>(graph_.values.size()));
  for (size_t i = 0; i < ordered.size(); ++i)
    for (auto& side : state.held) side[static_cast<size_t>(graph_.inputs[i])] = ordered[i];  // on both sides

  size_t next_transfer = 0;
  for (const auto& stage : stages_) {
    for (;
         next_transfer < plan_.transfers.size() && plan_.transfers[next_transfer].before_partition == stage->partition;
         ++next_transfer)
      transfer(plan_.transfers[next_transfer], *stage, state);
    run_stage(*stage, state);
  }
  NamedTensors outputs = graph_outputs(state);
  if (profiling_) profile_.total_us = state.now_us();
  return outputs;
}

void DagExecutor::transfer(const compiler::Transfer& transfer, const Stage& to, RunState& state) {
  const Value& value = graph_.value(transfer.value);
  const double start_us = state.now_us();
  const Side from_side = stages_.at(static_cast<size_t>(transfer.from_partition))->side;
  const Tensor& from = state.held[static_cast<size_t>(from_side)][static_cast<size_t>(transfer.value)];
  if (!from.defined()) fail(graph_.source + ": value '" + value.name + "' was not produced before its transfer");
  state.held[static_cast<size_t>(to.side)][static_cast<size_t>(transfer.value)] =
      transfer_copy(from, stored_dtype(value.meta.dtype, to.part.program.compute_dtype));
  if (profiling_)
    profile_.transfers.push_back({value.name, transfer.from_partition, transfer.before_partition, transfer.bytes,
                                  start_us, state.now_us() - start_us});
}

void DagExecutor::run_stage(const Stage& stage, RunState& state) {
  std::vector<Tensor>& mine = state.held[static_cast<size_t>(stage.side)];
  std::map<std::string, Tensor> feed;
  for (ValueId id : stage.inputs) {
    const Tensor& tensor = mine[static_cast<size_t>(id)];
    if (!tensor.defined())
      fail(graph_.source + ": partition #" + std::to_string(stage.partition) + " reads '" + graph_.value(id).name +
           "', which is not on its side");
    feed.emplace(graph_.value(id).name, tensor);
  }
  const double start_us = state.now_us();
  NamedTensors produced = stage.prepared->run(feed);
  for (size_t i = 0; i < produced.size() && i < stage.outputs.size(); ++i)
    mine[static_cast<size_t>(stage.outputs[i])] = std::move(produced[i].second);
  finish_stage(stage, start_us, state);
}

void DagExecutor::finish_stage(const Stage& stage, double start_us, const RunState& state) {
  if (!profiling_) return;
  const double end_us = state.now_us();
  profile_.partitions.push_back(
      {stage.label, stage.backend_name, start_us, end_us - start_us, stage.part.program.graph.nodes.size()});
  record_kernels(stage, start_us);
  profile_.total_us = end_us;
}

NamedTensors DagExecutor::graph_outputs(const RunState& state) const {
  NamedTensors outputs;
  for (size_t i = 0; i < graph_.outputs.size(); ++i) {
    const auto id = static_cast<size_t>(graph_.outputs[i]);
    Tensor tensor = output_weights_[i];
    for (const auto& side : state.held)
      if (!tensor.defined() && side[id].defined()) tensor = side[id];
    if (!tensor.defined())
      fail(graph_.source + ": graph output '" + graph_.value(graph_.outputs[i]).name + "' has no value");
    outputs.emplace_back(graph_.value(graph_.outputs[i]).name, tensor.to_reference());
  }
  return outputs;
}

int64_t DagExecutor::planned_bytes() const {
  int64_t total = 0;
  for (const auto& stage : stages_) total += stage->prepared->planned_bytes();
  return total;
}

int64_t DagExecutor::allocated_bytes() const {
  int64_t total = 0;
  for (const auto& stage : stages_) total += stage->prepared->allocated_bytes();
  return total;
}

PrepareCost DagExecutor::prepare_cost() const {
  PrepareCost total;
  for (const auto& stage : stages_) {
    const PrepareCost cost = stage->prepared->prepare_cost();
    total.milliseconds += cost.milliseconds;
    total.packed_bytes += cost.packed_bytes;
    total.mapped_bytes += cost.mapped_bytes;
    total.notes.insert(total.notes.end(), cost.notes.begin(), cost.notes.end());
  }
  return total;
}

void DagExecutor::set_profiling(bool on) {
  profiling_ = on;
  for (const auto& stage : stages_) stage->prepared->set_profiling(on);
}

std::vector<KernelTiming> DagExecutor::last_timings() const {
  std::vector<KernelTiming> timings;
  for (const KernelRecord& k : profile_.kernels) timings.push_back({k.node, k.op, k.duration_us / 1e3});
  return timings;
}

std::vector<std::string> DagExecutor::fallback_nodes() const {
  std::vector<std::string> nodes;
  for (const auto& stage : stages_)
    for (std::string& node : stage->prepared->fallback_nodes()) nodes.push_back(std::move(node));
  return nodes;
}

std::vector<std::string> DagExecutor::keep_packed_weights() {
  std::vector<std::string> notes;
  for (const auto& stage : stages_)
    for (std::string& note : stage->prepared->keep_packed_weights()) notes.push_back(std::move(note));
  return notes;
}

void DagExecutor::bind_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                             const PreparedProgram* share_with) {
  if (!whole_)
    fail(graph_.source + ": keeping state between runs needs the program in one partition, it has " +
         std::to_string(stages_.size()));
  const auto* other = dynamic_cast<const DagExecutor*>(share_with);
  if (other && other->whole_) share_with = other->stages_[0]->prepared.get();
  stages_[0]->prepared->bind_state(input_output_pairs, share_with);
}

Tensor DagExecutor::read_state(const std::string& input) const {
  if (!whole_) fail(graph_.source + ": no state is kept for input '" + input + "' by a partitioned program");
  return stages_[0]->prepared->read_state(input);
}

std::unique_ptr<DagExecutor> prepare_partitioned(const Program& program, const compiler::Target& target,
                                                 const std::vector<std::pair<ValueId, Tensor>>& weights) {
  return std::make_unique<DagExecutor>(program, compiler::partition_graph(program.graph, target, program.compute_dtype),
                                       weights);
}

}  // namespace npusim
