#include <gtest/gtest.h>

#include <string>

#include "ir/torch_ir_reader.h"
#include "npusim/error.h"

using namespace npusim;

namespace {

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

// A minimal valid graph: x -> relu -> out, with a weight-free linear chain we can break field by field.
std::string small_ir(const std::string& nodes, const std::string& extra = "") {
  return R"({"model_name": "m", "pytorch_version": "2.11",
    "graph_inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
    "graph_outputs": [{"name": "relu", "shape": [2, 3], "dtype": "float32"}],
    "weights": [], "weight_name_mapping": {}, "nodes": )" +
         nodes + extra + "}";
}

const char* kReluNode = R"([{"name": "relu", "op_type": "aten.relu.default",
    "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32", "producer_node": "x", "producer_output_idx": 0}],
    "outputs": [{"name": "relu", "shape": [2, 3], "dtype": "float32"}], "attrs": {}}])";

std::string replaced(std::string text, const std::string& from, const std::string& to, size_t start = 0) {
  const size_t pos = text.find(from, start);
  if (pos == std::string::npos)
    ADD_FAILURE() << "fixture text lacks " << from;
  else
    text.replace(pos, from.size(), to);
  return text;
}

void expect_error(const std::string& text, const std::string& fragment) {
  try {
    parse_torch_ir(text, "model.json");
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("model.json"), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

}  // namespace

TEST(TorchIrReader, ReadsResNet18Fixture) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  EXPECT_EQ(graph.nodes.size(), 69u);
  ASSERT_EQ(graph.inputs.size(), 1u);
  EXPECT_EQ(graph.value(graph.inputs[0]).meta.shape, (Shape{1, 3, 224, 224}));
  ASSERT_EQ(graph.outputs.size(), 1u);
  EXPECT_EQ(graph.value(graph.outputs[0]).meta.shape, (Shape{1, 1000}));
  const Node& conv = graph.nodes[0];
  EXPECT_EQ(conv.source_op, "aten.conv2d.default");
  ASSERT_EQ(conv.inputs.size(), 2u);
  const Value& weight = graph.value(conv.inputs[1]);
  EXPECT_EQ(weight.kind, ValueKind::Weight);
  EXPECT_EQ(weight.name, "p_conv1_weight");
  EXPECT_EQ(weight.weight_key, "conv1.weight");
  // num_batches_tracked is listed as a [] int64 weight no node reads.
  bool found_counter = false;
  for (ValueId id : graph.weights)
    if (graph.value(id).weight_key == "bn1.num_batches_tracked") {
      found_counter = true;
      EXPECT_TRUE(graph.value(id).meta.shape.empty());
      EXPECT_EQ(graph.value(id).meta.dtype, DType::Int64);
    }
  EXPECT_TRUE(found_counter);
}

TEST(TorchIrReader, ReadsQwenGraphsWithGetitemAndInt64Ends) {
  for (const char* file : {"/qwen_tiny/prefill_ir.json", "/qwen_tiny/decode_ir.json", "/ir/qwen15_decode_ir.json"}) {
    const Graph graph = read_torch_ir(kFixtures + file);
    bool saw_int64_max = false, saw_getitem = false;
    for (const Node& node : graph.nodes) {
      if (node.source_op == "aten.slice.Tensor" && node.attrs.has("end") && node.attrs.get_int("end") == INT64_MAX)
        saw_int64_max = true;
      if (node.source_op == "<built-in function getitem>") {
        saw_getitem = true;
        EXPECT_EQ(node.inputs.size(), 2u);  // both rotary outputs
        EXPECT_EQ(graph.value(node.inputs[1]).producer_slot, 1);
      }
    }
    EXPECT_TRUE(saw_int64_max) << file;
    EXPECT_TRUE(saw_getitem) << file;
  }
}

TEST(TorchIrReader, StringifiedDtypesAndScalarOperands) {
  const Graph graph = read_torch_ir(kFixtures + "/qwen_tiny/prefill_ir.json");
  for (const Node& node : graph.nodes) {
    if (node.source_op == "aten.to.dtype") EXPECT_EQ(node.attrs.get_string("dtype"), "torch.float32");
    if (node.source_op == "aten.add.Tensor" && node.inputs.size() == 1) EXPECT_TRUE(node.attrs.has("other"));
  }
}

TEST(TorchIrReader, AcceptsTheMinimalGraph) {
  const Graph graph = parse_torch_ir(small_ir(kReluNode), "model.json");
  EXPECT_EQ(graph.nodes.size(), 1u);
  EXPECT_EQ(graph.nodes[0].op, "relu");
}

TEST(TorchIrReader, RejectsMalformedFiles) {
  expect_error("", "empty");
  expect_error("{\"graph_inputs\": [", "not valid JSON");
  expect_error("[1, 2]", "JSON object");
  expect_error(R"({"graph_inputs": [], "graph_outputs": [], "weights": []})", "'nodes'");
  expect_error(R"({"graph_inputs": {}, "graph_outputs": [], "weights": [], "nodes": []})", "must be a list");
  EXPECT_THROW(read_torch_ir("/nonexistent/model.json"), Error);
}

TEST(TorchIrReader, RejectsBadTensorMetas) {
  std::string text = small_ir(kReluNode);
  std::string bad = text;
  bad.replace(bad.find("[2, 3], \"dtype\": \"float32\"}]"), 6, "[2, -3]");
  expect_error(bad, "negative dimension");
  bad = text;
  bad.replace(bad.find("\"float32\""), 9, "\"complex64\"");
  expect_error(bad, "unsupported dtype 'complex64'");
  bad = text;
  bad.replace(bad.find("[2, 3]"), 6, "[1048576, 1048576, 1048576]");
  expect_error(bad, "2^40");
}

TEST(TorchIrReader, RejectsDanglingAndOutOfOrderTensors) {
  std::string dangling = kReluNode;
  dangling.replace(dangling.find("\"producer_node\": \"x\""), 20, "\"producer_node\": \"q\"");
  expect_error(small_ir(dangling), "producer 'q'");

  const std::string out_of_order = R"([
    {"name": "neg", "op_type": "aten.neg.default",
     "inputs": [{"name": "relu", "shape": [2, 3], "dtype": "float32", "producer_node": "relu", "producer_output_idx": 0}],
     "outputs": [{"name": "neg", "shape": [2, 3], "dtype": "float32"}], "attrs": {}},
    {"name": "relu", "op_type": "aten.relu.default",
     "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32", "producer_node": "x", "producer_output_idx": 0}],
     "outputs": [{"name": "relu", "shape": [2, 3], "dtype": "float32"}], "attrs": {}}])";
  expect_error(small_ir(out_of_order), "topological order");

  std::string unknown_weight = replaced(kReluNode, ", \"producer_node\": \"x\", \"producer_output_idx\": 0", "");
  unknown_weight = replaced(unknown_weight, "\"name\": \"x\"", "\"name\": \"p_w\"");
  expect_error(small_ir(unknown_weight), "unknown tensor 'p_w'");
}

TEST(TorchIrReader, RejectsInconsistentShapes) {
  std::string mismatch = kReluNode;
  mismatch.replace(mismatch.find("[2, 3]"), 6, "[3, 2]");
  expect_error(small_ir(mismatch), "shape [3, 2] here but [2, 3]");

  std::string wrong_output = kReluNode;
  const auto pos = wrong_output.find("\"outputs\": [{\"name\": \"relu\", \"shape\": [2, 3]");
  wrong_output.replace(wrong_output.find("[2, 3]", pos), 6, "[2, 4]");
  expect_error(small_ir(wrong_output), "node 'relu'");
}

TEST(TorchIrReader, UnknownOpsStayOpaqueAndAreListed) {
  std::string opaque = kReluNode;
  opaque.replace(opaque.find("aten.relu.default"), 17, "aten.frobnicate.default");
  const Graph graph = parse_torch_ir(small_ir(opaque), "model.json");
  ASSERT_EQ(graph.nodes.size(), 1u);
  EXPECT_EQ(graph.nodes[0].def, nullptr);
  const auto unsupported = graph.unsupported_ops();
  ASSERT_EQ(unsupported.size(), 1u);
  EXPECT_NE(unsupported[0].find("aten.frobnicate.default"), std::string::npos);
  EXPECT_NE(unsupported[0].find("relu"), std::string::npos);
}

TEST(TorchIrReader, RejectsWrongAttributeTypes) {
  const std::string bad_getitem = R"([
    {"name": "relu", "op_type": "<built-in function getitem>",
     "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32", "producer_node": "x", "producer_output_idx": 0}],
     "outputs": [{"name": "relu", "shape": [2, 3], "dtype": "float32"}], "attrs": {"index": "zero"}}])";
  expect_error(small_ir(bad_getitem), "attribute 'index'");
}

TEST(TorchIrReader, ReadsEmbeddedConstants) {
  const std::string with_constant = R"([
    {"name": "relu", "op_type": "aten.add.Tensor",
     "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32", "producer_node": "x", "producer_output_idx": 0},
                {"name": "c_bias", "shape": [3], "dtype": "float32"}],
     "outputs": [{"name": "relu", "shape": [2, 3], "dtype": "float32"}], "attrs": {}}])";
  std::string text = small_ir(with_constant, R"(, "constants": {"bias": {"data": [1.5, 2, -3], "dtype": "float32"}})");
  text.replace(
      text.find("\"weights\": [], \"weight_name_mapping\": {}"), 40,
      R"("weights": [{"name": "bias", "shape": [3], "dtype": "float32"}], "weight_name_mapping": {"c_bias": "bias"})");
  const Graph graph = parse_torch_ir(text, "model.json");
  ASSERT_EQ(graph.constants.count("bias"), 1u);
  const Tensor& bias = graph.constants.at("bias");
  EXPECT_EQ(bias.shape(), (Shape{3}));
  EXPECT_FLOAT_EQ(bias.data<float>()[0], 1.5f);
  EXPECT_FLOAT_EQ(bias.data<float>()[2], -3.0f);
  EXPECT_EQ(graph.value(graph.nodes[0].inputs[1]).weight_key, "bias");
}
