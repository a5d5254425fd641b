// Bad files and command lines given to the CLI: every one ends in a non-zero exit (not a signal), within a
// time limit, with an `error:` line that names the file at fault and the problem. test_cli_errors.cpp covers
// the first cases of each kind; these are the rest of docs/reliability.md's list.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "e2e_util.h"

namespace npusim {
namespace {

using test::cli;
using test::kFixtures;

constexpr int kTimeoutExit = 124;  // what `timeout` returns when it had to stop the command

std::string dir() { return test::work_dir("bad_inputs_cli"); }

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = dir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The output's `error:` lines.
std::vector<std::string> error_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);)
    if (line.rfind("error:", 0) == 0) lines.push_back(line);
  return lines;
}

// `npusim ARGUMENTS` fails cleanly, and its one error line contains every fragment (the file and the problem).
void expect_clean_failure(const std::string& arguments, const std::vector<std::string>& fragments) {
  const auto result = test::run_command("timeout 60 " + cli() + " " + arguments);
  EXPECT_NE(result.exit_code, 0) << arguments << "\n" << result.output;
  EXPECT_NE(result.exit_code, kTimeoutExit) << "hung: " << arguments;
  EXPECT_GE(result.exit_code, 0) << "killed by a signal: " << arguments << "\n" << result.output;
  EXPECT_LT(result.exit_code, 128) << "crashed: " << arguments << "\n" << result.output;
  const std::vector<std::string> lines = error_lines(result.output);
  ASSERT_EQ(lines.size(), 1u) << arguments << "\n" << result.output;
  for (const std::string& fragment : fragments)
    EXPECT_NE(lines[0].find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << lines[0];
}

std::string tensor(const std::string& name, const std::string& shape, const std::string& dtype = "float32") {
  return R"({"name": ")" + name + R"(", "shape": )" + shape + R"(, "dtype": ")" + dtype + "\"}";
}

// One node reading x (and weight w, placeholder p_w, when `w_shape` is set), writing `out`.
std::string one_node_ir(const std::string& op_type, const std::string& x_shape, const std::string& attrs,
                        const std::string& out_shape, const std::string& w_shape = "") {
  const bool weight = !w_shape.empty();
  return R"({"graph_inputs": [)" + tensor("x", x_shape) + R"(], "graph_outputs": [)" + tensor("out", out_shape) +
         R"(], "weights": [)" + (weight ? tensor("w", w_shape) : "") + R"(], "weight_name_mapping": )" +
         (weight ? R"({"p_w": "w"})" : "{}") + R"(, "nodes": [{"name": "n", "op_type": ")" + op_type +
         R"(", "inputs": [)" + tensor("x", x_shape) + (weight ? ", " + tensor("p_w", w_shape) : "") +
         R"(], "outputs": [)" + tensor("out", out_shape) + R"(], "attrs": )" + attrs + "}]}";
}

const std::string kRelu = one_node_ir("aten.relu.default", "[2, 3]", "{}", "[2, 3]");

std::string relu_graph() { return write_file("relu.json", kRelu); }

std::string u64_le(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}

std::string safetensors_with(const std::string& header, size_t data_bytes) {
  std::string padded = header;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  return u64_le(padded.size()) + padded + std::string(data_bytes, '\0');
}

std::string npy_with(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  const auto length = static_cast<uint16_t>(header.size());
  return std::string("\x93NUMPY\x01\x00", 8) + std::string(reinterpret_cast<const char*>(&length), 2) + header + data;
}

const std::string kRandom = " --random-weights 0 --random-inputs 0";

TEST(BadInputsCli, MalformedGraphFiles) {
  for (const auto& [name, text, problem] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"empty.json", "", "file is empty"},
           {"binary.json", std::string("\x00\xff\xfe{", 4), "not valid JSON"},
           {"list.json", "[1, 2]", "top level must be a JSON object"},
           {"no_nodes.json", R"({"graph_inputs": [], "graph_outputs": [], "weights": []})",
            "missing top-level key 'nodes'"},
           {"huge_number.json", R"({"graph_inputs": [{"name": "x", "shape": [1e999], "dtype": "float32"}]})",
            "not valid JSON"},
       }) {
    const std::string path = write_file(name, text);
    expect_clean_failure("run " + path + kRandom, {path, problem});
  }
  expect_clean_failure("run " + dir() + kRandom, {dir(), "is a directory"});
  // Nesting a million lists deep used to overflow the stack (exit 139).
  std::string deep = kRelu;
  deep.replace(deep.find("\"attrs\": {}"), 11,
               "\"attrs\": {\"a\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}");
  const std::string path = write_file("deep.json", deep);
  expect_clean_failure("run " + path + kRandom, {path, "JSON nested deeper than 64 levels"});
}

TEST(BadInputsCli, InconsistentGraphs) {
  std::string shapes = kRelu;
  shapes.replace(shapes.rfind("[2, 3]"), 6, "[3, 2]");
  std::string dangling = kRelu;
  dangling.replace(dangling.find(R"("inputs": [{"name": "x")"), 23, R"("inputs": [{"name": "y")");
  const std::string out_of_order = R"({"graph_inputs": [)" + tensor("x", "[2]") + R"(], "graph_outputs": [)" +
                                   tensor("a", "[2]") + R"(], "weights": [], "nodes": [
      {"name": "b", "op_type": "aten.neg.default", "inputs": [)" +
                                   tensor("a", "[2]") + R"(], "outputs": [)" + tensor("b", "[2]") + R"(]},
      {"name": "a", "op_type": "aten.relu.default", "inputs": [)" +
                                   tensor("x", "[2]") + R"(], "outputs": [)" + tensor("a", "[2]") + "]}]}";
  for (const auto& [name, text, problem] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"shapes.json", shapes, "has shape [3, 2] in the IR but the op computes [2, 3]"},
           {"dangling.json", dangling, "unknown tensor 'y'"},
           {"order.json", out_of_order, "topological order"},
       }) {
    const std::string path = write_file(name, text);
    expect_clean_failure("run " + path + kRandom, {path, problem});
  }
}

TEST(BadInputsCli, AttributesOutOfRange) {
  const std::string conv = "aten.conv2d.default", pool = "aten.max_pool2d.default";
  for (const auto& [name, text, problem] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"zero_stride.json",
            one_node_ir(conv, "[1, 1, 4, 4]", R"({"stride": [0, 0]})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"), "stride"},
           {"string_stride.json",
            one_node_ir(conv, "[1, 1, 4, 4]", R"({"stride": "2"})", "[1, 1, 2, 2]", "[1, 1, 3, 3]"),
            "attribute 'stride'"},
           {"negative_kernel.json", one_node_ir(pool, "[1, 1, 4, 4]", R"({"kernel_size": [-3, -3]})", "[1, 1, 2, 2]"),
            "kernel_size"},
           {"getitem.json", one_node_ir("<built-in function getitem>", "[2]", R"({"index": 3})", "[2]"),
            "getitem index 3 is out of range"},
       }) {
    const std::string path = write_file(name, text);
    expect_clean_failure("run " + path + kRandom, {path, "node 'n'", problem});
  }
  const std::string negative =
      write_file("negative_dim.json", one_node_ir("aten.relu.default", "[2, -3]", "{}", "[2, 3]"));
  expect_clean_failure("run " + negative + kRandom, {negative, "graph_inputs[0] 'x'", "negative dimension -3"});
  const std::string rank9 =
      write_file("rank9.json", one_node_ir("aten.relu.default", "[1, 1, 1, 1, 1, 1, 1, 1, 1]", "{}", "[1]"));
  expect_clean_failure("run " + rank9 + kRandom, {rank9, "rank 9 exceeds the maximum rank 8"});
}

TEST(BadInputsCli, AbsurdlyLargeShapesGiveAnErrorNotAnAllocation) {
  auto full = [](const std::string& size) {
    return R"({"graph_inputs": [], "graph_outputs": [)" + tensor("f", size) +
           R"(], "weights": [], "nodes": [{"name": "f", "op_type": "aten.full.default", "inputs": [], "outputs": [)" +
           tensor("f", size) + R"(], "attrs": {"size": )" + size + R"(, "fill_value": 1.0}}]})";
  };
  const std::string past_limit = write_file("full_1e7.json", full("[10000000, 10000000]"));
  expect_clean_failure("run " + past_limit, {past_limit, "more than 2^40 elements"});
  // 2^40 elements (4 TiB) is within the limit: the allocation is refused, not attempted.
  const std::string at_limit = write_file("full_2p20.json", full("[1048576, 1048576]"));
  expect_clean_failure("run " + at_limit + " --reference", {at_limit, "node 'f'", "cannot allocate"});
  expect_clean_failure("run " + at_limit, {"cannot allocate"});
  const std::string weight = write_file("big_weight.json", one_node_ir("aten.linear.default", "[1, 1048576]", "{}",
                                                                       "[1, 1048576]", "[1048576, 1048576]"));
  expect_clean_failure("run " + weight + kRandom, {"[1048576, 1048576]", "cannot allocate"});
}

TEST(BadInputsCli, LyingSafetensorsWeights) {
  const std::string graph = relu_graph();
  const std::string model = read_file(kFixtures + "/qwen_tiny/model.safetensors");
  ASSERT_GT(model.size(), 1000u);
  for (const auto& [name, bytes, problem] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"cut_in_data.safetensors", model.substr(0, model.size() / 2), "past the end of the data section"},
           {"cut_in_header.safetensors", model.substr(0, 100), "is larger than the file"},
           {"long_header.safetensors", u64_le(4096) + "{}", "header length 4096 is larger than the file"},
           {"past_end.safetensors", safetensors_with(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
            "data_offsets end 16 is past the end of the data section (8 bytes)"},
           {"dtype.safetensors", safetensors_with(R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1),
            "unknown dtype 'F4'"},
           {"overlap.safetensors",
            safetensors_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                             12),
            "overlap"},
           {"size.safetensors", safetensors_with(R"({"w":{"dtype":"F32","shape":[3, 3],"data_offsets":[0,12]}})", 12),
            "does not match shape [3, 3]"},
           {"number.safetensors", safetensors_with(R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", 4),
            "header is not valid JSON"},
       }) {
    const std::string path = write_file(name, bytes);
    expect_clean_failure("run " + graph + " --random-inputs 0 --weights " + path, {path, problem});
  }
  expect_clean_failure("run " + graph + " --random-inputs 0 --weights " + dir(), {dir(), "not a regular file"});
}

TEST(BadInputsCli, WrongInputs) {
  const std::string graph = relu_graph();
  const std::string base = "run " + graph + " ";
  const std::string wrong_shape = write_file(
      "x_shape.safetensors", safetensors_with(R"({"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}})", 24));
  expect_clean_failure(base + "--inputs " + wrong_shape, {"'x'", "[3, 2]", "[2, 3]"});
  const std::string wrong_dtype = write_file(
      "x_dtype.safetensors", safetensors_with(R"({"x":{"dtype":"I64","shape":[2,3],"data_offsets":[0,48]}})", 48));
  expect_clean_failure(base + "--inputs " + wrong_dtype, {"'x'", "int64"});
  const std::string wrong_name =
      write_file("y.safetensors", safetensors_with(R"({"y":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 24));
  expect_clean_failure(base + "--inputs " + wrong_name, {wrong_name, "'y' is not an input of"});
  const std::string cut =
      write_file("x_cut.safetensors",
                 safetensors_with(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 24).substr(0, 60));
  expect_clean_failure(base + "--inputs " + cut, {cut});
  expect_clean_failure(base + "--inputs " + dir() + "/absent.safetensors",
                       {dir() + "/absent.safetensors", "cannot open"});

  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string short_npy = write_file("short.npy", npy_with(dict, std::string(12, '\0')));
  expect_clean_failure(base + "--input x=" + short_npy, {short_npy, "truncated npy file"});
  const std::string not_npy = write_file("not.npy", "PK\x03\x04 a zip file");
  expect_clean_failure(base + "--input x=" + not_npy, {not_npy, "not an npy file"});
  expect_clean_failure(base + "--input x=" + dir(), {dir(), "is a directory"});
}

TEST(BadInputsCli, DamagedPrograms) {
  const std::string program = dir() + "/relu.npubin";
  const auto compiled = test::run_command(cli() + " compile " + relu_graph() + " -o " + program);
  ASSERT_EQ(compiled.exit_code, 0) << compiled.output;
  const std::string bytes = read_file(program);
  ASSERT_GT(bytes.size(), 64u);
  const std::string cut = write_file("cut.npubin", bytes.substr(0, bytes.size() / 2));
  expect_clean_failure("run " + cut + " --random-inputs 0", {cut, "truncated or corrupted"});
  std::string flipped_bytes = bytes;
  flipped_bytes[bytes.size() / 2] = static_cast<char>(flipped_bytes[bytes.size() / 2] ^ 0x10);
  const std::string flipped = write_file("flipped.npubin", flipped_bytes);
  expect_clean_failure("run " + flipped + " --random-inputs 0", {flipped, "corrupted"});
  expect_clean_failure("inspect " + flipped, {flipped, "corrupted"});
  const std::string json = write_file("graph.npubin", kRelu);
  expect_clean_failure("inspect " + json, {json, "not an npusim program"});
  expect_clean_failure("inspect " + dir() + "/absent.npubin", {dir() + "/absent.npubin"});
}

TEST(BadInputsCli, BadConfigAndTargetFiles) {
  const std::string graph = relu_graph();
  const std::string empty_weights = write_file("empty.safetensors", safetensors_with("{}", 0));
  const std::string base = "run " + graph + " --random-inputs 0 --weights " + empty_weights + " ";
  const std::string config = write_file("config.json", R"({"model_type": "qwen2", "rope_theta": 1e999})");
  expect_clean_failure(base + "--config " + config, {config, "not valid JSON"});
  const std::string partial = write_file("partial.json", R"({"model_type": "qwen2", "hidden_size": 64})");
  expect_clean_failure(base + "--config " + partial, {partial, "num_hidden_layers"});
  expect_clean_failure(base + "--config " + dir() + "/absent.json", {dir() + "/absent.json", "cannot open"});
  const std::string target = write_file("target.json", R"({"name": "t", "alignment": "sixty-four"})");
  expect_clean_failure("run " + graph + " --random-inputs 0 --target " + target, {target});
  expect_clean_failure("compile " + graph + " --report --target " + dir() + "/absent_target.json",
                       {"absent_target.json"});
}

TEST(BadInputsCli, UnknownFlagsAndBadValues) {
  const std::string graph = relu_graph();
  const std::string run = "run " + graph + " --random-inputs 0 ";
  expect_clean_failure(run + "-x", {"unknown option '-x'"});
  expect_clean_failure(run + "--iters 1 --iters 2", {"'--iters' given more than once"});
  expect_clean_failure("run " + graph + " --random-inputs -1", {"'--random-inputs' must be between"});
  expect_clean_failure(run + "--top many", {"'--top' needs an integer, got 'many'"});
  expect_clean_failure(run + "--iters 99999999999999999999999", {"'--iters' needs an integer"});
  expect_clean_failure(run + "--dtype int8", {"--dtype must be"});
  expect_clean_failure(run + "--disable no_such_pass", {"unknown pass 'no_such_pass'"});
  expect_clean_failure(run + "--random-weights 0 --weights " + graph, {"either --weights or --random-weights"});
  expect_clean_failure(run + "--help=yes", {"'--help' takes no value"});
  for (const char* command : {"compile", "inspect", "verify", "ops", "passes", "bisect"})
    expect_clean_failure(std::string(command) + " --no-such-flag", {"unknown option '--no-such-flag'"});
  expect_clean_failure("compile " + graph + " -o " + dir() + "/absent_dir/x.npubin", {dir() + "/absent_dir/x.npubin"});
  expect_clean_failure("verify " + dir() + "/absent.safetensors " + graph,
                       {dir() + "/absent.safetensors", "cannot open"});
}

}  // namespace
}  // namespace npusim
