// `.npubin` -> Program. Nothing in the file is trusted: the FlatBuffers verifier checks the structure, then every
// enum, index, size and op is checked here before the program reaches an executor.
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "ir/torch_ir_reader.h"
#include "npubin_generated.h"
#include "npusim/op_registry.h"
#include "program/program.h"

namespace npusim {

namespace {

static_assert(std::endian::native == std::endian::little, ".npubin is little-endian");

constexpr size_t kMaxProgramBytes = FLATBUFFERS_MAX_BUFFER_SIZE - 1;

// The format version (field 0 of the root table), read with explicit bounds checks so that it can be reported
// for files the current schema cannot verify. Null when the bytes do not hold one.
std::optional<uint32_t> peek_format_version(const uint8_t* data, size_t size) {
  auto read = [&](size_t at, auto value) -> std::optional<decltype(value)> {
    if (at > size || size - at < sizeof(value)) return std::nullopt;
    std::memcpy(&value, data + at, sizeof(value));
    return value;
  };
  const auto root = read(0, uint32_t{});
  if (!root) return std::nullopt;
  const auto vtable_distance = read(*root, int32_t{});
  if (!vtable_distance) return std::nullopt;
  const int64_t vtable = static_cast<int64_t>(*root) - *vtable_distance;
  if (vtable < 0) return std::nullopt;
  const auto vtable_size = read(static_cast<size_t>(vtable), uint16_t{});
  if (!vtable_size) return std::nullopt;
  if (*vtable_size < 6) return uint32_t{0};  // field absent: the default
  const auto field = read(static_cast<size_t>(vtable) + 4, uint16_t{});
  if (!field) return std::nullopt;
  if (*field == 0) return uint32_t{0};
  return read(static_cast<size_t>(*root) + *field, uint32_t{});
}

std::string str(const flatbuffers::String* text) { return text ? text->str() : std::string(); }

// The verifier only checks that a vector's length field is 4-byte aligned; elements of 8-byte types are read in
// place, so a crafted file could otherwise make every read of them misaligned.
template <typename T>
bool elements_aligned(const flatbuffers::Vector<T>* vector) {
  // Empty vectors have nothing to read, and the builder does not pad them.
  return !vector || vector->size() == 0 || reinterpret_cast<uintptr_t>(vector->Data()) % alignof(T) == 0;
}

class ProgramReader {
 public:
  ProgramReader(const fb::Program& root, std::string source) : root_(root), source_(std::move(source)) {}

  Program read() {
    Program program;
    program.producer = str(root_.producer());
    program.target = str(root_.target());
    program.compute_dtype = dtype(static_cast<uint8_t>(root_.compute_dtype()), "the compute dtype");
    program.disabled_passes = strings(root_.disabled_passes());
    program.pass_log = strings(root_.pass_log());
    if (!root_.graph()) error("the program has no graph");
    read_graph(*root_.graph(), program.graph);
    read_constants(program.graph);
    if (!root_.plan()) error("the program has no memory plan");
    read_plan(*root_.plan(), program);
    return program;
  }

 private:
  [[noreturn]] void error(const std::string& message) const { fail(source_ + ": " + message); }

  DType dtype(uint8_t raw, const std::string& what) const {
    if (raw > static_cast<uint8_t>(DType::Bool)) error(what + " has an unknown dtype code " + std::to_string(raw));
    return static_cast<DType>(raw);
  }

  static std::vector<std::string> strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* list) {
    std::vector<std::string> result;
    if (list)
      for (const flatbuffers::String* text : *list) result.push_back(str(text));
    return result;
  }

  Shape shape(const flatbuffers::Vector<int64_t>* dims, const std::string& what) const {
    Shape result;
    if (!dims) return result;
    if (!elements_aligned(dims)) error(what + " has a misaligned shape");
    if (dims->size() > static_cast<size_t>(kMaxRank))
      error(what + " has rank " + std::to_string(dims->size()) + ", more than " + std::to_string(kMaxRank));
    int64_t numel = 1;
    for (int64_t dim : *dims) {
      if (dim < 0) error(what + " has a negative dimension " + std::to_string(dim));
      if (dim > 0 && numel > kMaxTensorElements / dim) error(what + " has more than 2^40 elements");
      numel *= dim;
      result.push_back(dim);
    }
    return result;
  }

  ValueId value_id(int32_t id, const std::string& what) const {
    if (id < 0 || static_cast<size_t>(id) >= value_count_)
      error(what + " refers to value " + std::to_string(id) + ", out of range (the graph has " +
            std::to_string(value_count_) + " values)");
    return id;
  }

  std::vector<ValueId> value_ids(const flatbuffers::Vector<int32_t>* ids, const std::string& what) const {
    std::vector<ValueId> result;
    if (!ids) return result;
    result.reserve(ids->size());
    for (int32_t id : *ids) result.push_back(value_id(id, what));
    return result;
  }

  AttrValue attr_value(const fb::Attr& attr, const std::string& what) const {
    switch (attr.value_type()) {
      case fb::AttrValue::NoneAttr:
        return NoneValue{};
      case fb::AttrValue::BoolAttr:
        return attr.value_as_BoolAttr()->value();
      case fb::AttrValue::IntAttr:
        return attr.value_as_IntAttr()->value();
      case fb::AttrValue::DoubleAttr:
        return attr.value_as_DoubleAttr()->value();
      case fb::AttrValue::StringAttr:
        return str(attr.value_as_StringAttr()->value());
      case fb::AttrValue::IntListAttr: {
        const auto* values = attr.value_as_IntListAttr()->values();
        if (!elements_aligned(values)) fail(what + " has misaligned values");
        return values ? std::vector<int64_t>(values->begin(), values->end()) : std::vector<int64_t>{};
      }
      case fb::AttrValue::DoubleListAttr: {
        const auto* values = attr.value_as_DoubleListAttr()->values();
        if (!elements_aligned(values)) fail(what + " has misaligned values");
        return values ? std::vector<double>(values->begin(), values->end()) : std::vector<double>{};
      }
      case fb::AttrValue::BoolListAttr: {
        std::vector<bool> result;
        if (const auto* values = attr.value_as_BoolListAttr()->values())
          for (uint8_t value : *values) result.push_back(value != 0);
        return result;
      }
      default:
        fail(what + " has no value or an unknown value type " + std::to_string(static_cast<int>(attr.value_type())));
    }
  }

  // `owner` names the file and the node or weight, for errors now and later.
  Attrs attrs(const flatbuffers::Vector<flatbuffers::Offset<fb::Attr>>* list, const std::string& owner) const {
    Attrs result(owner);
    if (!list) return result;
    for (const fb::Attr* attr : *list) {
      const std::string name = attr->name()->str();
      if (result.has(name)) fail(owner + ": attribute '" + name + "' appears twice");
      // The verifier accepts a union whose table is missing.
      if (attr->value_type() != fb::AttrValue::NONE && !attr->value())
        fail(owner + ": attribute '" + name + "' has no value");
      result.set(name, attr_value(*attr, owner + ": attribute '" + name + "'"));
    }
    return result;
  }

  void read_graph(const fb::Graph& in, Graph& graph) {
    graph.model_name = str(in.model_name());
    graph.pytorch_version = str(in.pytorch_version());
    graph.source = str(in.source());
    const size_t value_count = in.values() ? in.values()->size() : 0;
    const size_t node_count = in.nodes() ? in.nodes()->size() : 0;
    if (value_count > static_cast<size_t>(INT32_MAX) || node_count > static_cast<size_t>(INT32_MAX))
      error("the graph is too large");
    value_count_ = value_count;
    graph.values.resize(value_count);
    for (size_t i = 0; i < value_count; ++i)
      read_value(*in.values()->Get(static_cast<flatbuffers::uoffset_t>(i)), i, graph);
    graph.nodes.resize(node_count);
    for (size_t n = 0; n < node_count; ++n)
      read_node(*in.nodes()->Get(static_cast<flatbuffers::uoffset_t>(n)), n, graph);
    check_producers(graph);
    graph.inputs = value_ids(in.inputs(), "graph input list");
    graph.outputs = value_ids(in.outputs(), "graph output list");
    graph.weights = value_ids(in.weights(), "graph weight list");
    for (ValueId id : graph.inputs)
      if (graph.value(id).kind != ValueKind::GraphInput)
        error("graph input '" + graph.value(id).name + "' is not a graph input value");
    for (ValueId id : graph.weights)
      if (graph.value(id).kind != ValueKind::Weight)
        error("weight '" + graph.value(id).name + "' is not a weight value");
    for (ValueId id : graph.outputs) {
      const Value& value = graph.value(id);
      if (value.kind == ValueKind::NodeOutput && value.producer < 0)
        error("graph output '" + value.name + "' has no producer");
    }
  }

  void read_value(const fb::Value& in, size_t index, Graph& graph) {
    Value& value = graph.values[index];
    value.name = in.name()->str();
    const std::string what = "value " + std::to_string(index) + " '" + value.name + "'";
    value.meta.shape = shape(in.shape(), what);
    value.meta.dtype = dtype(static_cast<uint8_t>(in.dtype()), what);
    const auto kind = static_cast<uint8_t>(in.kind());
    if (kind > static_cast<uint8_t>(ValueKind::NodeOutput))
      error(what + " has an unknown kind " + std::to_string(kind));
    value.kind = static_cast<ValueKind>(kind);
    value.producer = in.producer();
    value.producer_slot = in.producer_slot();
    value.weight_key = str(in.weight_key());
    if (const fb::WeightTransform* transform = in.transform()) {
      WeightTransform result;
      result.kind = transform->kind()->str();
      if (transform->sources())
        for (int32_t id : *transform->sources())
          result.sources.push_back(id == kNoValue ? kNoValue : value_id(id, what + " transform source"));
      result.params = attrs(transform->params(), source_ + ": weight '" + value.name + "' transform");
      value.transform = std::move(result);
    }
  }

  void read_node(const fb::Node& in, size_t index, Graph& graph) {
    Node& node = graph.nodes[index];
    node.name = in.name()->str();
    node.op = in.op()->str();
    node.source_op = str(in.source_op());
    const std::string where = "node '" + node.name + "' (" + node.op + ")";
    node.def = OpRegistry::instance().find(node.op);
    if (!node.def) error(where + ": op '" + node.op + "' is not known to this npusim; recompile the model");
    node.attrs = attrs(in.attrs(), source_ + ": " + where);
    node.inputs = value_ids(in.inputs(), where + " input");
    node.outputs = value_ids(in.outputs(), where + " output");
    for (ValueId id : node.inputs) {
      const Value& value = graph.value(id);
      if (value.kind == ValueKind::NodeOutput && (value.producer < 0 || value.producer >= static_cast<int32_t>(index)))
        error(where + " reads '" + value.name + "' before it is produced");
    }
    for (size_t slot = 0; slot < node.outputs.size(); ++slot) {
      const Value& value = graph.value(node.outputs[slot]);
      if (value.kind != ValueKind::NodeOutput || value.producer != static_cast<int32_t>(index) ||
          value.producer_slot != static_cast<int32_t>(slot))
        error(where + " output " + std::to_string(slot) + " '" + value.name + "' does not name this node as producer");
    }
    check_against_registry(node, graph, where);
  }

  void check_against_registry(const Node& node, const Graph& graph, const std::string& where) const {
    const OpDef& def = *node.def;
    const auto count = static_cast<int>(node.inputs.size());
    if (count < def.min_inputs || (def.max_inputs >= 0 && count > def.max_inputs))
      error(where + ": " + std::to_string(count) + " inputs, the op takes " + std::to_string(def.min_inputs) +
            (def.max_inputs < 0 ? " or more" : " to " + std::to_string(def.max_inputs)));
    std::vector<TensorMeta> input_metas;
    input_metas.reserve(node.inputs.size());
    for (ValueId id : node.inputs) input_metas.push_back(graph.value(id).meta);
    std::vector<TensorMeta> inferred;
    try {
      inferred = def.infer(node.attrs, input_metas);
    } catch (const std::exception& failure) {
      error(where + ": " + failure.what());
    }
    if (inferred.size() != node.outputs.size())
      error(where + " lists " + std::to_string(node.outputs.size()) + " outputs, the op has " +
            std::to_string(inferred.size()));
    for (size_t i = 0; i < inferred.size(); ++i) {
      const TensorMeta& stored = graph.value(node.outputs[i]).meta;
      if (stored.shape != inferred[i].shape || reference_dtype(stored.dtype) != reference_dtype(inferred[i].dtype))
        error(where + " output " + std::to_string(i) + " is stored as " + shape_string(stored.shape) + " " +
              std::string(dtype_name(stored.dtype)) + " but the op computes " + shape_string(inferred[i].shape) + " " +
              std::string(dtype_name(inferred[i].dtype)));
    }
  }

  // Every value that names a producer is that producer's output at that slot.
  void check_producers(const Graph& graph) const {
    for (size_t i = 0; i < graph.values.size(); ++i) {
      const Value& value = graph.values[i];
      if (value.producer < 0) continue;
      const std::string what = "value '" + value.name + "'";
      if (value.kind != ValueKind::NodeOutput) error(what + " is not a node output but names a producer");
      if (static_cast<size_t>(value.producer) >= graph.nodes.size())
        error(what + " names producer node " + std::to_string(value.producer) + ", out of range");
      const Node& node = graph.nodes[static_cast<size_t>(value.producer)];
      if (value.producer_slot < 0 || static_cast<size_t>(value.producer_slot) >= node.outputs.size() ||
          node.outputs[static_cast<size_t>(value.producer_slot)] != static_cast<ValueId>(i))
        error(what + " is not output " + std::to_string(value.producer_slot) + " of node '" + node.name + "'");
    }
  }

  void read_constants(Graph& graph) const {
    if (!root_.constants()) return;
    for (const fb::Constant* constant : *root_.constants()) {
      const std::string name = constant->name()->str();
      const std::string what = "constant '" + name + "'";
      const DType type = dtype(static_cast<uint8_t>(constant->dtype()), what);
      const Shape dims = shape(constant->shape(), what);
      const size_t stored = constant->data() ? constant->data()->size() : 0;
      // Checked before allocating: the shape alone may claim gigabytes the file does not hold.
      const size_t needed = static_cast<size_t>(shape_numel(dims)) * dtype_size(type);
      if (stored != needed)
        error(what + " holds " + std::to_string(stored) + " bytes but " + shape_string(dims) + " " +
              std::string(dtype_name(type)) + " needs " + std::to_string(needed));
      Tensor tensor(type, dims);
      if (stored > 0) std::memcpy(tensor.mutable_bytes(), constant->data()->data(), stored);
      if (!graph.constants.emplace(name, std::move(tensor)).second) error(what + " appears twice");
    }
  }

  void read_plan(const fb::MemoryPlan& in, Program& program) const {
    compiler::MemoryPlan& plan = program.plan;
    const Graph& graph = program.graph;
    plan.alignment = in.alignment();
    plan.arena_bytes = in.arena_bytes();
    plan.persistent_bytes = in.persistent_bytes();
    plan.unplanned_bytes = in.unplanned_bytes();
    if (plan.alignment <= 0 || (plan.alignment & (plan.alignment - 1)) != 0)
      error("memory plan alignment " + std::to_string(plan.alignment) + " is not a power of two");
    if (plan.arena_bytes < 0 || plan.persistent_bytes < 0 || plan.unplanned_bytes < 0)
      error("memory plan totals are negative");
    if (!elements_aligned(in.buffers())) error("memory plan buffers are misaligned");
    const size_t count = in.buffers() ? in.buffers()->size() : 0;
    if (count != graph.values.size())
      error("memory plan covers " + std::to_string(count) + " values but the graph has " +
            std::to_string(graph.values.size()));
    plan.values.resize(count);
    for (size_t i = 0; i < count; ++i) {
      const fb::Buffer& buffer = *in.buffers()->Get(static_cast<flatbuffers::uoffset_t>(i));
      const std::string what = "buffer of '" + graph.values[i].name + "'";
      const auto placement = static_cast<uint8_t>(buffer.placement());
      if (placement > static_cast<uint8_t>(compiler::Placement::View))
        error(what + " has an unknown placement " + std::to_string(placement));
      compiler::BufferAssignment& out = plan.values[i];
      out.placement = static_cast<compiler::Placement>(placement);
      out.offset = buffer.offset();
      out.bytes = buffer.bytes();
      out.alias_of = buffer.alias_of();
      out.in_place = buffer.in_place();
      const int64_t needed = compiler::storage_bytes(graph.values[i].meta, program.compute_dtype);
      if (out.bytes != needed)
        error(what + " has " + std::to_string(out.bytes) + " bytes but the value needs " + std::to_string(needed));
      if (out.offset < 0) error(what + " has a negative offset");
      if (out.placement == compiler::Placement::Arena &&
          (out.offset % plan.alignment != 0 || out.offset > plan.arena_bytes - out.bytes))
        error(what + " at offset " + std::to_string(out.offset) + " does not fit the " +
              std::to_string(plan.arena_bytes) + "-byte arena at alignment " + std::to_string(plan.alignment));
      if (out.alias_of != kNoValue) value_id(out.alias_of, what + " alias");
      if (out.placement == compiler::Placement::View && out.alias_of == kNoValue) error(what + " is a view of nothing");
    }
    for (size_t i = 0; i < count; ++i) {
      const compiler::BufferAssignment& view = plan.values[i];
      if (view.placement != compiler::Placement::View) continue;
      const compiler::BufferAssignment& root = plan.values[static_cast<size_t>(view.alias_of)];
      if (root.placement == compiler::Placement::View || root.bytes != view.bytes ||
          (root.placement != compiler::Placement::None && root.offset != view.offset))
        error("buffer of '" + graph.values[i].name + "' is not a view of a root buffer of the same size and offset");
    }
  }

  const fb::Program& root_;
  std::string source_;
  size_t value_count_ = 0;
};

}  // namespace

Program read_program_bytes(const uint8_t* data, size_t size, const std::string& source) {
  if (size < 8 || !data) fail(source + ": not an npusim program (" + std::to_string(size) + " bytes is too short)");
  if (!fb::ProgramBufferHasIdentifier(data))
    fail(source + ": not an npusim program (the 'NPUB' identifier is missing)");
  if (size > kMaxProgramBytes) fail(source + ": " + std::to_string(size) + " bytes is larger than a program can be");
  // Scalars are read in place: the buffer must be as aligned as the builder aligned it.
  std::vector<uint64_t> aligned_copy;
  if (reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) != 0) {
    aligned_copy.resize((size + 7) / 8);
    std::memcpy(aligned_copy.data(), data, size);
    data = reinterpret_cast<const uint8_t*>(aligned_copy.data());
  }
  auto fail_version = [&](uint32_t version) {
    fail(source + ": written by format version " + std::to_string(version) + ", this npusim reads version " +
         std::to_string(Program::kFormatVersion) + "; recompile the model");
  };
  // A file of a later version may differ anywhere but in its identifier and version field: name the version
  // when it is plausible, so that damage elsewhere is not mistaken for an old reader.
  auto fail_damaged = [&](const std::string& what) {
    constexpr uint32_t kMaxPlausibleVersion = 1000;
    const std::optional<uint32_t> version = peek_format_version(data, size);
    if (version && *version > Program::kFormatVersion && *version <= kMaxPlausibleVersion) fail_version(*version);
    fail(source + ": the program is truncated or corrupted (" + what + ")");
  };

  uint64_t payload = 0;
  uint32_t checksum = 0;
  if (size >= kNpubinFooterBytes) {
    std::memcpy(&payload, data + size - kNpubinFooterBytes, sizeof(payload));
    std::memcpy(&checksum, data + size - kNpubinFooterBytes + sizeof(payload), sizeof(checksum));
  }
  if (size < kNpubinFooterBytes + 8 || payload != size - kNpubinFooterBytes)
    fail_damaged("its footer does not record its size: " + std::to_string(size) + " bytes");
  if (crc32(data, payload) != checksum) fail_damaged("checksum mismatch");
  flatbuffers::Verifier verifier(data, payload, /*max_depth=*/64, /*max_tables=*/100'000'000);
  if (!fb::VerifyProgramBuffer(verifier)) fail_damaged("its structure does not verify");
  const fb::Program& root = *fb::GetProgram(data);
  if (root.format_version() != Program::kFormatVersion) fail_version(root.format_version());
  return ProgramReader(root, source).read();
}

Program read_program(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail(path + ": is a directory, not a program");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("cannot open program '" + path + "': " + std::strerror(errno));
  const std::streamoff size = in.tellg();
  if (size < 0) fail("cannot read program '" + path + "'");
  if (static_cast<size_t>(size) > kMaxProgramBytes)
    fail(path + ": " + std::to_string(size) + " bytes is larger than a program can be");
  std::vector<uint64_t> buffer((static_cast<size_t>(size) + 7) / 8);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(buffer.data()), size);
  if (!in) fail("cannot read program '" + path + "': the read stopped early");
  return read_program_bytes(reinterpret_cast<const uint8_t*>(buffer.data()), static_cast<size_t>(size), path);
}

}  // namespace npusim
