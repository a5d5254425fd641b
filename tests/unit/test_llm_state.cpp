// State kept on the CPU backend between runs (PreparedProgram::bind_state): a cache updated in place by
// index_copy, left out of the inputs and outputs of later runs, shared by two programs, and the misuses.
#include <gtest/gtest.h>

#include <functional>

#include "backends/cpu/cpu_backend.h"
#include "compiler/graph_edit.h"
#include "compiler/memory_plan.h"
#include "npusim/op_registry.h"
#include "runtime/backend.h"
#include "unit/error_expectations.h"

namespace npusim {
namespace {

class Builder {
 public:
  Builder() { graph_.source = "state.json"; }

  ValueId input(const std::string& name, Shape shape, DType dtype = DType::Float32) {
    const ValueId id = compiler::add_value(graph_, name, {std::move(shape), dtype}, ValueKind::GraphInput);
    graph_.inputs.push_back(id);
    return id;
  }

  ValueId node(const std::string& op, const std::string& name, std::vector<ValueId> inputs, Attrs attrs = {}) {
    const OpDef* def = OpRegistry::instance().find(op);
    OpRegistry::instance().normalize_attrs(*def, nullptr, attrs, name);
    std::vector<TensorMeta> metas;
    for (ValueId id : inputs) metas.push_back(graph_.value(id).meta);
    Node node = compiler::make_node(graph_, op, name, attrs, std::move(inputs), def->infer(attrs, metas), {name});
    const ValueId out = node.outputs[0];
    graph_.nodes.push_back(std::move(node));
    compiler::renumber_producers(graph_);
    return out;
  }

  Graph finish(std::vector<ValueId> outputs) {
    graph_.outputs = std::move(outputs);
    return graph_;
  }

 private:
  Graph graph_;
};

Attrs attrs_of(std::initializer_list<std::pair<const char*, AttrValue>> values) {
  Attrs attrs;
  for (const auto& [key, value] : values) attrs.set(key, value);
  return attrs;
}

// cache [4, 2] <- row [1, 2] at position; outputs: 2 * updated cache, then the updated cache.
// With `cache_read_twice`, the doubling reads the old cache instead, so the cache cannot be updated in place.
Program cache_program(DType storage = DType::Float32, bool cache_read_twice = false) {
  Builder b;
  const ValueId cache = b.input("cache", {4, 2});
  const ValueId position = b.input("position", {1}, DType::Int64);
  const ValueId row = b.input("row", {1, 2});
  const ValueId updated = b.node("index_copy", "cache_out", {cache, position, row}, attrs_of({{"dim", int64_t{0}}}));
  const ValueId doubled = b.node("mul", "doubled", {cache_read_twice ? cache : updated}, attrs_of({{"other", 2.0}}));
  Program program;
  program.compute_dtype = storage;
  program.graph = b.finish({doubled, updated});
  program.plan = compiler::plan_memory(program.graph, storage);
  return program;
}

Tensor floats(Shape shape, std::vector<float> values) {
  Tensor t(DType::Float32, std::move(shape));
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

Tensor position(int64_t value) {
  Tensor t(DType::Int64, {1});
  t.mutable_data<int64_t>()[0] = value;
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  const Tensor f = t.to(DType::Float32);
  return {f.data<float>(), f.data<float>() + f.numel()};
}

using npusim::test::expect_error;

const std::vector<std::pair<std::string, std::string>> kPairs = {{"cache", "cache_out"}};

TEST(BackendState, UpdatesTheCacheInPlaceAcrossRuns) {
  for (DType storage : {DType::Float32, DType::BFloat16}) {
    cpu::CpuBackend backend({.threads = 2, .poison_memory = true});
    auto prepared = backend.prepare(cache_program(storage), {});
    const int64_t before = prepared->allocated_bytes();
    prepared->bind_state(kPairs);
    EXPECT_EQ(values_of(prepared->read_state("cache")), std::vector<float>(8, 0.0f)) << "state starts as zeros";

    NamedTensors out = prepared->run({{"position", position(1)}, {"row", floats({1, 2}, {3, 4})}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].first, "doubled");
    EXPECT_EQ(values_of(out[0].second), (std::vector<float>{0, 0, 6, 8, 0, 0, 0, 0}));
    out = prepared->run({{"position", position(3)}, {"row", floats({1, 2}, {-1, 0.5f})}});
    EXPECT_EQ(values_of(out[0].second), (std::vector<float>{0, 0, 6, 8, 0, 0, -2, 1}));
    EXPECT_EQ(values_of(prepared->read_state("cache")), (std::vector<float>{0, 0, 3, 4, 0, 0, -1, 0.5f}));

    // Given as an input, the state is replaced first.
    out = prepared->run({{"cache", floats({4, 2}, {1, 1, 1, 1, 1, 1, 1, 1})},
                         {"position", position(0)},
                         {"row", floats({1, 2}, {5, 5})}});
    EXPECT_EQ(values_of(prepared->read_state("cache")), (std::vector<float>{5, 5, 1, 1, 1, 1, 1, 1}));
    prepared->write_state("cache", floats({4, 2}, {8, 7, 6, 5, 4, 3, 2, 1}));
    EXPECT_EQ(values_of(prepared->read_state("cache")), (std::vector<float>{8, 7, 6, 5, 4, 3, 2, 1}));
    // The input's and the output's own buffers are given back: the state is one buffer.
    EXPECT_LE(prepared->allocated_bytes(), before);
  }
}

TEST(BackendState, StateBoundAtPrepareAllocatesNoOtherBuffersForIt) {
  cpu::CpuBackend backend;
  auto plain = backend.prepare(cache_program(), {});
  auto bound = backend.prepare_with_state(cache_program(), {}, kPairs);
  auto shared = backend.prepare_with_state(cache_program(), {}, kPairs, bound.get());
  // The plain program holds the cache input and output apart; the bound one holds the state once; the one that
  // shares it holds none of it.
  EXPECT_EQ(plain->allocated_bytes() - bound->allocated_bytes(), 4 * 2 * 4);
  EXPECT_EQ(bound->allocated_bytes() - shared->allocated_bytes(), 4 * 2 * 4);
  bound->run({{"position", position(1)}, {"row", floats({1, 2}, {3, 4})}});
  shared->run({{"position", position(2)}, {"row", floats({1, 2}, {5, 6})}});
  EXPECT_EQ(values_of(bound->read_state("cache")), (std::vector<float>{0, 0, 3, 4, 5, 6, 0, 0}));
  expect_error([&] { backend.prepare_with_state(cache_program(DType::Float32, true), {}, kPairs); },
               {"node 'doubled' reads the input too"});
}

TEST(BackendState, TwoProgramsShareOneState) {
  cpu::CpuBackend backend;
  auto writer = backend.prepare(cache_program(), {});
  auto reader = backend.prepare(cache_program(), {});
  writer->bind_state(kPairs);
  reader->bind_state(kPairs, writer.get());
  writer->run({{"position", position(2)}, {"row", floats({1, 2}, {7, 8})}});
  reader->run({{"position", position(0)}, {"row", floats({1, 2}, {1, 2})}});
  const std::vector<float> expected{1, 2, 0, 0, 7, 8, 0, 0};
  EXPECT_EQ(values_of(writer->read_state("cache")), expected);
  EXPECT_EQ(values_of(reader->read_state("cache")), expected);
}

TEST(BackendState, MisusesAreClearErrors) {
  cpu::CpuBackend backend;
  auto prepared = backend.prepare(cache_program(), {});
  expect_error([&] { prepared->bind_state({{"cash", "cache_out"}}); }, {"no graph input named 'cash'"});
  expect_error([&] { prepared->bind_state({{"cache", "cache_in"}}); }, {"no graph output named 'cache_in'"});
  expect_error([&] { prepared->bind_state({{"cache", "doubled"}}); }, {"'cache' -> 'doubled'"});
  expect_error([&] { prepared->bind_state({{"row", "cache_out"}}); }, {"differ in shape"});
  expect_error([&] { prepared->read_state("cache"); }, {"no state is kept for input 'cache'"});
  expect_error([&] { prepared->write_state("cache", floats({4, 2}, {})); }, {"no state is kept for input 'cache'"});

  auto twice = backend.prepare(cache_program(DType::Float32, true), {});
  expect_error([&] { twice->bind_state(kPairs); }, {"node 'doubled' reads the input too"});

  prepared->bind_state(kPairs);
  expect_error([&] { prepared->bind_state(kPairs); }, {"already state"});
  expect_error([&] { prepared->run({{"position", position(0)}}); }, {"missing input 'row'"});
  expect_error(
      [&] {
        prepared->run({{"position", position(0)}, {"row", floats({1, 2}, {1, 2})}, {"x", position(0)}});
      },
      {"no graph input named 'x'"});
  expect_error(
      [&] {
        prepared->run({{"position", position(0)}, {"row", floats({2, 1}, {1, 2})}});
      },
      {"input 'row' has shape [2, 1]"});
  expect_error([&] { prepared->write_state("cache", floats({2, 4}, {})); }, {"state 'cache' is [4, 2]"});
}

}  // namespace
}  // namespace npusim
