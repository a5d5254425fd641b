#pragma once
// The checks every backend makes when it keeps state between runs (PreparedProgram::bind_state), in one place.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compiler/memory_plan.h"
#include "npusim/error.h"
#include "npusim/graph.h"

namespace npusim {

// The graph input or output named `name`; fails naming the graph when there is none (`what`: "input"/"output").
ValueId find_graph_io(const Graph& graph, const std::vector<ValueId>& ids, const std::string& name, const char* what);

struct StatePair {
  std::string input_name;
  ValueId input = kNoValue;
  ValueId output = kNoValue;
  std::string label;  // "state 'IN' -> 'OUT'", for messages
};

// Checks input/output name pairs for in-place state: each names a graph input and a graph output of the same shape
// and storage (`same_storage`), neither already state (`is_state_input` for earlier bindings, and the other pairs),
// the output computed by a node of its own (not a view in `plan`), and no node other than that producer reads the
// input. Fails naming the graph and the pair.
std::vector<StatePair> check_state_pairs(const Graph& graph, const compiler::MemoryPlan& plan,
                                         const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                                         const std::function<bool(ValueId, ValueId)>& same_storage,
                                         const std::function<bool(const std::string&)>& is_state_input);

// One pair of state kept by a prepared program and the memory it lives in (`Memory`: the backend's buffer type,
// with size() in bytes), which a program sharing the state holds too.
template <typename Memory>
struct StateSlot {
  std::string input_name;
  ValueId input = kNoValue, output = kNoValue;
  std::shared_ptr<Memory> memory;
};

// A backend's state slots, looked up by graph input name or value.
template <typename Memory>
class StateSlots {
 public:
  using Slot = StateSlot<Memory>;

  const std::vector<Slot>& all() const { return slots_; }
  bool empty() const { return slots_.empty(); }
  void add(std::vector<Slot> slots) {
    for (Slot& slot : slots) slots_.push_back(std::move(slot));
  }
  const Slot* of_input(const std::string& name) const {
    for (const Slot& slot : slots_)
      if (slot.input_name == name) return &slot;
    return nullptr;
  }
  const Slot* of_output(ValueId id) const {
    for (const Slot& slot : slots_)
      if (slot.output == id) return &slot;
    return nullptr;
  }
  const Slot* of_value(ValueId id) const {
    for (const Slot& slot : slots_)
      if (slot.input == id || slot.output == id) return &slot;
    return nullptr;
  }

  // Checks the pairs (check_state_pairs, with these slots as the earlier bindings) and gives each its memory: that
  // of `shared`'s slot for the same input when given (its size must be `storage_bytes(input)`), else
  // `make_memory(slot)`. Fails naming the graph and the pair.
  template <typename SameStorage, typename StorageBytes, typename MakeMemory>
  std::vector<Slot> resolve(const Graph& graph, const compiler::MemoryPlan& plan,
                            const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                            const StateSlots* shared, const SameStorage& same_storage,
                            const StorageBytes& storage_bytes, const MakeMemory& make_memory) const {
    std::vector<Slot> slots;
    for (const StatePair& pair :
         check_state_pairs(graph, plan, input_output_pairs, same_storage,
                           [this](const std::string& name) { return of_input(name) != nullptr; })) {
      std::shared_ptr<Memory> memory;
      if (const Slot* other = shared ? shared->of_input(pair.input_name) : nullptr) {
        if (other->memory->size() != storage_bytes(pair.input))
          fail(graph.source + ": " + pair.label + ": the shared state holds " + std::to_string(other->memory->size()) +
               " bytes, this program needs " + std::to_string(storage_bytes(pair.input)));
        memory = other->memory;
      }
      slots.push_back({pair.input_name, pair.input, pair.output, std::move(memory)});
    }
    for (Slot& slot : slots)
      if (!slot.memory) slot.memory = make_memory(slot);
    return slots;
  }

 private:
  std::vector<Slot> slots_;
};

}  // namespace npusim
