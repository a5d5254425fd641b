// Bad input to every loader gives an npusim::Error that names the file and the problem: never a crash, a hang,
// an attempt to allocate terabytes or a silently wrong answer. The FuzzRegression tests hold, as bytes, every
// input the fuzzers (fuzz/, docs/reliability.md) found crashing.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/target.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "llm/tokenizer.h"
#include "npusim/error.h"
#include "npusim/tensor.h"
#include "program/program.h"
#include "runtime/npy.h"
#include "runtime/random_fill.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "work_dir.h"

using namespace npusim;

namespace {

const std::string kSource = "bad.json";

// One scratch directory per run; files of the same name overwrite each other.
const std::string& scratch_dir() {
  static const std::string dir = npusim::test::fresh_work_dir("bad_inputs") + "/";
  return dir;
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = scratch_dir() + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string u64_le(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}

// `load` must throw an npusim::Error whose message contains `source` and `fragment`; any other exception fails.
void expect_error(const std::function<void()>& load, const std::string& source, const std::string& fragment,
                  bool one_line = true) {
  try {
    load();
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(source), std::string::npos) << "the message does not name " << source << ": " << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << message;
    if (one_line) EXPECT_EQ(message.find('\n'), std::string::npos) << "more than one line: " << message;
  }
}

// `load` either succeeds or throws an npusim::Error that names `source`; nothing else may escape.
void expect_clean(const std::function<void()>& load, const std::string& source, const std::string& what) {
  try {
    load();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(source), std::string::npos) << what << ": " << error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << what << ": escaped as a non-npusim exception: " << error.what();
  }
}

void expect_ir_error(const std::string& text, const std::string& fragment) {
  expect_error([&] { parse_torch_ir(text, kSource); }, kSource, fragment);
}

std::string tensor(const std::string& name, const std::string& shape, const std::string& dtype = "float32") {
  return R"({"name": ")" + name + R"(", "shape": )" + shape + R"(, "dtype": ")" + dtype + "\"}";
}

// A graph whose only node `op_type` reads graph input x (and weight w, placeholder p_w, when `w_shape` is set)
// and writes `out`.
std::string one_node_ir(const std::string& op_type, const std::string& x_shape, const std::string& attrs,
                        const std::string& out_shape, const std::string& w_shape = "") {
  const std::string weights = w_shape.empty() ? "[]" : "[" + tensor("w", w_shape) + "]";
  const std::string mapping = w_shape.empty() ? "{}" : R"({"p_w": "w"})";
  std::string inputs = "[" + tensor("x", x_shape);
  if (!w_shape.empty()) inputs += ", " + tensor("p_w", w_shape);
  inputs += "]";
  return R"({"graph_inputs": [)" + tensor("x", x_shape) + R"(], "graph_outputs": [)" + tensor("out", out_shape) +
         R"(], "weights": )" + weights + R"(, "weight_name_mapping": )" + mapping +
         R"(, "nodes": [{"name": "n", "op_type": ")" + op_type + R"(", "inputs": )" + inputs + R"(, "outputs": [)" +
         tensor("out", out_shape) + R"(], "attrs": )" + attrs + "}]}";
}

const std::string kRelu = one_node_ir("aten.relu.default", "[2, 3]", "{}", "[2, 3]");

// kRelu with one change made on its JSON tree.
std::string relu_with(const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json root = nlohmann::json::parse(kRelu);
  change(root);
  return root.dump();
}

// conv2d then batch_norm: the pair the compiler folds.
std::string conv_batchnorm_ir() {
  const std::string x = tensor("x", "[1, 1, 4, 4]");
  const std::string conv = tensor("conv", "[1, 1, 2, 2]");
  std::string weights = tensor("w", "[1, 1, 3, 3]"), node_params;
  for (const char* name : {"gamma", "beta", "mean", "var"}) {
    weights += ", " + tensor(name, "[1]");
    node_params += ", " + tensor(std::string("p_") + name, "[1]");
  }
  return R"({"graph_inputs": [)" + x + R"(], "graph_outputs": [)" + tensor("bn", "[1, 1, 2, 2]") +
         R"(], "weights": [)" + weights +
         R"(], "weight_name_mapping": {"p_w": "w", "p_gamma": "gamma", "p_beta": "beta", "p_mean": "mean",
         "p_var": "var"}, "nodes": [
    {"name": "conv", "op_type": "aten.conv2d.default", "inputs": [)" +
         x + ", " + tensor("p_w", "[1, 1, 3, 3]") + R"(], "outputs": [)" + conv + R"(], "attrs": {}},
    {"name": "bn", "op_type": "aten.batch_norm.default", "inputs": [{"name": "conv", "shape": [1, 1, 2, 2],
     "dtype": "float32", "producer_node": "conv", "producer_output_idx": 0})" +
         node_params + R"(], "outputs": [)" + tensor("bn", "[1, 1, 2, 2]") +
         R"(], "attrs": {"training": false, "momentum": 0.1, "eps": 1e-05, "cudnn_enabled": false}}]})";
}

std::vector<uint8_t> small_program_bytes() {
  return write_program_bytes(compiler::compile_graph(parse_torch_ir(kRelu, kSource), {}));
}

Program read_program_copy(const std::vector<uint8_t>& bytes, const std::string& source) {
  // Aligned like a file read by read_program, so that only the content is under test.
  std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
  if (!bytes.empty()) std::memcpy(aligned.data(), bytes.data(), bytes.size());
  return read_program_bytes(reinterpret_cast<const uint8_t*>(aligned.data()), bytes.size(), source);
}

// A FlatBuffer that a mutation changed, with the valid footer such a program file would carry.
std::vector<uint8_t> sealed(const std::vector<uint8_t>& flatbuffer) {
  return seal_npubin(flatbuffer.data(), flatbuffer.size());
}

// Every single-byte change of `bytes` at `stride`-spaced offsets (all 8 single-bit flips and 0x00/0xff).
std::vector<std::string> byte_mutations(const std::string& bytes, size_t stride = 1) {
  std::vector<std::string> result;
  for (size_t i = 0; i < bytes.size(); i += stride) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string changed = bytes;
      changed[i] = static_cast<char>(changed[i] ^ (1 << bit));
      result.push_back(std::move(changed));
    }
    for (char value : {'\x00', '\xff'}) {
      if (bytes[i] == value) continue;
      std::string changed = bytes;
      changed[i] = value;
      result.push_back(std::move(changed));
    }
  }
  return result;
}

std::string safetensors_with(const std::string& header, size_t data_bytes) {
  std::string padded = header;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  return u64_le(padded.size()) + padded + std::string(data_bytes, '\x01');
}

std::string npy_with(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  const char preamble[] = {'\x93', 'N', 'U', 'M', 'P', 'Y', '\x01', '\x00'};
  const auto length = static_cast<uint16_t>(header.size());
  return std::string(preamble, 8) + std::string(reinterpret_cast<const char*>(&length), 2) + header + data;
}

const char* kConfig = R"({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 512,
  "max_position_embeddings": 128, "rope_theta": 1000000.0})";

// The first crashing input of fuzz_npubin (the FlatBuffer, before footers existed): a program whose shape vector
// the mutation moved to a 4-byte boundary. FlatBuffers' verifier accepts it; the int64 dims were read in place,
// misaligned (undefined behaviour, reported by UBSan).
const uint8_t kMisalignedProgram[] = {
    0x24, 0x00, 0x00, 0x00, 0x4e, 0x50, 0x55, 0x42, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x16, 0x00, 0x24, 0x00, 0x04,
    0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x10, 0x00, 0x14, 0x00, 0x18, 0x00, 0x1c, 0x00, 0x20, 0x00, 0x16, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x10,
    0x00, 0x00, 0x00, 0xc8, 0x00, 0x00, 0x00, 0xac, 0x00, 0x00, 0x00, 0x34, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x63, 0x70, 0x75, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x6e, 0x70, 0x75,
    0x73, 0x69, 0x6d, 0x20, 0x30, 0x2e, 0x31, 0x2e, 0x30, 0x00, 0x00, 0x0e, 0x00, 0x24, 0x00, 0x08, 0x00, 0x00, 0x00,
    0x10, 0x00, 0x18, 0x00, 0x04, 0x00, 0x0e, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x60, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x0c,
    0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x24, 0x00, 0x04, 0x00, 0x08,
    0x00, 0x0c, 0x00, 0x14, 0x00, 0x14, 0x00, 0x18, 0x00, 0x1c, 0x00, 0x20, 0x00, 0x14, 0x00, 0x00, 0x00, 0x9c, 0x00,
    0x00, 0x00, 0x84, 0x00, 0x00, 0x00, 0x48, 0x00, 0x00, 0x00, 0x34, 0x00, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x1c,
    0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x80, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0xe0, 0x02, 0x00, 0x00, 0x44, 0x02, 0x00, 0x00, 0xd8, 0x01,
    0x00, 0x00, 0x30, 0x00, 0x00, 0x00, 0x62, 0x75, 0x69, 0x6c, 0x64, 0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x2f, 0x73, 0x65,
    0x65, 0x64, 0x73, 0x2f, 0x74, 0x6f, 0x72, 0x63, 0x68, 0x5f, 0x69, 0x72, 0x2f, 0x6e, 0x6f, 0x64, 0x65, 0x5f, 0x30,
    0x30, 0x35, 0x5f, 0x72, 0x65, 0x73, 0x6e, 0x65, 0x74, 0x31, 0x38, 0x2e, 0x6a, 0x73, 0x6f, 0x6e, 0x00, 0x00, 0x00,
    0x00, 0x0c, 0x00, 0x00, 0x00, 0x32, 0x2e, 0x31, 0x31, 0x2e, 0x30, 0x2b, 0x63, 0x75, 0x31, 0x33, 0x30, 0x00, 0x00,
    0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x72, 0x65, 0x73, 0x6e, 0x65, 0x74, 0x31, 0x38, 0x00, 0x00, 0x00, 0x00, 0x10,
    0x00, 0x1c, 0x00, 0x04, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x10, 0x00, 0x14, 0x00, 0x18, 0x00, 0x10, 0x00, 0x00, 0x00,
    0x44, 0x01, 0x00, 0x00, 0x34, 0x01, 0x00, 0x00, 0x18, 0x01, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
    0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0xb8, 0x00, 0x00, 0x00, 0x74, 0x00, 0x00, 0x00, 0x40,
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x62, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x06, 0x08, 0x00, 0x00, 0x00,
    0x10, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x73, 0x74, 0x72, 0x69, 0x64, 0x65, 0x00, 0x00, 0x56, 0xff, 0xff,
    0xff, 0x04, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x9a, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x06, 0x08, 0x00, 0x00, 0x00, 0x10,
    0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x70, 0x61, 0x64, 0x64, 0x69, 0x6e, 0x67, 0x00, 0x8e, 0xff, 0xff, 0xff,
    0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xca, 0xff, 0xff,
    0xff, 0x00, 0x00, 0x00, 0x03, 0x08, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x67, 0x72,
    0x6f, 0x75, 0x70, 0x73, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x12, 0x00, 0x04, 0x00, 0x06, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x10, 0x00, 0x08, 0x00,
    0x07, 0x00, 0x0c, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x08, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00,
    0x00, 0x08, 0x00, 0x00, 0x00, 0x64, 0x69, 0x6c, 0x61, 0x74, 0x69, 0x6f, 0x6e, 0x00, 0x00, 0x06, 0x00, 0x08, 0x00,
    0x04, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x13, 0x00, 0x00, 0x00, 0x61, 0x74, 0x65, 0x6e, 0x2e, 0x63, 0x6f, 0x6e, 0x76, 0x32, 0x64, 0x2e,
    0x64, 0x65, 0x66, 0x61, 0x75, 0x6c, 0x74, 0x00, 0x06, 0x00, 0x00, 0x00, 0x63, 0x6f, 0x6e, 0x76, 0x32, 0x64, 0x00,
    0x00, 0x08, 0x00, 0x00, 0x00, 0x63, 0x6f, 0x6e, 0x76, 0x32, 0x64, 0x5f, 0x37, 0x00, 0x00, 0x12, 0x00, 0x18, 0x00,
    0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x07, 0x00, 0x10, 0x00, 0x00, 0x00, 0x14, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x02, 0x40, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1c, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x63, 0x6f, 0x6e, 0x76, 0x32,
    0x64, 0x5f, 0x37, 0x00, 0x00, 0x12, 0x00, 0x14, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x10, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x58, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00,
    0x00, 0x04, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x6c, 0x61, 0x79, 0x65, 0x72, 0x32, 0x2e, 0x30, 0x2e, 0x64,
    0x6f, 0x77, 0x6e, 0x73, 0x61, 0x6d, 0x70, 0x6c, 0x65, 0x2e, 0x30, 0x2e, 0x77, 0x65, 0x69, 0x67, 0x68, 0x74, 0x00,
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x1e, 0x00, 0x00, 0x00, 0x70, 0x5f, 0x6c, 0x61, 0x79, 0x65, 0x72, 0x32, 0x5f, 0x30,
    0x5f, 0x64, 0x6f, 0x77, 0x6e, 0x73, 0x61, 0x6d, 0x70, 0x6c, 0x65, 0x5f, 0x30, 0x5f, 0x77, 0x65, 0x69, 0x67, 0x68,
    0x74, 0x00, 0x00, 0x00, 0x00, 0x12, 0x00, 0x10, 0x00, 0x04, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x0c, 0x00, 0x12, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x37, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x38,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x72, 0x65, 0x6c, 0x75,
    0x5f, 0x5f, 0x34, 0x00,
};

// fuzz_npubin: a program whose constant declares a shape of 5.7 GB over a few stored bytes; the reader allocated
// the tensor before comparing the sizes (libFuzzer: out-of-memory, malloc(5771362320)).
const uint8_t kProgramWithHugeConstant[] = {
    0x24, 0x00, 0x00, 0x00, 0x4e, 0x50, 0x55, 0x42, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x16, 0x00, 0x24, 0x00, 0x04,
    0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x10, 0x00, 0x14, 0x00, 0x18, 0x00, 0x1c, 0x00, 0x20, 0x00, 0x16, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x10,
    0x00, 0x00, 0x00, 0x18, 0x01, 0x00, 0x00, 0xa8, 0x00, 0x00, 0x00, 0x34, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x63, 0x70, 0x75, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x6e, 0x70, 0x75,
    0x73, 0x69, 0x6d, 0x20, 0x30, 0x2e, 0x31, 0x2e, 0x30, 0x00, 0x00, 0x0e, 0x00, 0x24, 0x00, 0x08, 0x00, 0x00, 0x00,
    0x10, 0x00, 0x18, 0x00, 0x04, 0x00, 0x0e, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xfb,
    0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x66, 0x75, 0x73, 0x65, 0x64, 0x5f, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
    0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x10, 0x00, 0x04, 0x00, 0x00,
    0x00, 0x08, 0x00, 0x0c, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x24, 0x00,
    0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x2b, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x62, 0x69, 0x61, 0x73, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x73, 0x2e, 0x6a, 0x73,
    0x6f, 0x6e, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x10, 0x00, 0x1c, 0x00, 0x04, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x10, 0x00, 0x14, 0x00, 0x18, 0x00,
    0x10, 0x00, 0x00, 0x00, 0x8c, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x68, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00,
    0x00, 0x10, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x0a, 0x00, 0x10, 0x00, 0x08, 0x00, 0x07, 0x00, 0x0c, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03,
    0x08, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x61, 0x6c, 0x70, 0x68, 0x61, 0x00, 0x06,
    0x00, 0x10, 0x00, 0x04, 0x00, 0x06, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x0f, 0x00, 0x00, 0x00, 0x61, 0x74, 0x65, 0x6e, 0x2e, 0x61, 0x64, 0x64, 0x2e, 0x54, 0x65, 0x6e, 0x73,
    0x6f, 0x72, 0x00, 0x03, 0x00, 0x00, 0x00, 0x61, 0x64, 0x64, 0x00, 0x03, 0x00, 0x00, 0x00, 0x61, 0x64, 0x64, 0x00,
    0x00, 0x00, 0x12, 0x00, 0x18, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x07, 0x00, 0x10, 0x00, 0x00, 0x00, 0x14,
    0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x2c, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
    0x61, 0x64, 0x64, 0x00, 0x00, 0x00, 0x12, 0x00, 0x14, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x10, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x30, 0x00, 0x00, 0x00, 0x14, 0x00,
    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x62, 0x69, 0x61, 0x73, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x63, 0x5f, 0x62, 0x69, 0x61, 0x73, 0x9e, 0x00, 0x00, 0x00, 0x12,
    0x00, 0x10, 0x00, 0x04, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x12, 0x00,
    0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x78, 0x00, 0x00, 0x00,
};

// GPT-2's byte-level spelling of one byte (see tests/unit/test_tokenizer.cpp).
std::string byte_spelling(int byte) {
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  int code = byte;
  if (!printable(byte)) {
    code = 0x100;
    for (int b = 0; b < byte; ++b) code += printable(b) ? 0 : 1;
  }
  std::string out;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

// A byte-level BPE tokenizer.json of the 256 byte tokens whose template puts `template_id` first.
std::string tokenizer_with_template_id(int template_id) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[byte_spelling(byte)] = byte;
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}};
  nlohmann::json special = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  nlohmann::json sequence = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const nlohmann::json file = {
      {"added_tokens", nlohmann::json::array()},
      {"pre_tokenizer", byte_level},
      {"decoder", byte_level},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {special, sequence}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {template_id}}, {"tokens", {"<s>"}}}}}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return file.dump();
}

}  // namespace

// --- Inputs the fuzzers found (fuzz/, docs/reliability.md) ---

TEST(FuzzRegression, JsonNumberTooLargeForADoubleInTheIr) {
  // nlohmann::json reports 11e308 as out_of_range, not parse_error; it escaped as a non-npusim exception.
  expect_ir_error(R"({"graph_inputs": [{"name": "to", "shape": [11e308], "dtype": "bool"}], "graph_outputs": [],
                      "weights": [], "nodes": []})",
                  "not valid JSON");
}

TEST(FuzzRegression, JsonNumberTooLargeInASafetensorsHeader) {
  const std::string path =
      write_file("overflow.safetensors", safetensors_with(R"({"input_ids": 999999999999999999999E9999})", 0));
  expect_error([&] { SafetensorsFile::open(path); }, path, "header is not valid JSON");
}

TEST(FuzzRegression, JsonNumberTooLargeInAModelConfig) {
  expect_error([] { ModelConfig::parse(R"({"model_type": "qwen2", "rope_theta": 15E643})", "config.json"); },
               "config.json", "not valid JSON");
}

TEST(FuzzRegression, JsonNumberTooLargeInATargetFile) {
  // Same pattern as the three above, in the target description reader.
  const std::string path = write_file("target.json", R"({"name": "t", "alignment": 1e999})");
  expect_error([&] { compiler::load_target(path); }, path, "");
}

TEST(FuzzRegression, ProgramWithMisalignedInt64Vector) {
  const std::vector<uint8_t> bytes(std::begin(kMisalignedProgram), std::end(kMisalignedProgram));
  expect_error([&] { read_program_copy(sealed(bytes), "fuzz.npubin"); }, "fuzz.npubin", "misaligned");
}

TEST(FuzzRegression, FoldingBatchNormKeepsNoReferenceIntoGrownValues) {
  // fold_batchnorm held a reference into graph.values across push_backs (heap-use-after-free under ASan); found
  // while compiling the fuzz seeds.
  const Graph graph = parse_torch_ir(conv_batchnorm_ir(), kSource);
  const Program program = compiler::compile_graph(graph, {});
  ASSERT_EQ(program.graph.nodes.size(), 1u);
  const Node& conv = program.graph.nodes[0];
  ASSERT_EQ(conv.inputs.size(), 3u);
  EXPECT_EQ(program.graph.value(conv.inputs[1]).transform->kind, "bn_fold_weight");
  EXPECT_EQ(program.graph.value(conv.inputs[2]).transform->kind, "bn_fold_bias");
  EXPECT_EQ(program.graph.value(conv.outputs[0]).name, "bn");
  EXPECT_EQ(program.graph.value(conv.outputs[0]).producer, 0);
}

TEST(FuzzRegression, DeeplyNestedJsonIsRefusedWhileParsing) {
  // Lists nested a million deep overflowed the stack in the recursive walks over attributes and constants
  // (found while writing the bad-input suite; a fuzzer input is limited to a few thousand levels).
  const std::string deep = std::string(1'000'000, '[') + "1" + std::string(1'000'000, ']');
  std::string attr = kRelu;
  attr.replace(attr.find("\"attrs\": {}"), 11, "\"attrs\": {\"a\": " + deep + "}");
  expect_ir_error(attr, "JSON nested deeper than 64 levels");
  std::string constant = kRelu;
  constant.insert(1, "\"constants\": {\"c\": {\"data\": " + deep + "}}, ");
  expect_ir_error(constant, "JSON nested deeper than 64 levels");
  const std::string path = write_file("deep.safetensors", safetensors_with("{\"w\": {\"dtype\": " + deep + "}}", 0));
  expect_error([&] { SafetensorsFile::open(path); }, path, "JSON nested deeper than 64 levels");
  expect_error([&] { ModelConfig::parse("{\"model_type\": " + deep + "}", "config.json"); }, "config.json",
               "JSON nested deeper than 64 levels");
  // The fixtures nest 6 levels deep; a rank-8 constant needs 12.
  std::string rank8 = kRelu;
  rank8.insert(1, R"("constants": {"c": {"data": [[[[[[[[1]]]]]]]]}}, )");
  EXPECT_NO_THROW(parse_torch_ir(rank8, kSource));
}

TEST(FuzzRegression, TargetIntegersMustBeIntegers) {
  // get<int64_t>() of 1e300 is an undefined conversion (UBSan float-cast-overflow).
  const std::string path = write_file("float_target.json", R"({"name": "t", "alignment": 1e300})");
  expect_error([&] { compiler::load_target(path); }, path, "'alignment' must be an integer");
}

TEST(FuzzRegression, HugeConvolutionAndPoolingAttributesOverflowNothing) {
  // fuzz_npubin: groups=7598805589533392897 made weight[1] * groups overflow (UBSan: signed integer overflow).
  const std::string conv = "aten.conv2d.default";
  const std::string x = "[1, 3, 4, 4]", out = "[1, 3, 2, 2]", w = "[3, 3, 3, 3]";
  expect_ir_error(one_node_ir(conv, x, R"({"groups": 7598805589533392897})", out, w), "groups=7598805589533392897");
  expect_ir_error(one_node_ir(conv, x, R"({"padding": [9223372036854775807, 0]})", out, w), "padding");
  expect_ir_error(one_node_ir(conv, x, R"({"dilation": [4611686018427387904, 1]})", out, w), "kernel extent");
  expect_ir_error(
      one_node_ir("aten.conv2d.padding", x, R"({"padding": "same", "dilation": [4611686018427387904, 1]})", out, w),
      "kernel extent");
  const std::string pool = "aten.max_pool2d.default";
  expect_ir_error(one_node_ir(pool, x, R"({"kernel_size": [3, 3], "dilation": [4611686018427387904, 1]})", out),
                  "kernel extent");
  expect_ir_error(
      one_node_ir(pool, x, R"({"kernel_size": [9223372036854775807, 2], "padding": [4611686018427387903, 0]})", out),
      "padding");
  expect_ir_error(one_node_ir(pool, x, R"({"kernel_size": [2, 2], "stride": [9223372036854775807, 1],
                                        "ceil_mode": true})",
                              out),
                  "");
}

TEST(FuzzRegression, ProgramConstantLargerThanItsData) {
  const std::vector<uint8_t> bytes(std::begin(kProgramWithHugeConstant), std::end(kProgramWithHugeConstant));
  expect_error([&] { read_program_copy(sealed(bytes), "fuzz.npubin"); }, "fuzz.npubin", "");
}

TEST(FuzzRegression, TokenizerTemplateIdsMustBeTokens) {
  // fuzz_tokenizer: a template special token whose id the vocabulary lacks was emitted by encode, an index past
  // the end of the model's embedding.
  EXPECT_EQ(Tokenizer::parse(tokenizer_with_template_id(65), "tokenizer.json").encode("hi", true),
            (std::vector<int32_t>{65, 'h', 'i'}));
  expect_error([] { Tokenizer::parse(tokenizer_with_template_id(300), "tokenizer.json"); }, "tokenizer.json",
               "holds 300, which is not a token");
}

// --- torch_ir JSON ---

TEST(BadIr, EveryTruncationFails) {
  ASSERT_NO_THROW(parse_torch_ir(kRelu, kSource));
  for (size_t length = 0; length < kRelu.size(); ++length)
    expect_error([&] { parse_torch_ir(kRelu.substr(0, length), kSource); }, kSource, "");
}

TEST(BadIr, NonJsonAndWrongTopLevel) {
  expect_ir_error(std::string("\x00\x01\x02\xff", 4), "not valid JSON");
  expect_ir_error("<?xml version=\"1.0\"?><graph/>", "not valid JSON");
  expect_ir_error("NaN", "not valid JSON");
  expect_ir_error("{} {}", "not valid JSON");
  expect_ir_error("\"graph\"", "top level must be a JSON object");
  expect_ir_error("null", "top level must be a JSON object");
}

TEST(BadIr, MissingOrMistypedTopLevelKeys) {
  for (const char* key : {"graph_inputs", "graph_outputs", "weights", "nodes"}) {
    expect_ir_error(relu_with([&](nlohmann::json& root) { root.erase(key); }),
                    std::string("missing top-level key '") + key + "'");
    expect_ir_error(relu_with([&](nlohmann::json& root) {
                      root[key] = {{"a", root[key]}};
                    }),
                    std::string("top-level key '") + key + "' must be a list");
  }
  expect_ir_error(relu_with([](nlohmann::json& root) { root["weight_name_mapping"] = {1}; }),
                  "'weight_name_mapping' must be an object");
  expect_ir_error(relu_with([](nlohmann::json& root) {
                    root["weight_name_mapping"] = {{"p_w", 3}};
                  }),
                  "weight_name_mapping['p_w'] must be a string");
  expect_ir_error(relu_with([](nlohmann::json& root) { root["constants"] = 5; }), "'constants' must be an object");
  expect_ir_error(relu_with([](nlohmann::json& root) {
                    root["model_name"] = {1, 2};
                  }),
                  "field 'model_name' must be a string");
}

TEST(BadIr, MalformedEntries) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text = kRelu;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  expect_ir_error(with(R"("graph_inputs": [{"name": "x")", R"("graph_inputs": [7, {"name": "x")"),
                  "graph_inputs[0] must be an object");
  expect_ir_error(with(R"("graph_inputs": [{"name": "x")", R"("graph_inputs": [{"name": "")"),
                  "graph_inputs[0]: field 'name' must be a non-empty string");
  expect_ir_error(with(R"("shape": [2, 3], "dtype": "float32"}], "graph_outputs")",
                       R"("shape": "2x3", "dtype": "float32"}], "graph_outputs")"),
                  "field 'shape' must be a list of integers");
  expect_ir_error(with(R"("shape": [2, 3], "dtype": "float32"}], "graph_outputs")",
                       R"("shape": [2, 3.5], "dtype": "float32"}], "graph_outputs")"),
                  "field 'shape' must hold integers, got 3.5");
  expect_ir_error(
      with(R"("shape": [2, 3], "dtype": "float32"}], "graph_outputs")", R"("shape": [2, 3]}], "graph_outputs")"),
      "missing field 'dtype'");
  expect_ir_error(with(R"("op_type": "aten.relu.default")", R"("op_type": null)"),
                  "field 'op_type' must be a non-empty string");
  expect_ir_error(with(R"("nodes": [{"name": "n")", R"("nodes": [[], {"name": "n")"), "nodes[0] must be an object");
  expect_ir_error(with(R"("attrs": {})", R"("attrs": [])"), "field 'attrs' must be an object");
  expect_ir_error(with(R"("outputs": [{"name": "out", "shape": [2, 3], "dtype": "float32"}])", R"("outputs": 1)"),
                  "field 'outputs' must be a list");
}

TEST(BadIr, UnknownOpIsNamedWithItsNodeBeforeRunning) {
  const Graph graph = parse_torch_ir(one_node_ir("aten.frobnicate.default", "[2]", "{}", "[2]"), kSource);
  // One line per unknown op, after the first naming the file.
  expect_error([&] { check_supported(graph); }, kSource, "aten.frobnicate.default (1 node: n)", false);
}

TEST(BadIr, InconsistentShapesAndDtypes) {
  expect_ir_error(one_node_ir("aten.relu.default", "[2, 3]", "{}", "[3, 2]"),
                  "node 'n' (aten.relu.default): output 0 has shape [3, 2] in the IR but the op computes [2, 3]");
  std::string dtype = kRelu;
  const size_t output = dtype.rfind("\"dtype\": \"float32\"");
  dtype.replace(output, 18, "\"dtype\": \"int64\"");
  expect_ir_error(dtype, "output 0 has dtype int64 in the IR but the op computes float32");
  expect_ir_error(relu_with([](nlohmann::json& root) { root["graph_outputs"][0]["shape"] = {6}; }),
                  "graph_outputs[0]: 'out' has shape [6] but its producer gives [2, 3]");
  expect_ir_error(one_node_ir("aten.add.Tensor", "[2, 3]", R"({"other": 1})", "[2, 3]", "[4]"),
                  "node 'n' (aten.add.Tensor)");
  expect_ir_error(one_node_ir("aten.mm.default", "[2, 3]", "{}", "[2, 2]", "[4, 2]"), "node 'n' (aten.mm.default)");
}

TEST(BadIr, DanglingNames) {
  expect_ir_error(relu_with([](nlohmann::json& root) { root["graph_outputs"][0]["name"] = "gone"; }),
                  "graph_outputs[0]: 'gone' is not produced by any node, input or weight");
  expect_ir_error(relu_with([](nlohmann::json& root) { root["nodes"][0]["inputs"][0]["name"] = "y"; }),
                  "unknown tensor 'y'");
  expect_ir_error(relu_with([](nlohmann::json& root) { root["nodes"][0]["inputs"][0]["producer_node"] = "y"; }),
                  "producer 'y' is neither a node nor a graph input");
  const std::string two_nodes = R"({"graph_inputs": [)" + tensor("x", "[2]") + R"(],
    "graph_outputs": [)" + tensor("b", "[2]") +
                                R"(], "weights": [], "nodes": [
    {"name": "a", "op_type": "aten.relu.default", "inputs": [)" +
                                tensor("x", "[2]") + R"(], "outputs": [)" + tensor("a", "[2]") + R"(]},
    {"name": "b", "op_type": "aten.neg.default", "inputs": [{"name": "a", "shape": [2], "dtype": "float32",
     "producer_node": "a", "producer_output_idx": 3}], "outputs": [)" +
                                tensor("b", "[2]") + "]}]}";
  expect_ir_error(two_nodes, "producer_output_idx 3 is out of range for node 'a' with 1 outputs");
  std::string negative_slot = two_nodes;
  negative_slot.replace(negative_slot.find("\"producer_output_idx\": 3"), 24, "\"producer_output_idx\": -1");
  expect_ir_error(negative_slot, "producer_output_idx -1 is out of range");
}

TEST(BadIr, NonTopologicalOrderByName) {
  // The consumer refers to its input by name only (no producer_node), and the producer comes later.
  const std::string text = R"({"graph_inputs": [)" + tensor("x", "[2]") + R"(],
    "graph_outputs": [)" + tensor("a", "[2]") +
                           R"(], "weights": [], "nodes": [
    {"name": "b", "op_type": "aten.neg.default", "inputs": [)" +
                           tensor("a", "[2]") + R"(], "outputs": [)" + tensor("b", "[2]") + R"(]},
    {"name": "a", "op_type": "aten.relu.default", "inputs": [)" +
                           tensor("x", "[2]") + R"(], "outputs": [)" + tensor("a", "[2]") + "]}]}";
  expect_ir_error(text, "uses 'a' before the node producing it runs (nodes must be in topological order)");
}

TEST(BadIr, NamesDefinedTwice) {
  expect_ir_error(relu_with([](nlohmann::json& root) { root["nodes"][0]["outputs"][0]["name"] = "x"; }),
                  "tensor name 'x' is defined twice");
  const std::string twice = R"({"graph_inputs": [)" + tensor("x", "[2]") + R"(],
    "graph_outputs": [], "weights": [], "nodes": [
    {"name": "n", "op_type": "aten.relu.default", "inputs": [)" +
                            tensor("x", "[2]") + R"(], "outputs": [)" + tensor("a", "[2]") + R"(]},
    {"name": "n", "op_type": "aten.relu.default", "inputs": [)" +
                            tensor("x", "[2]") + R"(], "outputs": [)" + tensor("b", "[2]") + "]}]}";
  expect_ir_error(twice, "node name 'n' is used twice");
}

TEST(BadIr, AttributesOfTheWrongTypeOrOutOfRange) {
  const std::string conv = "aten.conv2d.default";
  expect_ir_error(one_node_ir(conv, "[1, 1, 4, 4]", R"({"stride": [0, 0]})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"),
                  "node 'n' (aten.conv2d.default): conv2d: stride");
  expect_ir_error(one_node_ir(conv, "[1, 1, 4, 4]", R"({"stride": "two"})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"),
                  "attribute 'stride'");
  expect_ir_error(one_node_ir(conv, "[1, 1, 4, 4]", R"({"padding": [-1, -1]})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"),
                  "padding");
  expect_ir_error(one_node_ir(conv, "[1, 1, 4, 4]", R"({"dilation": [0, 0]})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"),
                  "dilation");
  expect_ir_error(one_node_ir(conv, "[1, 1, 4, 4]", R"({"groups": 0})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"), "groups");
  const std::string pool = "aten.max_pool2d.default";
  expect_ir_error(one_node_ir(pool, "[1, 1, 4, 4]", R"({"kernel_size": [-2, -2]})", "[1, 1, 2, 2]"), "kernel_size");
  expect_ir_error(one_node_ir(pool, "[1, 1, 4, 4]", R"({"kernel_size": [2, 2], "stride": [0, 0]})", "[1, 1, 2, 2]"),
                  "stride");
  expect_ir_error(one_node_ir(pool, "[1, 1, 4, 4]", "{}", "[1, 1, 2, 2]"), "missing attribute 'kernel_size'");
  const std::string getitem = "<built-in function getitem>";
  expect_ir_error(one_node_ir(getitem, "[2]", R"({"index": 1})", "[2]"), "getitem index 1 is out of range");
  expect_ir_error(one_node_ir(getitem, "[2]", R"({"index": -1})", "[2]"), "getitem index -1 is out of range");
  expect_ir_error(one_node_ir("aten.softmax.int", "[2, 3]", R"({"dim": 2})", "[2, 3]"), "node 'n'");
  expect_ir_error(one_node_ir("aten.softmax.int", "[2, 3]", R"({"dim": [1.5]})", "[2, 3]"), "attribute 'dim'");
  expect_ir_error(one_node_ir("aten.view.default", "[2, 3]", R"({"size": [-1, -1]})", "[6]"), "node 'n'");
  expect_ir_error(one_node_ir("aten.view.default", "[2, 3]", R"({"size": [-4, 3]})", "[6]"), "node 'n'");
  expect_ir_error(one_node_ir("aten.view.default", "[2, 3]", R"({"size": [4, 3]})", "[12]"), "node 'n'");
}

TEST(BadIr, NegativeDimsAndRankLimit) {
  expect_ir_error(one_node_ir("aten.relu.default", "[2, -3]", "{}", "[2, 3]"), "negative dimension -3");
  expect_ir_error(one_node_ir("aten.relu.default", "[1, 1, 1, 1, 1, 1, 1, 1, 1]", "{}", "[1]"),
                  "rank 9 exceeds the maximum rank 8");
  EXPECT_NO_THROW(parse_torch_ir(
      one_node_ir("aten.relu.default", "[1, 1, 1, 1, 1, 1, 1, 2]", "{}", "[1, 1, 1, 1, 1, 1, 1, 2]"), kSource));
}

TEST(BadIr, AbsurdlyLargeShapesAreRefusedWhileReading) {
  // full(size=[1e7, 1e7]): 10^14 elements, past the 2^40 limit, refused before any node runs.
  const std::string full = R"({"graph_inputs": [], "graph_outputs": [)" + tensor("f", "[10000000, 10000000]") +
                           R"(], "weights": [], "nodes": [{"name": "f", "op_type": "aten.full.default", "inputs": [],
      "outputs": [)" + tensor("f", "[10000000, 10000000]") +
                           R"(], "attrs": {"size": [10000000, 10000000], "fill_value": 1.0}}]})";
  expect_ir_error(full, "has more than 2^40 elements");
  // The same size hidden in the attribute only: inference disagrees with the small declared output.
  std::string hidden = full;
  for (size_t pos; (pos = hidden.find("\"shape\": [10000000, 10000000]")) != std::string::npos;)
    hidden.replace(pos, 29, "\"shape\": [2]");
  expect_ir_error(hidden, "node 'f' (aten.full.default)");
  // Dimensions beyond int64.
  expect_ir_error(one_node_ir("aten.relu.default", "[18446744073709551615]", "{}", "[1]"), "");
}

TEST(BadIr, ConstantsThatLie) {
  auto with_constant = [](const std::string& constant, const std::string& dtype = "float32") {
    return R"({"graph_inputs": [], "graph_outputs": [], "weights": [)" + tensor("c", "[2]", dtype) +
           R"(], "weight_name_mapping": {"c_c": "c"}, "nodes": [], "constants": {"c": )" + constant + "}}";
  };
  expect_ir_error(with_constant(R"({"data": [1, "two"]})"), "constant data must be numbers");
  expect_ir_error(with_constant(R"({"data": [[1, 2], [3]]})"), "ragged nested list");
  expect_ir_error(with_constant(R"({"data": [[1, 2], 3]})"), "");
  expect_ir_error(with_constant(R"({"data": [1, 2], "dtype": "complex64"})"), "unsupported dtype");
  expect_ir_error(with_constant(R"({"dtype": "float32"})"), "missing field 'data'");
  // Values an integer constant cannot hold: converting them would be undefined behaviour.
  expect_ir_error(with_constant(R"({"data": [1, 1e300], "dtype": "int64"})", "int64"), "constants['c']");
  expect_ir_error(with_constant(R"({"data": [300, 1], "dtype": "int8"})", "int8"), "constants['c']");
}

// --- safetensors, npy ---

TEST(BadSafetensors, EveryTruncationFails) {
  const std::string path = scratch_dir() + "good.safetensors";
  Tensor weight(DType::Float32, {2, 3});
  write_safetensors(path, {{"w", weight}, {"b", Tensor(DType::Int64, {2})}}, {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::string truncated = write_file("cut.safetensors", bytes.substr(0, length));
    expect_error([&] { SafetensorsFile::open(truncated); }, truncated, "");
  }
}

TEST(BadSafetensors, SingleByteCorruptionsAreCaughtOrHarmless) {
  const std::string good =
      safetensors_with(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})",
                       12);
  const std::string dir = scratch_dir();
  size_t index = 0;
  for (const std::string& bytes : byte_mutations(good)) {
    const std::string path = dir + "m" + std::to_string(index++) + ".safetensors";
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    expect_clean(
        [&] {
          const SafetensorsFile file = SafetensorsFile::open(path);
          for (const std::string& name : file.names()) {
            const SafetensorsEntry& entry = file.entry(name);
            ASSERT_LE(entry.end, bytes.size()) << path;
            EXPECT_EQ(file.get(name).nbytes(), entry.end - entry.begin) << path;
          }
        },
        path, "mutation " + std::to_string(index));
    std::remove(path.c_str());
  }
}

TEST(BadSafetensors, LyingHeaders) {
  auto expect_open_error = [](const std::string& bytes, const std::string& fragment) {
    const std::string path = write_file("lying.safetensors", bytes);
    expect_error([&] { SafetensorsFile::open(path); }, path, fragment);
  };
  expect_open_error(u64_le(0), "header is not valid JSON");
  expect_open_error(u64_le(~uint64_t{0}) + "{}", "absurd");
  expect_open_error(u64_le(4) + "{\"a\": 1}", "not valid JSON");  // the length cuts the JSON short
  expect_open_error(safetensors_with(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4),
                    "unknown dtype 'f32'");
  expect_open_error(
      safetensors_with(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})", 4),
      "tensor 'w'");
  expect_open_error(safetensors_with(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,4]}})", 8), "byte size 0");
  expect_open_error(safetensors_with(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,3],"data_offsets":[0,8]}})", 8),
                    "byte size 8");
  expect_open_error(safetensors_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                                     4),
                    "overlap");
  expect_open_error(safetensors_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", 4),
                    "data offset must be an integer");
  expect_open_error(safetensors_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,4]}})", 4),
                    "negative data offset");
}

TEST(BadNpy, EveryTruncationFailsAndCorruptionsAreCaughtOrHarmless) {
  const std::string good =
      npy_with("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", std::string(24, 'a'));
  const std::string dir = scratch_dir();
  for (size_t length = 0; length < good.size(); ++length) {
    const std::string path = dir + "cut.npy";
    std::ofstream(path, std::ios::binary).write(good.data(), static_cast<std::streamsize>(length));
    expect_error([&] { read_npy(path); }, path, "");
  }
  size_t index = 0;
  for (const std::string& bytes : byte_mutations(good.substr(0, 10 + 60), 1)) {
    const std::string path = dir + "m" + std::to_string(index++) + ".npy";
    const std::string file = bytes + good.substr(70);
    std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
    expect_clean([&] { EXPECT_LE(read_npy(path).nbytes(), file.size()); }, path, "npy mutation");
    std::remove(path.c_str());
  }
}

TEST(BadNpy, ShapesLargerThanTheFile) {
  auto expect_npy_error = [](const std::string& dict, const std::string& fragment) {
    const std::string path = write_file("big.npy", npy_with(dict, std::string(16, '\0')));
    expect_error([&] { read_npy(path); }, path, fragment);
  };
  expect_npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576), }", "truncated npy file");
  expect_npy_error("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", "too large");
  expect_npy_error("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", "too large");
}

// --- .npubin ---

TEST(BadProgram, EveryTruncationFails) {
  const std::vector<uint8_t> bytes = small_program_bytes();
  ASSERT_NO_THROW(read_program_copy(bytes, "good.npubin"));
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
    expect_error([&] { read_program_copy(cut, "cut.npubin"); }, "cut.npubin", "");
  }
}

TEST(BadProgram, SingleByteCorruptionsAreCaughtOrHarmless) {
  const std::vector<uint8_t> bytes = small_program_bytes();
  for (const std::string& changed : byte_mutations(std::string(bytes.begin(), bytes.end()))) {
    const std::vector<uint8_t> mutated(changed.begin(), changed.end());
    expect_error([&] { read_program_copy(mutated, "m.npubin"); }, "m.npubin", "");
  }
  // Past the checksum: the same changes to the FlatBuffer, sealed again as a writer that lies would.
  const std::string flatbuffer(bytes.begin(), bytes.end() - static_cast<std::ptrdiff_t>(kNpubinFooterBytes));
  for (const std::string& changed : byte_mutations(flatbuffer)) {
    const std::vector<uint8_t> resealed = sealed(std::vector<uint8_t>(changed.begin(), changed.end()));
    expect_clean([&] { describe_program(read_program_copy(resealed, "m.npubin")); }, "m.npubin", "npubin mutation");
  }
}

TEST(BadProgram, WrongFilesAndMissingFiles) {
  expect_error([] { read_program_copy({}, "empty.npubin"); }, "empty.npubin", "too short");
  const std::string text = kRelu;
  expect_error([&] { read_program_copy(std::vector<uint8_t>(text.begin(), text.end()), "graph.npubin"); },
               "graph.npubin", "identifier");
  expect_error([] { read_program("/nonexistent/model.npubin"); }, "/nonexistent/model.npubin", "cannot open");
}

// --- config.json ---

TEST(BadConfig, EveryTruncationFails) {
  const std::string config = kConfig;
  ASSERT_NO_THROW(ModelConfig::parse(config, "config.json"));
  for (size_t length = 0; length < config.size(); ++length)
    expect_error([&] { ModelConfig::parse(config.substr(0, length), "config.json"); }, "config.json", "");
}

TEST(BadConfig, AbsurdSizes) {
  auto with = [](const std::string& field) {  // a repeated key: the last one counts
    std::string text = kConfig;
    text.insert(text.rfind('}'), ", " + field);
    return text;
  };
  expect_error([&] { ModelConfig::parse(with(R"("hidden_size": -64)"), "config.json"); }, "config.json", "hidden_size");
  expect_error([&] { ModelConfig::parse(with(R"("num_key_value_heads": 0)"), "config.json"); }, "config.json",
               "num_key_value_heads");
  expect_error([&] { ModelConfig::parse(with(R"("head_dim": "big")"), "config.json"); }, "config.json", "head_dim");
}

// --- allocation ---

TEST(BadSizes, TensorsLargerThanMemoryAreRefusedBeforeAllocating) {
  // 2^40 float32 elements (4 TiB) is within the IR limit but past any machine's memory.
  expect_error([] { Tensor(DType::Float32, {1 << 20, 1 << 20}); }, "[1048576, 1048576]", "cannot allocate");
  expect_error([] { Tensor(DType::Int64, {int64_t{1} << 61, 4}); }, "[2305843009213693952, 4]", "");
  Value weight;
  weight.name = "p_fc_weight";
  weight.weight_key = "fc.weight";
  weight.kind = ValueKind::Weight;
  weight.meta = {{1 << 20, 1 << 20}, DType::Float32};
  expect_error([&] { random_weight(weight, 0); }, "[1048576, 1048576]", "cannot allocate");
}
