#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "npusim/attrs.h"
#include "npusim/dtype.h"
#include "npusim/tensor.h"

namespace npusim {

struct OpDef;

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

struct TensorMeta {
  Shape shape;
  DType dtype = DType::Float32;
  bool operator==(const TensorMeta&) const = default;
};

enum class ValueKind : uint8_t { GraphInput, Weight, NodeOutput };

// A weight computed at load time from other weights (BatchNorm folding, casts, layout packing), so that a
// compiled program plus the original checkpoint is all a user needs.
struct WeightTransform {
  std::string kind;              // see runtime/weight_transforms.h
  std::vector<int32_t> sources;  // ValueIds of the weights it reads (a -1 entry is an absent optional)
  Attrs params;
};

struct Value {
  std::string name;  // IR tensor name (placeholder name for weights)
  TensorMeta meta;
  ValueKind kind = ValueKind::NodeOutput;
  int32_t producer = -1;      // node index for NodeOutput
  int32_t producer_slot = 0;  // output index within the producer
  std::string weight_key;     // state_dict key for weights; graph.constants holds folded constants by key
  std::optional<WeightTransform> transform;  // derived weights only
};

struct Node {
  std::string name;
  std::string op;          // canonical op name ("conv2d", "add", ...), or the raw op_type when unknown
  std::string source_op;   // op_type as written in the IR ("aten.relu_.default")
  const OpDef* def = nullptr;  // null for ops the registry does not know
  Attrs attrs;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
};

// A constant value embedded in the IR (`constants` top-level key).
struct ConstantData {
  Tensor tensor;
};

struct Graph {
  std::string model_name;
  std::string pytorch_version;
  std::string source;  // file the graph came from, for messages
  std::vector<Value> values;
  std::vector<Node> nodes;  // topological order
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<ValueId> weights;  // weight values, in IR order (includes unconsumed ones)
  std::map<std::string, Tensor> constants;  // by state_dict key

  const Value& value(ValueId id) const { return values.at(static_cast<size_t>(id)); }
  Value& value(ValueId id) { return values.at(static_cast<size_t>(id)); }
  std::optional<ValueId> find_value(const std::string& name) const;
  // Every op the registry does not know, with the nodes that use it, one line per op.
  std::vector<std::string> unsupported_ops() const;
};

}  // namespace npusim
