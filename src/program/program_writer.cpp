// Program -> `.npubin` (FlatBuffers). The file is written next to its destination and renamed over it, so a
// reader never sees half a program.
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "npubin_generated.h"
#include "program/program.h"

namespace npusim {

namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

class ProgramWriter {
 public:
  explicit ProgramWriter(const Program& program) : program_(program), graph_(program.graph) {}

  // Returns the finished buffer, owned by the builder.
  flatbuffers::DetachedBuffer build() {
    const Offset<fb::Graph> graph = write_graph();
    const Offset<flatbuffers::Vector<Offset<fb::Constant>>> constants = write_constants();
    const Offset<fb::MemoryPlan> plan = write_plan();
    const auto root = fb::CreateProgram(builder_, Program::kFormatVersion, builder_.CreateString(program_.producer),
                                        builder_.CreateString(program_.target), dtype(program_.compute_dtype),
                                        builder_.CreateVectorOfStrings(program_.disabled_passes),
                                        builder_.CreateVectorOfStrings(program_.pass_log), graph, constants, plan);
    fb::FinishProgramBuffer(builder_, root);
    return builder_.Release();
  }

 private:
  static fb::DType dtype(DType value) { return static_cast<fb::DType>(value); }

  Offset<flatbuffers::Vector<int64_t>> shape(const Shape& dims) { return builder_.CreateVector(dims); }

  Offset<fb::Attr> write_attr(const std::string& name, const AttrValue& value) {
    struct Visitor {
      FlatBufferBuilder& b;
      std::pair<fb::AttrValue, Offset<void>> operator()(const NoneValue&) const {
        return {fb::AttrValue::NoneAttr, fb::CreateNoneAttr(b).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(bool v) const {
        return {fb::AttrValue::BoolAttr, fb::CreateBoolAttr(b, v).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(int64_t v) const {
        return {fb::AttrValue::IntAttr, fb::CreateIntAttr(b, v).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(double v) const {
        return {fb::AttrValue::DoubleAttr, fb::CreateDoubleAttr(b, v).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(const std::string& v) const {
        return {fb::AttrValue::StringAttr, fb::CreateStringAttr(b, b.CreateString(v)).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(const std::vector<int64_t>& v) const {
        return {fb::AttrValue::IntListAttr, fb::CreateIntListAttr(b, b.CreateVector(v)).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(const std::vector<double>& v) const {
        return {fb::AttrValue::DoubleListAttr, fb::CreateDoubleListAttr(b, b.CreateVector(v)).Union()};
      }
      std::pair<fb::AttrValue, Offset<void>> operator()(const std::vector<bool>& v) const {
        const std::vector<uint8_t> bytes(v.begin(), v.end());
        return {fb::AttrValue::BoolListAttr, fb::CreateBoolListAttr(b, b.CreateVector(bytes)).Union()};
      }
    };
    const auto [type, table] = std::visit(Visitor{builder_}, value);
    return fb::CreateAttr(builder_, builder_.CreateString(name), type, table);
  }

  Offset<flatbuffers::Vector<Offset<fb::Attr>>> write_attrs(const Attrs& attrs) {
    std::vector<Offset<fb::Attr>> entries;
    entries.reserve(attrs.values().size());
    for (const auto& [name, value] : attrs.values()) entries.push_back(write_attr(name, value));
    return builder_.CreateVector(entries);
  }

  Offset<fb::Value> write_value(const Value& value, int32_t producer, int32_t slot) {
    Offset<fb::WeightTransform> transform = 0;
    if (value.transform)
      transform = fb::CreateWeightTransform(builder_, builder_.CreateString(value.transform->kind),
                                            builder_.CreateVector(value.transform->sources),
                                            write_attrs(value.transform->params));
    return fb::CreateValue(builder_, builder_.CreateString(value.name), shape(value.meta.shape),
                           dtype(value.meta.dtype), static_cast<fb::ValueKind>(value.kind), producer, slot,
                           builder_.CreateString(value.weight_key), transform);
  }

  Offset<fb::Graph> write_graph() {
    // Producers come from the nodes: values whose producer a pass removed are written without one.
    std::vector<std::pair<int32_t, int32_t>> producers(graph_.values.size(), {-1, 0});
    for (size_t n = 0; n < graph_.nodes.size(); ++n)
      for (size_t slot = 0; slot < graph_.nodes[n].outputs.size(); ++slot)
        producers.at(static_cast<size_t>(graph_.nodes[n].outputs[slot])) = {static_cast<int32_t>(n),
                                                                            static_cast<int32_t>(slot)};
    std::vector<Offset<fb::Value>> values;
    values.reserve(graph_.values.size());
    for (size_t i = 0; i < graph_.values.size(); ++i)
      values.push_back(write_value(graph_.values[i], producers[i].first, producers[i].second));
    std::vector<Offset<fb::Node>> nodes;
    nodes.reserve(graph_.nodes.size());
    for (const Node& node : graph_.nodes)
      nodes.push_back(fb::CreateNode(builder_, builder_.CreateString(node.name), builder_.CreateString(node.op),
                                     builder_.CreateString(node.source_op), write_attrs(node.attrs),
                                     builder_.CreateVector(node.inputs), builder_.CreateVector(node.outputs)));
    return fb::CreateGraph(builder_, builder_.CreateString(graph_.model_name),
                           builder_.CreateString(graph_.pytorch_version), builder_.CreateString(graph_.source),
                           builder_.CreateVector(values), builder_.CreateVector(nodes),
                           builder_.CreateVector(graph_.inputs), builder_.CreateVector(graph_.outputs),
                           builder_.CreateVector(graph_.weights));
  }

  Offset<flatbuffers::Vector<Offset<fb::Constant>>> write_constants() {
    std::vector<Offset<fb::Constant>> constants;
    for (const auto& [name, tensor] : graph_.constants) {
      if (!tensor.defined()) fail("write_program: constant '" + name + "' has no data");
      const auto* bytes = reinterpret_cast<const uint8_t*>(tensor.bytes());
      const auto data = builder_.CreateVector(bytes, tensor.nbytes());
      constants.push_back(fb::CreateConstant(builder_, builder_.CreateString(name), dtype(tensor.dtype()),
                                             shape(tensor.shape()), data));
    }
    return builder_.CreateVector(constants);
  }

  Offset<fb::MemoryPlan> write_plan() {
    const compiler::MemoryPlan& plan = program_.plan;
    std::vector<fb::Buffer> buffers;
    buffers.reserve(plan.values.size());
    for (const compiler::BufferAssignment& buffer : plan.values)
      buffers.emplace_back(buffer.offset, buffer.bytes, buffer.alias_of, static_cast<fb::Placement>(buffer.placement),
                           buffer.in_place);
    return fb::CreateMemoryPlan(builder_, plan.alignment, plan.arena_bytes, plan.persistent_bytes, plan.unplanned_bytes,
                                builder_.CreateVectorOfStructs(buffers));
  }

  const Program& program_;
  const Graph& graph_;
  FlatBufferBuilder builder_{1 << 16};
};

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  static std::atomic<uint64_t> counter{0};
  const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write program '" + path + "': " + std::strerror(errno));
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.flush();
    if (!out) {
      const std::string reason = std::strerror(errno);
      out.close();
      std::remove(temporary.c_str());
      fail("cannot write program '" + path + "': " + reason);
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    fail("cannot write program '" + path + "': " + reason);
  }
}

}  // namespace

std::vector<uint8_t> write_program_bytes(const Program& program) {
  if (program.plan.values.size() != program.graph.values.size())
    fail("write_program: the memory plan covers " + std::to_string(program.plan.values.size()) +
         " values but the graph has " + std::to_string(program.graph.values.size()));
  // FlatBuffers addresses at most 2 GiB; constants are the only large part of a program.
  constexpr size_t kMaxConstantBytes = size_t{1536} << 20;
  size_t constant_bytes = 0;
  for (const auto& [name, tensor] : program.graph.constants) constant_bytes += tensor.nbytes();
  if (constant_bytes > kMaxConstantBytes)
    fail("write_program: " + std::to_string(constant_bytes) +
         " bytes of embedded constants exceed the .npubin limit of 1.5 GiB");
  flatbuffers::DetachedBuffer buffer = ProgramWriter(program).build();
  return seal_npubin(buffer.data(), buffer.size());
}

uint32_t crc32(const uint8_t* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> entries{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t value = i;
      for (int bit = 0; bit < 8; ++bit) value = (value & 1) ? 0xEDB88320u ^ (value >> 1) : value >> 1;
      entries[i] = value;
    }
    return entries;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::vector<uint8_t> seal_npubin(const uint8_t* flatbuffer, size_t size) {
  if (size >= FLATBUFFERS_MAX_BUFFER_SIZE) fail("a program of " + std::to_string(size) + " bytes is too large");
  std::vector<uint8_t> bytes(size + kNpubinFooterBytes);
  if (size > 0) std::memcpy(bytes.data(), flatbuffer, size);
  const auto payload_size = static_cast<uint64_t>(size);
  const uint32_t checksum = crc32(flatbuffer, size);
  std::memcpy(bytes.data() + size, &payload_size, sizeof(payload_size));
  std::memcpy(bytes.data() + size + sizeof(payload_size), &checksum, sizeof(checksum));
  return bytes;
}

void write_program(const std::string& path, const Program& program) {
  const std::vector<uint8_t> bytes = write_program_bytes(program);
  write_file(path, bytes.data(), bytes.size());
}

}  // namespace npusim
