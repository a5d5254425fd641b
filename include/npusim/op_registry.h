#pragma once
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "npusim/attrs.h"
#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim {

enum class AttrType {
  Int,     // int64
  Float,   // double; ints accepted
  Scalar,  // a number kept as written (int or float)
  Bool,
  String,
  Ints,  // list of int64; a single int is accepted as a one-element list
  Floats,
  DTypeName,  // "torch.float32" style string, or null
};

struct AttrSpec {
  std::string name;
  AttrType type;
  std::optional<AttrValue> default_value;  // filled in when the IR omits the attribute
  bool required = false;                   // absent and no default: an error
};

// How one ATen spelling maps onto a canonical op.
struct AtenSpelling {
  std::string op_type;                             // "aten.relu_.default"
  std::map<std::string, std::string> rename = {};  // IR attribute name -> canonical name
  std::map<std::string, AttrValue> fixed = {};     // attributes implied by the spelling
};

// Shape and dtype inference. Throws npusim::Error with a reason; the caller adds file and node.
using ShapeFn = std::function<std::vector<TensorMeta>(const Attrs& attrs, std::span<const TensorMeta> inputs)>;

// Plain reference implementation. Inputs arrive in the reference domain (fp32 floats, int64 integers, bool);
// `outputs` are the inferred metas; results must have those shapes, in the reference domain.
using ReferenceFn = std::function<std::vector<Tensor>(const Attrs& attrs, std::span<const Tensor> inputs,
                                                      std::span<const TensorMeta> outputs)>;

struct OpDef {
  std::string name;  // canonical name
  std::vector<AtenSpelling> spellings;
  std::vector<AttrSpec> attrs;
  int min_inputs = 0;
  int max_inputs = 0;  // -1: any number
  ShapeFn infer;
  ReferenceFn reference;
};

class OpRegistry {
 public:
  static const OpRegistry& instance();

  void add(OpDef def);
  const OpDef* find(const std::string& canonical_name) const;
  // The op and spelling for an IR op_type, or nulls when unknown.
  std::pair<const OpDef*, const AtenSpelling*> find_spelling(const std::string& op_type) const;
  std::vector<const OpDef*> all() const;

  // Fills defaults, applies the spelling's renames and fixed values, and checks types.
  // Errors name `where` (file and node) and the attribute.
  void normalize_attrs(const OpDef& def, const AtenSpelling* spelling, Attrs& attrs, const std::string& where) const;

 private:
  std::map<std::string, OpDef> ops_;
  std::map<std::string, std::pair<std::string, size_t>> spellings_;  // op_type -> (op, spelling index)
};

// Registration entry points, one per op family file.
void register_elementwise_ops(OpRegistry& registry);
void register_reduction_ops(OpRegistry& registry);
void register_nn_ops(OpRegistry& registry);
void register_linalg_ops(OpRegistry& registry);
void register_shape_ops(OpRegistry& registry);
void register_index_ops(OpRegistry& registry);
void register_creation_ops(OpRegistry& registry);
void register_misc_ops(OpRegistry& registry);
void register_fused_ops(OpRegistry& registry);  // ops only the compiler's fusion passes create

}  // namespace npusim
