#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "compiler/graph_edit.h"
#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "ir/torch_ir_reader.h"
#include "npubin_generated.h"
#include "npusim/error.h"
#include "program/program.h"

using namespace npusim;

namespace {

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

std::string work_dir() {
  const std::string dir = std::string(NPUSIM_WORK_DIR) + "/program_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

Program compile(const std::string& ir_path, DType compute_dtype = DType::Float32, std::set<std::string> disabled = {}) {
  Program program;
  program.graph = read_torch_ir(kFixtures + "/" + ir_path);
  program.compute_dtype = compute_dtype;
  program.disabled_passes.assign(disabled.begin(), disabled.end());
  compiler::PassContext context;
  compiler::PassOptions options;
  options.disabled = std::move(disabled);
  compiler::run_passes(program.graph, options, context);
  program.pass_log = context.log;
  program.plan = compiler::plan_memory(program.graph, compute_dtype);
  return program;
}

// The producer the file records: the live node listing the value, or none for values a pass orphaned.
std::vector<std::pair<int32_t, int32_t>> live_producers(const Graph& graph) {
  std::vector<std::pair<int32_t, int32_t>> producers(graph.values.size(), {-1, 0});
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (size_t slot = 0; slot < graph.nodes[n].outputs.size(); ++slot)
      producers[static_cast<size_t>(graph.nodes[n].outputs[slot])] = {static_cast<int32_t>(n),
                                                                      static_cast<int32_t>(slot)};
  return producers;
}

void expect_same_attrs(const Attrs& a, const Attrs& b, const std::string& where) {
  ASSERT_EQ(a.values().size(), b.values().size()) << where;
  for (const auto& [name, value] : a.values()) {
    ASSERT_TRUE(b.has(name)) << where << " lost attribute " << name;
    EXPECT_EQ(value, b.get(name)) << where << " attribute " << name << ": " << attr_value_string(value) << " vs "
                                  << attr_value_string(b.get(name));
  }
}

void expect_same_program(const Program& expected, const Program& actual) {
  EXPECT_EQ(actual.producer, expected.producer);
  EXPECT_EQ(actual.target, expected.target);
  EXPECT_EQ(actual.compute_dtype, expected.compute_dtype);
  EXPECT_EQ(actual.disabled_passes, expected.disabled_passes);
  EXPECT_EQ(actual.pass_log, expected.pass_log);

  const Graph& a = expected.graph;
  const Graph& b = actual.graph;
  EXPECT_EQ(b.model_name, a.model_name);
  EXPECT_EQ(b.pytorch_version, a.pytorch_version);
  EXPECT_EQ(b.source, a.source);
  EXPECT_EQ(b.inputs, a.inputs);
  EXPECT_EQ(b.outputs, a.outputs);
  EXPECT_EQ(b.weights, a.weights);
  ASSERT_EQ(b.values.size(), a.values.size());
  const auto producers = live_producers(a);
  for (size_t i = 0; i < a.values.size(); ++i) {
    const Value& x = a.values[i];
    const Value& y = b.values[i];
    SCOPED_TRACE("value " + x.name);
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.meta, x.meta);
    EXPECT_EQ(y.kind, x.kind);
    EXPECT_EQ(y.producer, producers[i].first);
    EXPECT_EQ(y.producer_slot, producers[i].second);
    EXPECT_EQ(y.weight_key, x.weight_key);
    ASSERT_EQ(y.transform.has_value(), x.transform.has_value());
    if (x.transform) {
      EXPECT_EQ(y.transform->kind, x.transform->kind);
      EXPECT_EQ(y.transform->sources, x.transform->sources);
      expect_same_attrs(x.transform->params, y.transform->params, "transform of " + x.name);
    }
  }
  ASSERT_EQ(b.nodes.size(), a.nodes.size());
  for (size_t n = 0; n < a.nodes.size(); ++n) {
    const Node& x = a.nodes[n];
    const Node& y = b.nodes[n];
    SCOPED_TRACE("node " + x.name);
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.op, x.op);
    EXPECT_EQ(y.source_op, x.source_op);
    EXPECT_EQ(y.def, x.def);
    EXPECT_NE(y.def, nullptr);
    EXPECT_EQ(y.inputs, x.inputs);
    EXPECT_EQ(y.outputs, x.outputs);
    expect_same_attrs(x.attrs, y.attrs, x.name);
  }
  ASSERT_EQ(b.constants.size(), a.constants.size());
  for (const auto& [key, tensor] : a.constants) {
    ASSERT_TRUE(b.constants.count(key)) << key;
    const Tensor& other = b.constants.at(key);
    EXPECT_EQ(other.dtype(), tensor.dtype()) << key;
    EXPECT_EQ(other.shape(), tensor.shape()) << key;
    ASSERT_EQ(other.nbytes(), tensor.nbytes()) << key;
    EXPECT_EQ(std::memcmp(other.bytes(), tensor.bytes(), tensor.nbytes()), 0) << key;
  }

  const compiler::MemoryPlan& p = expected.plan;
  const compiler::MemoryPlan& q = actual.plan;
  EXPECT_EQ(q.alignment, p.alignment);
  EXPECT_EQ(q.arena_bytes, p.arena_bytes);
  EXPECT_EQ(q.persistent_bytes, p.persistent_bytes);
  EXPECT_EQ(q.unplanned_bytes, p.unplanned_bytes);
  ASSERT_EQ(q.values.size(), p.values.size());
  for (size_t i = 0; i < p.values.size(); ++i) {
    SCOPED_TRACE("buffer of " + a.values[i].name);
    EXPECT_EQ(q.values[i].placement, p.values[i].placement);
    EXPECT_EQ(q.values[i].offset, p.values[i].offset);
    EXPECT_EQ(q.values[i].bytes, p.values[i].bytes);
    EXPECT_EQ(q.values[i].alias_of, p.values[i].alias_of);
    EXPECT_EQ(q.values[i].in_place, p.values[i].in_place);
  }
}

Program round_trip(const Program& program, const std::string& name) {
  const std::string path = work_dir() + "/" + name + ".npubin";
  write_program(path, program);
  return read_program(path);
}

template <typename Body>
void expect_error(Body body, const std::string& fragment) {
  try {
    body();
    ADD_FAILURE() << "expected an error containing '" << fragment << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

// A small hand-made program: relu(x) with every attribute variant, a derived weight and a constant.
Program small_program() {
  Program program;
  program.target = "cpu";
  program.pass_log = {"fold_constants: 1 folded"};
  Graph& graph = program.graph;
  graph.model_name = "tiny";
  graph.source = "tiny.json";
  const ValueId x = compiler::add_value(graph, "x", {{2, 3}, DType::Float32}, ValueKind::GraphInput);
  graph.inputs.push_back(x);
  Attrs attrs;
  attrs.set("none", NoneValue{});
  attrs.set("flag", true);
  attrs.set("count", int64_t{-9223372036854775807 - 1});
  attrs.set("scale", 1e-6);
  attrs.set("mode", std::string("torch.float32"));
  attrs.set("sizes", std::vector<int64_t>{1, -1, 9223372036854775807});
  attrs.set("no_sizes", std::vector<int64_t>{});
  attrs.set("weights", std::vector<double>{0.5, -2.25, 1e300});
  attrs.set("masks", std::vector<bool>{true, false, true});
  Node relu = compiler::make_node(graph, "relu", "relu", attrs, {x}, {{{2, 3}, DType::Float32}}, {"relu"});
  compiler::insert_node(graph, 0, std::move(relu));
  graph.outputs.push_back(graph.nodes[0].outputs[0]);
  const ValueId gamma = compiler::add_value(graph, "p_gamma", {{3}, DType::Float32}, ValueKind::Weight);
  graph.value(gamma).weight_key = "bn.weight";
  graph.weights.push_back(gamma);
  Attrs params;
  params.set("eps", 1e-5);
  compiler::add_derived_weight(graph, "folded.scale", {{3}, DType::Float32},
                               WeightTransform{"bn_fold_weight", {gamma, kNoValue, gamma}, params});
  Tensor constant(DType::Int64, {2, 2});
  for (int64_t i = 0; i < 4; ++i) constant.mutable_data<int64_t>()[i] = i * 1000000007;
  compiler::add_constant(graph, "folded.table", constant);
  compiler::add_constant(graph, "folded.empty", Tensor(DType::Float32, {0, 4}));
  program.plan = compiler::plan_memory(graph, program.compute_dtype);
  return program;
}

}  // namespace

TEST(Program, RoundTripsHandMadeProgram) {
  const Program program = small_program();
  const Program loaded = round_trip(program, "small");
  expect_same_program(program, loaded);
  EXPECT_NE(loaded.graph.nodes[0].attrs.owner().find("node 'relu'"), std::string::npos);
}

TEST(Program, RoundTripsQwenTinyPrefill) {
  const Program program = compile("qwen_tiny/prefill_ir.json");
  ASSERT_GT(program.graph.constants.size(), 0u);  // folded masks and position tables
  expect_same_program(program, round_trip(program, "qwen_tiny_prefill"));
}

TEST(Program, RoundTripsResNet18WithFoldedBatchNorm) {
  const Program program = compile("ir/resnet18_ir.json");
  bool has_transform = false;
  for (const Value& value : program.graph.values) has_transform = has_transform || value.transform.has_value();
  EXPECT_TRUE(has_transform);
  expect_same_program(program, round_trip(program, "resnet18"));
}

TEST(Program, RoundTripsWithDisabledPassesInHalfPrecision) {
  const Program program = compile("qwen_tiny/decode_ir.json", DType::BFloat16, {"fusions", "fold_constants"});
  const Program loaded = round_trip(program, "qwen_tiny_decode");
  expect_same_program(program, loaded);
  EXPECT_EQ(loaded.disabled_passes, (std::vector<std::string>{"fold_constants", "fusions"}));
}

TEST(Program, WriteReplacesAnExistingFileWhole) {
  const std::string path = work_dir() + "/replace.npubin";
  {
    std::ofstream out(path);
    out << std::string(100000, 'x');
  }
  const Program program = small_program();
  write_program(path, program);
  expect_same_program(program, read_program(path));
  for (const auto& entry : std::filesystem::directory_iterator(work_dir()))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  EXPECT_THROW(write_program("/nonexistent/dir/p.npubin", program), Error);
}

TEST(Program, RejectsOtherFiles) {
  expect_error([] { read_program("/nonexistent/model.npubin"); }, "cannot open program");
  EXPECT_THROW(read_program(work_dir()), Error);  // a directory
  const std::string text = "{\"graph_inputs\": [], \"this is\": \"json\"}";
  expect_error([&] { read_program_bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "m.json"); },
               "m.json: not an npusim program");
  expect_error([] { read_program_bytes(nullptr, 0, "empty.npubin"); }, "not an npusim program");

  std::vector<uint8_t> bytes = write_program_bytes(small_program());
  std::memcpy(bytes.data() + 4, "NPUX", 4);
  expect_error([&] { read_program_bytes(bytes.data(), bytes.size(), "p.npubin"); }, "not an npusim program");
}

TEST(Program, ReportsTheFormatVersion) {
  flatbuffers::FlatBufferBuilder builder;
  fb::FinishProgramBuffer(builder, fb::CreateProgram(builder, Program::kFormatVersion + 1));
  expect_error([&] { read_program_bytes(builder.GetBufferPointer(), builder.GetSize(), "future.npubin"); },
               "future.npubin: written by format version 2, this npusim reads version 1; recompile the model");

  // A future layout this schema cannot verify still names its version: here a string runs past the end.
  flatbuffers::FlatBufferBuilder future;
  fb::FinishProgramBuffer(future, fb::CreateProgram(future, 7, future.CreateString(std::string(40, 'p'))));
  expect_error([&] { read_program_bytes(future.GetBufferPointer(), future.GetSize() - 8, "future.npubin"); },
               "written by format version 7, this npusim reads version 1");

  std::vector<uint8_t> bytes = write_program_bytes(small_program());
  const auto past_the_end = static_cast<uint32_t>(bytes.size());
  std::memcpy(bytes.data(), &past_the_end, sizeof(past_the_end));  // the root offset
  expect_error([&] { read_program_bytes(bytes.data(), bytes.size(), "broken.npubin"); }, "truncated or corrupted");
}

TEST(Program, RejectsInconsistentContent) {
  // Each case breaks one thing the verifier cannot see.
  auto expect_rejected = [](const Program& program, const std::string& fragment) {
    const std::vector<uint8_t> bytes = write_program_bytes(program);
    expect_error([&] { read_program_bytes(bytes.data(), bytes.size(), "bad.npubin"); }, fragment);
  };
  Program unknown_op = small_program();
  unknown_op.graph.nodes[0].op = "frobnicate";
  expect_rejected(unknown_op, "op 'frobnicate' is not known");

  Program dangling = small_program();
  dangling.graph.nodes[0].inputs[0] = 99;
  expect_rejected(dangling, "value 99, out of range");

  Program bad_output = small_program();
  bad_output.graph.outputs.push_back(-3);
  expect_rejected(bad_output, "out of range");

  Program wrong_shape = small_program();
  wrong_shape.graph.value(wrong_shape.graph.nodes[0].outputs[0]).meta.shape = {3, 2};
  wrong_shape.plan = compiler::plan_memory(wrong_shape.graph, DType::Float32);
  expect_rejected(wrong_shape, "but the op computes [2, 3]");

  Program bad_transform = small_program();
  bad_transform.graph.values.back().transform = WeightTransform{"bn_fold_weight", {1000}, {}};
  expect_rejected(bad_transform, "transform source");

  Program short_plan = small_program();
  short_plan.plan.values.back().bytes = 5;
  expect_rejected(short_plan, "bytes but the value needs");

  Program outside_arena = small_program();
  outside_arena.plan.values[0] = {compiler::Placement::Arena, 64, 24, kNoValue, false};
  expect_rejected(outside_arena, "does not fit");

  Program bad_view = small_program();
  bad_view.plan.values[0] = {compiler::Placement::View, 0, 24, kNoValue, false};
  expect_rejected(bad_view, "view of nothing");

  Program missing_buffers = small_program();
  missing_buffers.plan.values.pop_back();
  EXPECT_THROW(write_program_bytes(missing_buffers), Error);

  // Constants and enums written by hand.
  auto read_built = [](flatbuffers::FlatBufferBuilder& builder, flatbuffers::Offset<fb::Program> root) {
    fb::FinishProgramBuffer(builder, root);
    const std::vector<uint8_t> bytes = seal_npubin(builder.GetBufferPointer(), builder.GetSize());
    return read_program_bytes(bytes.data(), bytes.size(), "built.npubin");
  };
  {
    flatbuffers::FlatBufferBuilder b;
    const std::vector<uint8_t> data(3, 0);
    const std::vector<int64_t> shape = {2, 2};
    const auto constant = fb::CreateConstantDirect(b, "c", fb::DType::Float32, &shape, &data);
    const std::vector<flatbuffers::Offset<fb::Constant>> constants = {constant};
    const auto root = fb::CreateProgram(b, Program::kFormatVersion, 0, 0, fb::DType::Float32, 0, 0, fb::CreateGraph(b),
                                        b.CreateVector(constants), fb::CreateMemoryPlan(b, 64));
    expect_error([&] { read_built(b, root); }, "constant 'c' holds 3 bytes but [2, 2] float32 needs 16");
  }
  {
    flatbuffers::FlatBufferBuilder b;
    const auto root = fb::CreateProgram(b, Program::kFormatVersion, 0, 0, static_cast<fb::DType>(42), 0, 0,
                                        fb::CreateGraph(b), 0, fb::CreateMemoryPlan(b, 64));
    expect_error([&] { read_built(b, root); }, "unknown dtype code 42");
  }
  {
    flatbuffers::FlatBufferBuilder b;
    const auto root = fb::CreateProgram(b, Program::kFormatVersion, 0, 0, fb::DType::Float32, 0, 0, 0, 0,
                                        fb::CreateMemoryPlan(b, 64));
    expect_error([&] { read_built(b, root); }, "no graph");
  }
  {
    flatbuffers::FlatBufferBuilder b;
    const std::vector<flatbuffers::Offset<fb::Attr>> attrs = {
        fb::CreateAttr(b, b.CreateString("broken"), static_cast<fb::AttrValue>(77), fb::CreateNoneAttr(b).Union())};
    const std::vector<int32_t> none;
    const std::vector<flatbuffers::Offset<fb::Node>> nodes = {
        fb::CreateNodeDirect(b, "n", "relu", "aten.relu.default", &attrs, &none, &none)};
    const auto graph = fb::CreateGraphDirect(b, "", "", "", nullptr, &nodes);
    const auto root = fb::CreateProgram(b, Program::kFormatVersion, 0, 0, fb::DType::Float32, 0, 0, graph, 0,
                                        fb::CreateMemoryPlan(b, 64));
    expect_error([&] { read_built(b, root); }, "attribute 'broken' has no value or an unknown value type 77");
  }
}

TEST(Program, TruncatedFilesGiveErrors) {
  const std::vector<uint8_t> bytes = write_program_bytes(compile("qwen_tiny/prefill_ir.json"));
  ASSERT_GT(bytes.size(), 10000u);
  for (size_t length = 0; length < bytes.size(); length += 97) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_THROW(read_program_bytes(prefix.data(), prefix.size(), "cut.npubin"), Error) << length << " bytes";
  }
  for (size_t cut = 1; cut <= 64; ++cut) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.end() - static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(read_program_bytes(prefix.data(), prefix.size(), "cut.npubin"), Error) << cut << " bytes short";
  }
}

TEST(Program, ChecksumCatchesEveryDamagedByte) {
  const std::vector<uint8_t> original = write_program_bytes(compile("qwen_tiny/decode_ir.json"));
  std::mt19937 random(1234);
  std::uniform_int_distribution<size_t> position(0, original.size() - 1);
  std::uniform_int_distribution<int> change(1, 255), flips(1, 8);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint8_t> bytes = original;
    for (int i = flips(random); i > 0; --i) {
      const size_t at = position(random);
      bytes[at] = static_cast<uint8_t>(bytes[at] ^ change(random));
    }
    EXPECT_THROW(read_program_bytes(bytes.data(), bytes.size(), "corrupt.npubin"), Error) << "trial " << trial;
  }
  std::vector<uint8_t> longer = original;
  longer.push_back(0);
  expect_error([&] { read_program_bytes(longer.data(), longer.size(), "long.npubin"); }, "truncated or corrupted");
}

// The checksum is recomputed after damaging the FlatBuffer, so every byte reaches the verifier and the checks
// behind it.
TEST(Program, DamagedContentGivesErrorsNotCrashes) {
  const std::vector<uint8_t> sealed = write_program_bytes(compile("qwen_tiny/decode_ir.json"));
  const std::vector<uint8_t> original(sealed.begin(), sealed.end() - static_cast<std::ptrdiff_t>(kNpubinFooterBytes));
  std::mt19937 random(99);
  std::uniform_int_distribution<size_t> position(0, original.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255), flips(1, 8);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bytes = original;
    for (int i = flips(random); i > 0; --i) bytes[position(random)] = static_cast<uint8_t>(byte(random));
    const std::vector<uint8_t> resealed = seal_npubin(bytes.data(), bytes.size());
    try {
      const Program program = read_program_bytes(resealed.data(), resealed.size(), "damaged.npubin");
      EXPECT_FALSE(describe_program(program).empty());
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_EQ(rejected + accepted, 2000);

  // Misaligned buffers are read too.
  std::vector<uint8_t> shifted(sealed.size() + 1);
  std::memcpy(shifted.data() + 1, sealed.data(), sealed.size());
  EXPECT_NO_THROW(read_program_bytes(shifted.data() + 1, sealed.size(), "shifted.npubin"));
}

// Both the compiled program and the whole graph with every pass off (2000+ nodes). How fast it reads is measured by
// bench_compile, not here.
TEST(Program, RoundTripsQwen15Prefill) {
  const std::set<std::string> every_pass = {"remove_noops", "fold_constants", "fold_batchnorm", "fusions"};
  for (const std::set<std::string>& disabled : {std::set<std::string>{}, every_pass}) {
    const Program program = compile("ir/qwen15_prefill_ir.json", DType::BFloat16, disabled);
    if (!disabled.empty()) {
      ASSERT_GT(program.graph.nodes.size(), 2000u);
    }
    const std::string path = work_dir() + "/qwen15_prefill.npubin";
    write_program(path, program);
    expect_same_program(program, read_program(path));
  }
}

TEST(Program, DescribesEverything) {
  const Program program = compile("ir/resnet18_ir.json");
  const std::string text = describe_program(program);
  for (const char* fragment : {"format version 1",
                               "target: cpu, compute dtype: float32",
                               "disabled passes: (none)",
                               "fold_batchnorm",
                               "inputs (1):\n  x [1, 3, 224, 224] float32",
                               "outputs (1):",
                               "[1, 1000] float32",
                               "kernels (",
                               "#0 fused_conv2d 'relu_': x [1, 3, 224, 224], p_conv1_weight.bn_folded [64, 3, 7, 7], "
                               "p_conv1_weight.bn_folded_bias [64] -> relu_ [1, 64, 112, 112]",
                               "stride=[2, 2]",
                               "activation=\"relu\"",
                               "max_pool2d [1, 64, 56, 56]",
                               "relu__2: arena @",
                               "fuse_conv_activation: ",
                               "buffers (arena ",
                               "x: persistent #0",
                               "in place",
                               "weights (",
                               "conv1.weight [64, 3, 7, 7] float32",
                               "= bn_fold_",
                               "{eps=",
                               "totals:",
                               "arena ",
                               "node outputs planned "})
    EXPECT_NE(text.find(fragment), std::string::npos) << "missing '" << fragment << "' in\n" << text;

  const std::string tiny = describe_program(small_program());
  for (const char* fragment :
       {"folded.table [2, 2] int64, 32 bytes", "constants (2, ", "disabled passes: (none)",
        "folded.scale [3] float32 (unused) = bn_fold_weight(bn.weight, none, bn.weight) {eps=1e-05}",
        "bn.weight [3] float32 (load time only)", "masks=[1, 0, 1]", "none=null", "mode=\"torch.float32\""})
    EXPECT_NE(tiny.find(fragment), std::string::npos) << "missing '" << fragment << "' in\n" << tiny;
}
