#pragma once
// Runs a partitioned program: every partition is its own Program (its nodes, its own memory plan; the values it
// reads from other partitions and the graph are its inputs, the values others read are its outputs), prepared
// once on its backend at load. A run goes through the partitions in order and copies each value that crosses
// from one side to the other once, in the dtype the program stores it in (integers stay integers); values that
// stay on one side are handed over as they are.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/partition.h"
#include "runtime/backend.h"
#include "runtime/profiler.h"

namespace npusim {

using BackendMaker = std::function<std::unique_ptr<Backend>(const std::string& name)>;

// A backend by name: "reference" runs the registry's reference implementations (fp32); others come from
// make_backend.
std::unique_ptr<Backend> make_partition_backend(const std::string& name, const BackendOptions& options = {});
// make_partition_backend with these options, as a BackendMaker.
BackendMaker partition_backends(const BackendOptions& options = {});

// The program of one partition. `values` maps its ValueIds to those of the whole program's graph.
struct PartitionProgram {
  Program program;
  std::vector<ValueId> values;
};
PartitionProgram partition_program(const Program& program, const compiler::PartitionPlan& plan, size_t partition);

class DagExecutor final : public PreparedProgram {
 public:
  // `weights` is the binding for program.graph (see WeightStore::bind). A plan of one partition (or none)
  // prepares the whole program as it is.
  DagExecutor(const Program& program, compiler::PartitionPlan plan,
              const std::vector<std::pair<ValueId, Tensor>>& weights,
              const BackendMaker& make_backend = partition_backends());
  ~DagExecutor() override;

  NamedTensors run(const std::map<std::string, Tensor>& inputs) override;
  int64_t planned_bytes() const override;
  int64_t allocated_bytes() const override;
  PrepareCost prepare_cost() const override;  // summed over the partitions
  void set_profiling(bool on) override;
  // Every kernel of the last profiled run, in execution order.
  std::vector<KernelTiming> last_timings() const override;
  // Nodes run by a reference implementation: on a reference partition, or by a backend's generic kernel.
  std::vector<std::string> fallback_nodes() const override;
  std::vector<std::string> keep_packed_weights() override;  // every partition's
  // State kept between runs, for a program that runs whole on one backend.
  void bind_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                  const PreparedProgram* share_with = nullptr) override;
  Tensor read_state(const std::string& input) const override;

  const compiler::PartitionPlan& plan() const { return plan_; }
  size_t stage_count() const { return stages_.size(); }
  const Program& stage_program(size_t stage) const;
  // Kernels, partitions and transfers of the last profiled run.
  const RunProfile& last_profile() const { return profile_; }

 private:
  struct Stage;
  std::unique_ptr<Stage> whole_stage(const Program& program) const;
  std::unique_ptr<Stage> partition_stage(const Program& program, size_t index) const;
  void prepare_stage(Stage& stage, const std::vector<std::pair<ValueId, Tensor>>& weights,
                     const BackendMaker& make_backend);
  void collect_output_weights(const std::vector<std::pair<ValueId, Tensor>>& weights);
  struct RunState;
  void transfer(const compiler::Transfer& transfer, const Stage& to, RunState& state);
  void run_stage(const Stage& stage, RunState& state);
  void finish_stage(const Stage& stage, double start_us, const RunState& state);
  NamedTensors graph_outputs(const RunState& state) const;
  void record_kernels(const Stage& stage, double start_us);

  Graph graph_;  // the whole program's graph
  compiler::PartitionPlan plan_;
  bool whole_ = false;  // one stage that is the whole program
  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<Tensor> output_weights_;  // by graph output index: weights that are graph outputs
  bool profiling_ = false;
  RunProfile profile_;
};

// Partitions `program` for `target` (see compiler::partition_graph) and prepares every partition.
std::unique_ptr<DagExecutor> prepare_partitioned(const Program& program, const compiler::Target& target,
                                                 const std::vector<std::pair<ValueId, Tensor>>& weights);

}  // namespace npusim
