#include "kernel_api/kernel_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "npusim/error.h"

namespace npusim::kernels {

Grid grid_of(Blocks blocks, ThreadGroup threadgroup) {
  return Grid{blocks.x * threadgroup.x, blocks.y * threadgroup.y, blocks.z * threadgroup.z};
}

std::string_view device_name(Device device) { return device == Device::Cpu ? "cpu" : "cuda"; }

std::optional<Device> parse_device(std::string_view text) {
  if (text == "cpu") return Device::Cpu;
  if (text == "cuda" || text == "gpu") return Device::Cuda;
  return std::nullopt;
}

namespace detail {

namespace {

// Names the generated code defines, C++ and CUDA keywords and built-ins a parameter must not shadow.
const std::set<std::string>& reserved_names() {
  static const std::set<std::string> names = {
      "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
      "threads_per_threadgroup", "threads_per_grid", "threadgroups_per_grid", "shared_memory", "threadgroup_barrier",
      "kernel_assert", "atomic", "atomic_add", "atomic_load", "atomic_store", "half", "bfloat16", "uint3", "int8_t",
      "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "size_t", "threadIdx", "blockIdx",
      "blockDim", "gridDim", "warpSize", "printf", "min", "max", "std",
      // C++ keywords
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
      "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr", "constinit",
      "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete", "do", "double",
      "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
      "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or",
      "or_eq", "private", "protected", "public", "register", "reinterpret_cast", "requires", "return", "short",
      "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch", "template", "this",
      "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual",
      "void", "volatile", "wchar_t", "while", "xor", "xor_eq"};
  return names;
}

bool is_identifier(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Checks one name a kernel declares; `what` says which ("input", "template parameter", ...).
void check_name(const std::string& kernel, const std::string& what, const std::string& name) {
  const std::string where = "kernel '" + kernel + "': " + what + " '" + name + "'";
  if (!is_identifier(name)) fail(where + " is not a C identifier");
  if (name.rfind("__", 0) == 0 || (name.size() > 1 && name[0] == '_' && std::isupper(name[1])) ||
      name.rfind("npusim_", 0) == 0)
    fail(where + " uses a reserved prefix (__, _X or npusim_)");
  if (reserved_names().count(name)) fail(where + " is a name the kernel API or C++ already defines");
}

std::string dims_string(int64_t x, int64_t y, int64_t z) {
  std::string text = "{";
  text += std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + "}";
  return text;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "'" : ", '") + name + "'";
  return text;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool mentions(const std::string& text, const std::string& word) {
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool starts = at == 0 || !is_identifier_char(text[at - 1]);
    const bool ends = at + word.size() == text.size() || !is_identifier_char(text[at + word.size()]);
    if (starts && ends) return true;
  }
  return false;
}

const char* type_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
    case DType::Float16:
      return "half";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Int8:
      return "int8_t";
    case DType::Int16:
      return "int16_t";
    case DType::Int32:
      return "int32_t";
    case DType::Int64:
      return "int64_t";
    case DType::UInt8:
      return "uint8_t";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

std::array<std::byte, 8> encode_value(DType dtype, const std::variant<double, int64_t>& value,
                                      const std::string& what) {
  std::array<std::byte, 8> bytes{};
  const double number =
      std::holds_alternative<double>(value) ? std::get<double>(value) : static_cast<double>(std::get<int64_t>(value));
  auto store = [&](auto typed) { std::memcpy(bytes.data(), &typed, sizeof typed); };
  auto integer = [&](int64_t low, int64_t high) {
    int64_t whole = 0;
    if (std::holds_alternative<int64_t>(value)) {
      whole = std::get<int64_t>(value);
    } else {
      if (!std::isfinite(number) || number != std::floor(number) || number < -9.2e18 || number > 9.2e18)
        fail(what + " " + std::to_string(number) + " is not a whole number, as " + std::string(dtype_name(dtype)) +
             " needs");
      whole = static_cast<int64_t>(number);
    }
    if (whole < low || whole > high)
      fail(what + " " + std::to_string(whole) + " does not fit in " + std::string(dtype_name(dtype)));
    return whole;
  };
  switch (dtype) {
    case DType::Float32:
      store(static_cast<float>(number));
      break;
    case DType::Float64:
      store(number);
      break;
    case DType::Float16:
      store(float_to_fp16(static_cast<float>(number)));
      break;
    case DType::BFloat16:
      store(float_to_bf16(static_cast<float>(number)));
      break;
    case DType::Int8:
      store(static_cast<int8_t>(integer(INT8_MIN, INT8_MAX)));
      break;
    case DType::Int16:
      store(static_cast<int16_t>(integer(INT16_MIN, INT16_MAX)));
      break;
    case DType::Int32:
      store(static_cast<int32_t>(integer(INT32_MIN, INT32_MAX)));
      break;
    case DType::Int64:
      store(integer(INT64_MIN, INT64_MAX));
      break;
    case DType::UInt8:
      store(static_cast<uint8_t>(integer(0, UINT8_MAX)));
      break;
    case DType::Bool:
      store(static_cast<uint8_t>(integer(0, 1)));
      break;
  }
  return bytes;
}

std::string Plan::label() const { return "kernel '" + source->name + "' (" + std::string(device_name(device)) + ")"; }

bool Plan::uses_dtype(DType dtype) const {
  for (const Param& param : params)
    if (param.dtype == dtype) return true;
  for (const auto& [name, value] : templates)
    if (std::holds_alternative<DType>(value) && std::get<DType>(value) == dtype) return true;
  return false;
}

void check_source(const KernelSource& source) {
  if (!is_identifier(source.name) || source.name.rfind("npusim_", 0) == 0 || source.name.rfind("__", 0) == 0)
    fail("kernel name '" + source.name + "' is not a C identifier without a reserved prefix");
  if (source.outputs.empty()) fail("kernel '" + source.name + "': declares no outputs");
  if (source.body.find_first_not_of(" \t\r\n") == std::string::npos)
    fail("kernel '" + source.name + "': the body is empty");
  if (source.max_threads_per_threadgroup < 0)
    fail("kernel '" + source.name + "': max_threads_per_threadgroup must not be negative");
  // Every name the body can see, including the derived shape names, must be unique.
  std::map<std::string, std::string> declared;  // name -> what declared it
  auto declare = [&](const std::string& name, const std::string& what) {
    if (auto it = declared.find(name); it != declared.end())
      fail("kernel '" + source.name + "': " + what + " clashes with " + it->second);
    declared[name] = what;
  };
  for (const auto* list : {&source.inputs, &source.outputs}) {
    const std::string what = list == &source.inputs ? "input" : "output";
    for (const std::string& name : *list) {
      check_name(source.name, what, name);
      declare(name, what + " '" + name + "'");
    }
  }
  for (const auto* list : {&source.inputs, &source.outputs})
    for (const std::string& name : *list)
      for (const char* suffix : {"_shape", "_strides", "_ndim"})
        declare(name + suffix, "the name '" + name + suffix + "' derived from '" + name + "'");
}

Plan make_plan(const KernelSource& source, const std::map<std::string, Argument>& arguments,
               const LaunchConfig& config) {
  Plan plan;
  plan.source = &source;
  plan.device = config.device;
  plan.verbose = config.verbose;
  const std::string label = plan.label();

  // Arguments: every input bound, nothing bound that the kernel does not declare.
  std::vector<std::string> unbound, unknown;
  for (const std::string& name : source.inputs)
    if (!arguments.count(name)) unbound.push_back(name);
  for (const std::string& name : source.outputs)
    if (!arguments.count(name) && !config.outputs.count(name)) unbound.push_back(name);
  if (!unbound.empty())
    fail(label + ": unbound argument" + (unbound.size() > 1 ? "s " : " ") + joined(unbound) +
         " (bind every input; give every output a shape and dtype in LaunchConfig::outputs or bind it to a "
         "tensor to update in place)");
  auto declares = [&](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const auto& [name, argument] : arguments)
    if (!declares(source.inputs, name) && !declares(source.outputs, name)) unknown.push_back(name);
  if (!unknown.empty())
    fail(label + ": argument" + (unknown.size() > 1 ? "s " : " ") + joined(unknown) +
         " not declared by the kernel (inputs " + joined(source.inputs) + ", outputs " + joined(source.outputs) + ")");
  for (const auto& [name, spec] : config.outputs)
    if (!declares(source.outputs, name))
      fail(label + ": LaunchConfig::outputs names '" + name + "', which is not an output of the kernel (outputs " +
           joined(source.outputs) + ")");

  auto check_rank = [&](const std::string& name, const Shape& shape) {
    if (shape.size() > static_cast<size_t>(kMaxDims))
      fail(label + ": '" + name + "' has rank " + std::to_string(shape.size()) + "; kernels take at most rank " +
           std::to_string(kMaxDims));
    for (int64_t d : shape)
      if (d < 0) fail(label + ": '" + name + "' has a negative dimension in shape " + shape_string(shape));
  };
  for (const std::string& name : source.inputs) {
    Param param;
    param.name = name;
    const Argument& argument = arguments.at(name);
    if (const auto* scalar = std::get_if<Scalar>(&argument)) {
      param.scalar = true;
      param.dtype = scalar->dtype;
    } else {
      const Tensor& tensor = std::get<Tensor>(argument);
      if (!tensor.defined()) fail(label + ": input '" + name + "' is bound to a tensor with no storage");
      param.dtype = tensor.dtype();
      param.shape = tensor.shape();
      check_rank(name, param.shape);
    }
    plan.params.push_back(std::move(param));
  }
  for (const std::string& name : source.outputs) {
    Param param;
    param.name = name;
    param.output = true;
    auto bound = arguments.find(name);
    auto spec = config.outputs.find(name);
    if (bound != arguments.end()) {
      const Tensor* tensor = std::get_if<Tensor>(&bound->second);
      if (!tensor) fail(label + ": output '" + name + "' is bound to a scalar; an output must be a tensor");
      if (!tensor->defined()) fail(label + ": output '" + name + "' is bound to a tensor with no storage");
      param.dtype = tensor->dtype();
      param.shape = tensor->shape();
      if (spec != config.outputs.end() && (spec->second.shape != param.shape || spec->second.dtype != param.dtype))
        fail(label + ": output '" + name + "' is bound to a " + std::string(dtype_name(param.dtype)) +
             " tensor of shape " + shape_string(param.shape) + " but LaunchConfig::outputs says " +
             std::string(dtype_name(spec->second.dtype)) + " " + shape_string(spec->second.shape));
    } else {
      param.dtype = spec->second.dtype;
      param.shape = spec->second.shape;
    }
    check_rank(name, param.shape);
    if (source.atomic_outputs && param.dtype != DType::Float32 && param.dtype != DType::Float64 &&
        param.dtype != DType::Int32 && param.dtype != DType::Int64)
      fail(label + ": dtype " + std::string(dtype_name(param.dtype)) + " of atomic output '" + name +
           "' is not supported (atomic outputs are float32, float64, int32 or int64)");
    plan.params.push_back(std::move(param));
  }

  // Template arguments: distinct identifiers that clash with nothing else the body sees.
  std::set<std::string> template_names;
  for (const auto& [name, value] : config.template_args) {
    check_name(source.name, "template parameter", name);
    if (!template_names.insert(name).second) fail(label + ": template parameter '" + name + "' is given twice");
    for (const Param& param : plan.params)
      for (const char* suffix : {"", "_shape", "_strides", "_ndim"})
        if (name == param.name + suffix)
          fail(label + ": template parameter '" + name + "' clashes with a name of " +
               (param.output ? "output '" : "input '") + param.name + "'");
  }
  plan.templates = config.template_args;

  // Geometry.
  const Grid& grid = config.grid;
  const ThreadGroup& group = config.threadgroup;
  if (grid.x <= 0 || grid.y <= 0 || grid.z <= 0)
    fail(label + ": the grid " + dims_string(grid.x, grid.y, grid.z) +
         " is empty; every dimension counts threads and must be at least 1");
  if (group.x <= 0 || group.y <= 0 || group.z <= 0)
    fail(label + ": the threadgroup " + dims_string(group.x, group.y, group.z) +
         " is empty; every dimension must be at least 1");
  constexpr int64_t kMaxPosition = std::numeric_limits<uint32_t>::max();
  if (grid.x + group.x > kMaxPosition || grid.y + group.y > kMaxPosition || grid.z + group.z > kMaxPosition)
    fail(label + ": the grid " + dims_string(grid.x, grid.y, grid.z) + " with threadgroup " +
         dims_string(group.x, group.y, group.z) + " does not fit 32-bit thread positions");
  if (config.shared_memory_bytes < 0) fail(label + ": shared_memory_bytes must not be negative");
  plan.grid = grid;
  plan.threadgroup = group;
  plan.blocks = Blocks{ceil_div(grid.x, group.x), ceil_div(grid.y, group.y), ceil_div(grid.z, group.z)};
  plan.shared_memory_bytes = config.shared_memory_bytes;

  const std::string code = source.header + "\n" + source.body;
  plan.uses_barrier = mentions(code, "threadgroup_barrier");
  plan.uses_shared_memory = mentions(code, "shared_memory");
  if (plan.uses_shared_memory && plan.shared_memory_bytes == 0)
    fail(label + ": the body uses shared_memory but the launch reserves none (set LaunchConfig::shared_memory_bytes)");
  // Threads past the grid do not run; a barrier needs every thread of a group, so the groups must tile the grid.
  if (plan.uses_barrier && (grid.x % group.x != 0 || grid.y % group.y != 0 || grid.z % group.z != 0))
    fail(label + ": the body uses threadgroup_barrier, so the grid " + dims_string(grid.x, grid.y, grid.z) +
         " must be a multiple of the threadgroup " + dims_string(group.x, group.y, group.z) +
         " in every dimension (round the grid up and skip the extra threads in the body)");

  for (size_t p = 0; p < plan.params.size(); ++p) {
    plan.slots.push_back({SlotKind::Data, p});
    if (plan.params[p].scalar) continue;
    const std::string& name = plan.params[p].name;
    if (mentions(code, name + "_shape")) plan.slots.push_back({SlotKind::Shape, p});
    if (mentions(code, name + "_strides")) plan.slots.push_back({SlotKind::Strides, p});
    if (mentions(code, name + "_ndim")) plan.slots.push_back({SlotKind::Ndim, p});
  }
  return plan;
}

void fill_slots(const Plan& plan, std::vector<void*> data, const std::vector<std::array<std::byte, 8>>& scalars,
                SlotStorage& storage) {
  storage.data = std::move(data);
  storage.scalars = scalars;
  storage.dims.assign(plan.slots.size(), SlotStorage::Dims{});
  storage.ndims.assign(plan.slots.size(), 0);
  storage.pointers.assign(plan.slots.size(), nullptr);
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const Slot& slot = plan.slots[s];
    const Param& param = plan.params[slot.param];
    switch (slot.kind) {
      case SlotKind::Data:
        storage.pointers[s] = param.scalar ? static_cast<void*>(storage.scalars[slot.param].data())
                                           : static_cast<void*>(&storage.data[slot.param]);
        break;
      case SlotKind::Shape:
      case SlotKind::Strides: {
        const Shape values = slot.kind == SlotKind::Shape ? param.shape : contiguous_strides(param.shape);
        for (size_t d = 0; d < values.size(); ++d) storage.dims[s].values[d] = values[d];
        storage.pointers[s] = &storage.dims[s];
        break;
      }
      case SlotKind::Ndim:
        storage.ndims[s] = static_cast<int32_t>(param.shape.size());
        storage.pointers[s] = &storage.ndims[s];
        break;
    }
  }
}

}  // namespace detail
}  // namespace npusim::kernels
