#pragma once
// Finds the tensor behind every weight of a graph, from the IR's own constants and from mapped .safetensors
// files, forgiving the naming differences between an export wrapper and a plain checkpoint.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llm/model_config.h"
#include "npusim/graph.h"
#include "npusim/tensor.h"
#include "runtime/safetensors.h"

namespace npusim {

struct WeightBinding {
  std::vector<std::pair<ValueId, Tensor>> tensors;  // in graph.weights order
  std::vector<std::string> notes;                   // substitutions worth telling the user about
};

// Whether `WeightStore::bind` computes the derived weights (BatchNorm folds) or leaves them to the backend, which
// computes them in `prepare` (every backend resolves the derived weights a binding lacks) and may fold them while it
// lays the sources out for its kernels, so that no folded copy is ever made.
enum class DerivedWeights : uint8_t { Computed, LeftToBackend };

class WeightStore {
 public:
  void add_file(const std::string& path);      // a .safetensors file, mapped
  void set_config(const ModelConfig& config);  // enables computing rotary inv_freq

  // A tensor for every weight a node consumes or the graph outputs, and for every source of such a weight that
  // is derived (Value::transform); derived weights are not looked up and unused weights are skipped. Resolution
  // order: the IR constants; the files (earlier added first) by state_dict key, by placeholder name, then by the
  // key with leading wrapper components stripped one at a time; a tied LM head from the embedding; rotary
  // inv_freq from the config; lifted constants (`c_...`) as empty or zero tensors. Shapes must match the IR;
  // dtypes are kept as stored. Every missing weight is reported in one error. Then the derived weights are added,
  // computed from their sources, unless `derived` leaves them to the backend.
  WeightBinding bind(const Graph& graph, DerivedWeights derived = DerivedWeights::Computed) const;

  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  struct Found {
    Tensor tensor;
    std::string origin;  // "<file> as '<name>'" for messages
    std::string name;    // the name it was found under
  };
  std::optional<Found> find_in_files(const std::vector<std::string>& candidates) const;
  // One weight through the resolution order; substitutions add a note.
  std::optional<Found> resolve(const Graph& graph, const Value& value, std::vector<std::string>& notes) const;

  std::vector<SafetensorsFile> files_;
  std::optional<ModelConfig> config_;
};

}  // namespace npusim
