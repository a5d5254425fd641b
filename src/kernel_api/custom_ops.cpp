#include "kernel_api/custom_ops.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "npusim/error.h"
#include "npusim/kernel_api.h"

namespace npusim {

namespace {

struct CustomTable {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<OpDef>> ops;
  std::map<std::string, std::pair<const OpDef*, size_t>> spellings;  // op_type -> (op, spelling index)
};

CustomTable& table() {
  static CustomTable custom;
  return custom;
}

}  // namespace

const OpDef* find_custom_op(const std::string& name) {
  CustomTable& custom = table();
  std::lock_guard lock(custom.mutex);
  auto it = custom.ops.find(name);
  return it == custom.ops.end() ? nullptr : it->second.get();
}

std::pair<const OpDef*, const AtenSpelling*> find_custom_spelling(const std::string& op_type) {
  CustomTable& custom = table();
  std::lock_guard lock(custom.mutex);
  auto it = custom.spellings.find(op_type);
  if (it == custom.spellings.end()) return {nullptr, nullptr};
  const OpDef* def = it->second.first;
  return {def, &def->spellings[it->second.second]};
}

std::vector<const OpDef*> custom_ops() {
  CustomTable& custom = table();
  std::lock_guard lock(custom.mutex);
  std::vector<const OpDef*> defs;
  for (const auto& [name, def] : custom.ops) defs.push_back(def.get());
  return defs;
}

void add_custom_op(OpDef def) {
  const OpRegistry& registry = OpRegistry::instance();
  if (def.name.empty()) fail("a custom op needs a name");
  if (registry.find(def.name)) fail("custom op '" + def.name + "': an op of that name is already registered");
  for (const AtenSpelling& spelling : def.spellings)
    if (registry.find_spelling(spelling.op_type).first)
      fail("custom op '" + def.name + "': the op_type '" + spelling.op_type + "' already belongs to an op");
  CustomTable& custom = table();
  std::lock_guard lock(custom.mutex);
  if (custom.ops.count(def.name)) fail("custom op '" + def.name + "': an op of that name is already registered");
  std::set<std::string> seen;
  for (const AtenSpelling& spelling : def.spellings)
    if (custom.spellings.count(spelling.op_type) || !seen.insert(spelling.op_type).second)
      fail("custom op '" + def.name + "': the op_type '" + spelling.op_type + "' is given twice");
  auto owned = std::make_unique<OpDef>(std::move(def));
  for (size_t i = 0; i < owned->spellings.size(); ++i) custom.spellings[owned->spellings[i].op_type] = {owned.get(), i};
  const std::string name = owned->name;
  custom.ops.emplace(name, std::move(owned));
}

namespace kernels {

namespace {

// The reference implementation of a custom op: the kernel launched on the node's inputs.
ReferenceFn kernel_reference(const CustomOp& op) {
  auto kernel = std::make_shared<const Kernel>(op.kernel);
  std::vector<std::string> tensor_inputs;
  for (const std::string& name : op.kernel.inputs)
    if (std::find(op.scalar_inputs.begin(), op.scalar_inputs.end(), name) == op.scalar_inputs.end())
      tensor_inputs.push_back(name);
  const std::set<std::string> scalar_names(op.scalar_inputs.begin(), op.scalar_inputs.end());
  const std::string name = op.name;
  const CustomLaunchFn launch = op.launch;
  return [=](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
    const std::string where = "custom op '" + name + "'";
    if (inputs.size() != tensor_inputs.size())
      fail(where + ": got " + std::to_string(inputs.size()) + " inputs, the kernel takes " +
           std::to_string(tensor_inputs.size()) + " tensors");
    if (outputs.size() != kernel->source().outputs.size())
      fail(where + ": the shape function gives " + std::to_string(outputs.size()) + " outputs, the kernel declares " +
           std::to_string(kernel->source().outputs.size()));
    std::vector<TensorMeta> input_metas;
    for (const Tensor& input : inputs) input_metas.push_back({input.shape(), input.dtype()});
    CustomOpLaunch call = launch(attrs, input_metas, outputs);
    std::map<std::string, Argument> arguments;
    for (size_t i = 0; i < inputs.size(); ++i) arguments[tensor_inputs[i]] = inputs[i];
    for (auto& [scalar, value] : call.scalars) {
      if (!scalar_names.count(scalar))
        fail(where + ": the launch function gives a value for '" + scalar + "', which is not a scalar input");
      arguments[scalar] = value;
    }
    for (const std::string& scalar : scalar_names)
      if (!call.scalars.count(scalar))
        fail(where + ": the launch function gives no value for scalar input '" + scalar + "'");
    call.config.outputs.clear();
    for (size_t o = 0; o < outputs.size(); ++o)
      call.config.outputs[kernel->source().outputs[o]] = {outputs[o].shape, reference_dtype(outputs[o].dtype)};
    return (*kernel)(arguments, call.config);
  };
}

}  // namespace

void register_custom_op(CustomOp op) {
  const std::string where = "custom op '" + op.name + "'";
  if (!op.infer) fail(where + ": needs a shape function");
  if (!op.launch) fail(where + ": needs a launch function");
  const Kernel checked(op.kernel);  // names
  for (const std::string& scalar : op.scalar_inputs)
    if (std::find(op.kernel.inputs.begin(), op.kernel.inputs.end(), scalar) == op.kernel.inputs.end())
      fail(where + ": scalar input '" + scalar + "' is not an input of kernel '" + op.kernel.name + "'");
  if (std::set<std::string>(op.scalar_inputs.begin(), op.scalar_inputs.end()).size() != op.scalar_inputs.size())
    fail(where + ": a scalar input is named twice");
  const int tensor_inputs = static_cast<int>(op.kernel.inputs.size() - op.scalar_inputs.size());
  OpDef def;
  def.name = op.name;
  if (op.spellings.empty()) op.spellings.push_back(op.name);
  for (const std::string& spelling : op.spellings) def.spellings.push_back(AtenSpelling{spelling, {}, {}});
  def.attrs = op.attrs;
  def.min_inputs = tensor_inputs;
  def.max_inputs = tensor_inputs;
  def.infer = op.infer;
  def.reference = kernel_reference(op);
  add_custom_op(std::move(def));
}

}  // namespace kernels
}  // namespace npusim
