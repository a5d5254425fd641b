// The human-readable dump behind `npusim inspect`.
#include <cstdio>
#include <sstream>

#include "program/program.h"

namespace npusim {

namespace {

using compiler::Placement;

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0)
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  return text;
}

std::string meta_string(const TensorMeta& meta) {
  return shape_string(meta.shape) + " " + std::string(dtype_name(meta.dtype));
}

// Long lists are cut so that a kernel stays on one line.
std::string short_attr(const AttrValue& value) {
  std::string text = attr_value_string(value);
  constexpr size_t kMaxChars = 48;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars - 4) + " ...";
  return text;
}

std::string attrs_string(const Attrs& attrs) {
  std::string text;
  for (const auto& [name, value] : attrs.values()) {
    if (name.starts_with("_")) continue;  // internal bookkeeping of tensor lists
    text += (text.empty() ? "" : " ") + name + "=" + short_attr(value);
  }
  return text;
}

class Describer {
 public:
  explicit Describer(const Program& program) : program_(program), graph_(program.graph) {}

  std::string run() {
    header();
    tensors("inputs", graph_.inputs);
    tensors("outputs", graph_.outputs);
    kernels();
    buffers();
    weights();
    constants();
    totals();
    return out_.str();
  }

 private:
  const std::string& name(ValueId id) const { return graph_.value(id).name; }

  void header() {
    out_ << "npusim program, format version " << Program::kFormatVersion << " (" << program_.producer << ")\n";
    out_ << "model: " << (graph_.model_name.empty() ? "(unnamed)" : graph_.model_name);
    if (!graph_.source.empty()) out_ << ", from " << graph_.source;
    if (!graph_.pytorch_version.empty()) out_ << " (PyTorch " << graph_.pytorch_version << ")";
    out_ << "\ntarget: " << program_.target << ", compute dtype: " << dtype_name(program_.compute_dtype) << "\n";
    out_ << "disabled passes: ";
    if (program_.disabled_passes.empty()) out_ << "(none)";
    for (size_t i = 0; i < program_.disabled_passes.size(); ++i) out_ << (i ? ", " : "") << program_.disabled_passes[i];
    out_ << "\npasses that changed the graph:" << (program_.pass_log.empty() ? " (none)" : "") << "\n";
    for (const std::string& line : program_.pass_log) out_ << "  " << line << "\n";
  }

  void tensors(const char* title, const std::vector<ValueId>& ids) {
    out_ << "\n" << title << " (" << ids.size() << "):\n";
    for (ValueId id : ids) out_ << "  " << name(id) << " " << meta_string(graph_.value(id).meta) << "\n";
  }

  std::string operands(const std::vector<ValueId>& ids) const {
    std::string text;
    for (ValueId id : ids)
      text += (text.empty() ? "" : ", ") + name(id) + " " + shape_string(graph_.value(id).meta.shape);
    return text;
  }

  void kernels() {
    out_ << "\nkernels (" << graph_.nodes.size() << "):\n";
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      const Node& node = graph_.nodes[n];
      out_ << "  #" << n << " " << node.op << " '" << node.name << "': " << operands(node.inputs) << " -> "
           << operands(node.outputs);
      const std::string attributes = attrs_string(node.attrs);
      if (!attributes.empty()) out_ << "  {" << attributes << "}";
      out_ << "\n";
    }
  }

  void buffers() {
    const compiler::MemoryPlan& plan = program_.plan;
    out_ << "\nbuffers (arena " << human_bytes(plan.arena_bytes) << ", alignment " << plan.alignment << "):\n";
    for (size_t i = 0; i < plan.values.size() && i < graph_.values.size(); ++i) {
      const compiler::BufferAssignment& buffer = plan.values[i];
      if (buffer.placement == Placement::None) continue;
      out_ << "  " << graph_.values[i].name << ": " << compiler::placement_name(buffer.placement);
      switch (buffer.placement) {
        case Placement::Arena:
          out_ << " @" << buffer.offset;
          break;
        case Placement::Persistent:
          out_ << " #" << buffer.offset;
          break;
        case Placement::View:
          out_ << " of " << name(buffer.alias_of);
          break;
        case Placement::None:
          break;
      }
      out_ << ", " << buffer.bytes << " bytes" << (buffer.in_place ? ", in place" : "") << "\n";
    }
  }

  // Totals count what kernels read; checkpoint tensors that only feed load-time transforms are marked.
  void weights() {
    std::vector<bool> read_by_kernel(graph_.values.size(), false), transform_source(graph_.values.size(), false);
    for (const Node& node : graph_.nodes)
      for (ValueId id : node.inputs) read_by_kernel[static_cast<size_t>(id)] = true;
    for (const Value& value : graph_.values)
      if (value.transform)
        for (ValueId source : value.transform->sources)
          if (source != kNoValue) transform_source[static_cast<size_t>(source)] = true;
    std::ostringstream lines;
    for (ValueId id : graph_.weights) {
      const Value& value = graph_.value(id);
      const auto index = static_cast<size_t>(id);
      if (read_by_kernel[index]) weight_bytes_ += compiler::storage_bytes(value.meta, program_.compute_dtype);
      lines << "  " << (value.weight_key.empty() ? value.name : value.weight_key) << " " << meta_string(value.meta);
      if (graph_.constants.count(value.weight_key)) lines << " (embedded constant)";
      if (!read_by_kernel[index]) lines << (transform_source[index] ? " (load time only)" : " (unused)");
      if (value.transform) {
        lines << " = " << value.transform->kind << "(";
        for (size_t i = 0; i < value.transform->sources.size(); ++i) {
          const ValueId source = value.transform->sources[i];
          lines << (i ? ", " : "") << (source == kNoValue ? std::string("none") : graph_.value(source).weight_key);
        }
        lines << ")";
        const std::string params = attrs_string(value.transform->params);
        if (!params.empty()) lines << " {" << params << "}";
      }
      lines << "\n";
    }
    out_ << "\nweights (" << graph_.weights.size() << "; kernels read " << human_bytes(weight_bytes_) << " in "
         << dtype_name(program_.compute_dtype) << "):\n"
         << lines.str();
  }

  void constants() {
    int64_t total = 0;
    for (const auto& [key, tensor] : graph_.constants) total += static_cast<int64_t>(tensor.nbytes());
    out_ << "\nconstants (" << graph_.constants.size() << ", " << human_bytes(total) << "):\n";
    for (const auto& [key, tensor] : graph_.constants)
      out_ << "  " << key << " " << shape_string(tensor.shape()) << " " << dtype_name(tensor.dtype()) << ", "
           << tensor.nbytes() << " bytes\n";
  }

  void totals() {
    const compiler::MemoryPlan& plan = program_.plan;
    // Like for like with the unplanned sum, which counts node outputs only: the arena plus persistent outputs.
    int64_t planned = plan.arena_bytes;
    for (size_t i = 0; i < plan.values.size() && i < graph_.values.size(); ++i)
      if (plan.values[i].placement == Placement::Persistent && graph_.values[i].kind == ValueKind::NodeOutput)
        planned += plan.values[i].bytes;
    out_ << "\ntotals:\n";
    out_ << "  arena       " << human_bytes(plan.arena_bytes) << "\n";
    out_ << "  persistent  " << human_bytes(plan.persistent_bytes) << "\n";
    out_ << "  weights     " << human_bytes(weight_bytes_) << " read by kernels\n";
    out_ << "  node outputs planned " << human_bytes(planned) << " vs unplanned " << human_bytes(plan.unplanned_bytes);
    if (plan.unplanned_bytes > 0) {
      char ratio[32];
      std::snprintf(ratio, sizeof(ratio), " (%.1f%%)",
                    100.0 * static_cast<double>(planned) / static_cast<double>(plan.unplanned_bytes));
      out_ << ratio;
    }
    out_ << "\n";
  }

  const Program& program_;
  const Graph& graph_;
  std::ostringstream out_;
  int64_t weight_bytes_ = 0;
};

}  // namespace

std::string describe_program(const Program& program) { return Describer(program).run(); }

}  // namespace npusim
