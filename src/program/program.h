#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/memory_plan.h"
#include "npusim/graph.h"

namespace npusim {

// A compiled program: the graph after the compiler's passes (canonical and fused ops, folded constants
// embedded, derived weights with their load-time transforms, references to checkpoint weights by name), the
// memory plan, and where it was compiled for. Written as a versioned, self-describing `.npubin`.
struct Program {
  static constexpr uint32_t kFormatVersion = 1;

  std::string producer = "npusim 0.1.0";  // what wrote the file
  std::string target = "cpu";
  DType compute_dtype = DType::Float32;  // storage dtype of floating activations and weights
  std::vector<std::string> disabled_passes;
  std::vector<std::string> pass_log;
  Graph graph;
  compiler::MemoryPlan plan;
};

// `.npubin`: a FlatBuffer (program/npubin.fbs, identifier "NPUB") followed by a footer of kNpubinFooterBytes:
// the FlatBuffer's size (uint64) and its CRC-32 (uint32), little-endian, so that a cut or damaged file is
// caught before it is parsed. Writing goes through a temporary file renamed into place. Loading checks the
// identifier, size, checksum, FlatBuffers structure, format version, every enum, index and size, the memory
// plan and the registry ops (setting Node::def), and each node's output shapes against its op's inference.
constexpr size_t kNpubinFooterBytes = 12;
void write_program(const std::string& path, const Program& program);
std::vector<uint8_t> write_program_bytes(const Program& program);
Program read_program(const std::string& path);
Program read_program_bytes(const uint8_t* data, size_t size, const std::string& source);
// A FlatBuffer with the footer appended (what write_program_bytes returns).
std::vector<uint8_t> seal_npubin(const uint8_t* flatbuffer, size_t size);
uint32_t crc32(const uint8_t* data, size_t size);
// Human-readable dump: inputs, outputs, kernels (nodes), buffers, weights with transforms, bytes.
std::string describe_program(const Program& program);

}  // namespace npusim
