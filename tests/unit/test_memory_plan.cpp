#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "compiler/graph_edit.h"
#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "ir/torch_ir_reader.h"
#include "npusim/error.h"

using namespace npusim;
using namespace npusim::compiler;

namespace {

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

constexpr DType F32 = DType::Float32;

// Builds small graphs node by node; the planner reads only ops, edges and metas.
struct GraphBuilder {
  Graph graph;

  GraphBuilder() { graph.source = "test"; }

  ValueId input(const std::string& name, Shape shape, DType dtype = F32) {
    const ValueId id = add_value(graph, name, {std::move(shape), dtype}, ValueKind::GraphInput);
    graph.inputs.push_back(id);
    return id;
  }
  ValueId weight(const std::string& name, Shape shape) {
    const ValueId id = add_value(graph, name, {std::move(shape), F32}, ValueKind::Weight);
    graph.value(id).weight_key = name;
    graph.weights.push_back(id);
    return id;
  }
  ValueId node(const std::string& op, std::vector<ValueId> inputs, Shape shape, DType dtype = F32) {
    const std::string name = op + "_" + std::to_string(graph.nodes.size());
    Node node = make_node(graph, op, name, Attrs{}, std::move(inputs), {{std::move(shape), dtype}}, {name});
    const ValueId output = node.outputs[0];
    insert_node(graph, graph.nodes.size(), std::move(node));
    return output;
  }
  void output(ValueId id) { graph.outputs.push_back(id); }
};

// The value whose buffer `id` uses.
ValueId root_of(const MemoryPlan& plan, ValueId id) {
  const BufferAssignment& buffer = plan.values[static_cast<size_t>(id)];
  return buffer.placement == Placement::View ? buffer.alias_of : id;
}

bool memory_overlaps(const BufferAssignment& a, const BufferAssignment& b) {
  return a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// Brute force, independent of the planner's bookkeeping: every pair of arena buffers that are live at the same
// time occupies disjoint bytes. Lifetimes are counted in half steps: a value lives from its producer to the
// last node reading it or any view of it; an in-place output starts just after its node has read its inputs.
void expect_valid_plan(const Graph& graph, const MemoryPlan& plan, DType storage) {
  const size_t count = graph.values.size();
  ASSERT_EQ(plan.values.size(), count);
  std::vector<int64_t> start(count, -1), end(count, -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    for (ValueId id : node.outputs) {
      const BufferAssignment& buffer = plan.values[static_cast<size_t>(id)];
      start[static_cast<size_t>(id)] = 2 * static_cast<int64_t>(n) + (buffer.in_place ? 1 : 0);
      end[static_cast<size_t>(id)] = std::max(end[static_cast<size_t>(id)], 2 * static_cast<int64_t>(n));
      if (buffer.placement == Placement::View) {
        EXPECT_TRUE(is_view_op(node.op)) << graph.value(id).name;
        EXPECT_EQ(root_of(plan, node.inputs[0]), buffer.alias_of) << graph.value(id).name;
      }
    }
    for (ValueId id : node.inputs) {
      const auto root = static_cast<size_t>(root_of(plan, id));
      end[root] = std::max(end[root], 2 * static_cast<int64_t>(n));
    }
  }
  std::vector<size_t> arena;
  for (size_t i = 0; i < count; ++i) {
    const Value& value = graph.values[i];
    const BufferAssignment& buffer = plan.values[i];
    EXPECT_EQ(buffer.bytes, storage_bytes(value.meta, storage)) << value.name;
    if (value.kind == ValueKind::Weight) {
      EXPECT_EQ(buffer.placement, Placement::None) << value.name;
    }
    if (value.kind == ValueKind::GraphInput) {
      EXPECT_EQ(buffer.placement, Placement::Persistent) << value.name;
    }
    if (buffer.placement == Placement::View) {
      const BufferAssignment& root = plan.values[static_cast<size_t>(buffer.alias_of)];
      EXPECT_NE(root.placement, Placement::View) << value.name;
      EXPECT_EQ(root.bytes, buffer.bytes) << value.name;
      if (root.placement != Placement::None) {
        EXPECT_EQ(root.offset, buffer.offset) << value.name;
      }
    }
    if (buffer.placement == Placement::Arena) {
      EXPECT_EQ(buffer.offset % plan.alignment, 0) << value.name;
      EXPECT_LE(buffer.offset + buffer.bytes, plan.arena_bytes) << value.name;
      EXPECT_GE(start[i], 0) << value.name << " is in the arena but nothing produces it";
      arena.push_back(i);
    }
  }
  for (ValueId id : graph.outputs) {
    if (graph.value(id).kind == ValueKind::NodeOutput) {
      EXPECT_EQ(plan.values[static_cast<size_t>(id)].placement, Placement::Persistent) << graph.value(id).name;
    }
  }

  for (size_t a = 0; a < arena.size(); ++a)
    for (size_t b = a + 1; b < arena.size(); ++b) {
      const size_t i = arena[a], j = arena[b];
      const bool live_together = start[i] <= end[j] && start[j] <= end[i];
      if (live_together && memory_overlaps(plan.values[i], plan.values[j]))
        ADD_FAILURE() << graph.values[i].name << " and " << graph.values[j].name << " overlap in time and memory";
    }

  // An in-place output may only cover buffers its own node reads, element for element.
  for (size_t i : arena) {
    if (!plan.values[i].in_place) continue;
    const Node& node = graph.nodes[static_cast<size_t>(start[i] / 2)];
    for (size_t j : arena) {
      if (j == i || end[j] != start[i] - 1 || !memory_overlaps(plan.values[i], plan.values[j])) continue;
      bool read = false, read_elementwise = true;
      for (ValueId id : node.inputs) {
        if (static_cast<size_t>(root_of(plan, id)) != j) continue;
        read = true;
        read_elementwise = read_elementwise && graph.value(id).meta.shape == graph.values[i].meta.shape;
      }
      EXPECT_TRUE(read && read_elementwise && plan.values[i].offset == plan.values[j].offset &&
                  plan.values[i].bytes == plan.values[j].bytes)
          << graph.values[i].name << " is written in place over " << graph.values[j].name;
    }
  }
}

Graph compiled_fixture(const std::string& path) {
  Graph graph = read_torch_ir(kFixtures + "/" + path);
  PassContext context;
  run_passes(graph, PassOptions{}, context);
  return graph;
}

int count_in_place(const MemoryPlan& plan) {
  return static_cast<int>(std::count_if(plan.values.begin(), plan.values.end(),
                                        [](const BufferAssignment& buffer) { return buffer.in_place; }));
}

}  // namespace

TEST(MemoryPlan, ReusesTheBufferOfADeadValue) {
  // x -> a -> b -> c -> out, 16 floats each: a dies when c is born, so c takes a's place.
  GraphBuilder g;
  const ValueId x = g.input("x", {4, 4});
  const ValueId w = g.weight("w", {4, 4});
  const ValueId a = g.node("mm", {x, w}, {4, 4});
  const ValueId b = g.node("mm", {a, w}, {4, 4});
  const ValueId c = g.node("mm", {b, w}, {4, 4});
  const ValueId out = g.node("mm", {c, w}, {4, 4});
  g.output(out);
  const MemoryPlan plan = plan_memory(g.graph, F32);
  expect_valid_plan(g.graph, plan, F32);
  EXPECT_EQ(plan.values[a].placement, Placement::Arena);
  EXPECT_EQ(plan.values[a].offset, 0);
  EXPECT_EQ(plan.values[b].offset, 64);
  EXPECT_EQ(plan.values[c].offset, 0);
  EXPECT_EQ(plan.arena_bytes, 128);
  EXPECT_EQ(plan.unplanned_bytes, 4 * 64);
  EXPECT_EQ(plan.persistent_bytes, 2 * 64);
  EXPECT_EQ(plan.values[x].placement, Placement::Persistent);
  EXPECT_EQ(plan.values[out].placement, Placement::Persistent);
  EXPECT_EQ(plan.values[w].placement, Placement::None);
  EXPECT_EQ(count_in_place(plan), 0);  // mm is never in place
}

TEST(MemoryPlan, AlignsEveryOffset) {
  // 3 floats = 12 bytes each; with alignment 16 every block takes 16.
  GraphBuilder g;
  const ValueId x = g.input("x", {3});
  const ValueId a = g.node("exp", {x}, {3});
  const ValueId b = g.node("exp", {a}, {3});
  const ValueId c = g.node("add", {a, b}, {3});
  g.output(g.node("exp", {c}, {3}));
  const MemoryPlan plan = plan_memory(g.graph, F32, 16);
  expect_valid_plan(g.graph, plan, F32);
  EXPECT_EQ(plan.values[a].bytes, 12);
  EXPECT_EQ(plan.arena_bytes, 32);  // a and b live together; c overwrites a in place
  EXPECT_TRUE(plan.values[c].in_place);
  EXPECT_EQ(plan.values[c].offset, plan.values[a].offset);
  EXPECT_THROW(plan_memory(g.graph, F32, 48), Error);
  EXPECT_THROW(plan_memory(g.graph, F32, 0), Error);
}

TEST(MemoryPlan, StorageBytesFollowTheStorageDtypeForFloatsOnly) {
  GraphBuilder g;
  const ValueId ids = g.input("ids", {2, 5}, DType::Int64);
  const ValueId x = g.input("x", {2, 5}, DType::Float32);
  const ValueId mask = g.node("eq", {ids, ids}, {2, 5}, DType::Bool);
  const ValueId doubled = g.node("add", {ids, ids}, {2, 5}, DType::Int64);
  const ValueId y = g.node("exp", {x}, {2, 5}, DType::Float32);
  const ValueId z = g.node("masked_fill", {y, mask}, {2, 5}, DType::Float32);
  g.output(doubled);
  g.output(z);
  const MemoryPlan plan = plan_memory(g.graph, DType::BFloat16);
  expect_valid_plan(g.graph, plan, DType::BFloat16);
  EXPECT_EQ(plan.values[ids].bytes, 80);
  EXPECT_EQ(plan.values[x].bytes, 20);
  EXPECT_EQ(plan.values[mask].bytes, 10);
  EXPECT_EQ(plan.values[doubled].bytes, 80);
  EXPECT_EQ(plan.values[y].bytes, 20);
  EXPECT_EQ(plan.unplanned_bytes, 10 + 80 + 20 + 20);
  EXPECT_EQ(plan.persistent_bytes, 80 + 20 + 80 + 20);
  EXPECT_EQ(storage_bytes({{3, 0}, F32}, F32), 0);
  EXPECT_EQ(storage_bytes({{}, DType::Int64}, DType::Float16), 8);
}

TEST(MemoryPlan, ViewsShareTheirRootBufferAndExtendItsLifetime) {
  GraphBuilder g;
  const ValueId x = g.input("x", {4, 4});
  const ValueId w = g.weight("w", {4, 4});
  const ValueId a = g.node("mm", {x, w}, {4, 4});
  const ValueId flat = g.node("reshape", {a}, {16});
  const ValueId b = g.node("mm", {x, w}, {4, 4});  // a is still read (through a view) after this
  const ValueId row = g.node("unsqueeze", {flat}, {1, 16});
  const ValueId b_row = g.node("reshape", {b}, {1, 16});
  const ValueId sum = g.node("add", {b_row, row}, {1, 16});
  const ValueId x_flat = g.node("flatten", {x}, {16});
  const ValueId w_flat = g.node("reshape", {w}, {16});
  const ValueId out = g.node("mul", {x_flat, w_flat}, {16});
  const ValueId out_view = g.node("reshape", {sum}, {4, 4});  // a graph output: its own buffer
  g.output(out);
  g.output(out_view);
  const MemoryPlan plan = plan_memory(g.graph, F32);
  expect_valid_plan(g.graph, plan, F32);

  for (ValueId view : {flat, row}) {
    EXPECT_EQ(plan.values[view].placement, Placement::View);
    EXPECT_EQ(plan.values[view].alias_of, a);  // resolved to the root, not the intermediate view
    EXPECT_EQ(plan.values[view].offset, plan.values[a].offset);
  }
  EXPECT_NE(plan.values[a].offset, plan.values[b].offset);
  EXPECT_EQ(plan.values[b_row].alias_of, b);
  // The add overwrites b (through its view) in place: b is dead after it.
  EXPECT_TRUE(plan.values[sum].in_place);
  EXPECT_EQ(plan.values[sum].offset, plan.values[b].offset);
  EXPECT_EQ(plan.values[x_flat].placement, Placement::View);
  EXPECT_EQ(plan.values[x_flat].alias_of, x);
  EXPECT_EQ(plan.values[x_flat].offset, plan.values[x].offset);
  EXPECT_EQ(plan.values[w_flat].placement, Placement::View);
  EXPECT_EQ(plan.values[w_flat].alias_of, w);
  EXPECT_EQ(plan.values[out_view].placement, Placement::Persistent);
  EXPECT_EQ(plan.values[out_view].alias_of, kNoValue);
  EXPECT_EQ(plan.arena_bytes, 128);
}

TEST(MemoryPlan, InPlaceOnlyWhereLegal) {
  GraphBuilder g;
  const ValueId x = g.input("x", {4, 4});
  const ValueId w = g.weight("w", {4, 4});
  const ValueId bias = g.weight("bias", {4, 1});
  const ValueId a = g.node("mm", {x, w}, {4, 4});
  const ValueId relu_a = g.node("relu", {a}, {4, 4});      // a is read again below: not in place
  const ValueId sum = g.node("add", {relu_a, a}, {4, 4});  // last use of relu_a and a: in place on input 0
  const ValueId relu_x = g.node("relu", {x}, {4, 4});      // graph input: never overwritten
  const ValueId column = g.node("mm", {relu_x, bias}, {4, 1});
  const ValueId broadcast = g.node("add", {column, sum}, {4, 4});                  // input 0 is smaller than the output
  const ValueId mask = g.node("eq", {broadcast, broadcast}, {4, 4}, DType::Bool);  // bool output: other size
  const ValueId product = g.node("mm", {broadcast, w}, {4, 4});                    // not elementwise
  const ValueId flat = g.node("reshape", {product}, {16});
  const ValueId mixed = g.node("add", {product, flat}, {4, 4});  // same buffer read through another shape
  const ValueId masked = g.node("masked_fill", {mixed, mask}, {4, 4});
  const ValueId out = g.node("relu", {masked}, {4, 4});  // a graph output
  g.output(out);
  const MemoryPlan plan = plan_memory(g.graph, F32);
  expect_valid_plan(g.graph, plan, F32);

  EXPECT_FALSE(plan.values[relu_a].in_place);
  EXPECT_TRUE(plan.values[sum].in_place);
  EXPECT_EQ(plan.values[sum].offset, plan.values[relu_a].offset);
  EXPECT_FALSE(plan.values[relu_x].in_place);
  EXPECT_FALSE(plan.values[broadcast].in_place);
  EXPECT_FALSE(plan.values[mask].in_place);
  EXPECT_FALSE(plan.values[product].in_place);
  EXPECT_FALSE(plan.values[mixed].in_place);
  EXPECT_TRUE(plan.values[masked].in_place);
  EXPECT_EQ(plan.values[masked].offset, plan.values[mixed].offset);
  EXPECT_FALSE(plan.values[out].in_place);
  EXPECT_EQ(plan.values[out].placement, Placement::Persistent);
  EXPECT_EQ(count_in_place(plan), 2);
}

TEST(MemoryPlan, InPlaceChainsShareOneBuffer) {
  GraphBuilder g;
  const ValueId x = g.input("x", {8});
  const ValueId a = g.node("exp", {x}, {8});
  const ValueId b = g.node("neg", {a}, {8});
  const ValueId c = g.node("sigmoid", {b}, {8});
  const ValueId d = g.node("mul", {c, c}, {8});
  g.output(g.node("exp", {d}, {8}));
  const MemoryPlan plan = plan_memory(g.graph, F32);
  expect_valid_plan(g.graph, plan, F32);
  for (ValueId id : {b, c, d}) {
    EXPECT_TRUE(plan.values[id].in_place);
    EXPECT_EQ(plan.values[id].offset, plan.values[a].offset);
  }
  EXPECT_EQ(plan.arena_bytes, 64);
}

TEST(MemoryPlan, UnreadValuesStillGetABufferDuringTheirNode) {
  GraphBuilder g;
  const ValueId x = g.input("x", {4, 4});
  const ValueId w = g.weight("w", {4, 4});
  const ValueId unused = g.node("mm", {x, w}, {4, 4});
  const ValueId out = g.node("mm", {x, w}, {4, 4});
  g.output(out);
  // A value a pass left behind: no node produces it any more.
  const ValueId orphan = add_value(g.graph, "orphan", {{4, 4}, F32}, ValueKind::NodeOutput);
  const MemoryPlan plan = plan_memory(g.graph, F32);
  expect_valid_plan(g.graph, plan, F32);
  EXPECT_EQ(plan.values[unused].placement, Placement::Arena);
  EXPECT_EQ(plan.values[unused].bytes, 64);
  EXPECT_EQ(plan.arena_bytes, 64);
  EXPECT_EQ(plan.values[orphan].placement, Placement::None);
  EXPECT_EQ(plan.unplanned_bytes, 128);
}

TEST(MemoryPlan, EmptyGraph) {
  const MemoryPlan plan = plan_memory(Graph{}, F32);
  EXPECT_TRUE(plan.values.empty());
  EXPECT_EQ(plan.arena_bytes, 0);
  EXPECT_EQ(plan.unplanned_bytes, 0);
}

TEST(MemoryPlan, ResNet50ReusesMemory) {
  const Graph graph = compiled_fixture("ir/resnet50_ir.json");
  const MemoryPlan plan = plan_memory(graph, F32);
  expect_valid_plan(graph, plan, F32);
  EXPECT_LT(plan.arena_bytes * 4, plan.unplanned_bytes) << plan.arena_bytes << " vs " << plan.unplanned_bytes;
  EXPECT_GT(count_in_place(plan), 0);
  // The input [1, 3, 224, 224] and the logits [1, 1000].
  EXPECT_EQ(plan.persistent_bytes, (3 * 224 * 224 + 1000) * 4);
}

TEST(MemoryPlan, ResNet18InHalfPrecision) {
  const Graph graph = compiled_fixture("ir/resnet18_ir.json");
  const MemoryPlan plan = plan_memory(graph, DType::Float16);
  expect_valid_plan(graph, plan, DType::Float16);
  EXPECT_LT(plan.arena_bytes, plan.unplanned_bytes);
}

TEST(MemoryPlan, QwenTinyPrefillAndDecode) {
  for (const char* path : {"qwen_tiny/prefill_ir.json", "qwen_tiny/decode_ir.json"}) {
    SCOPED_TRACE(path);
    const Graph graph = compiled_fixture(path);
    const MemoryPlan plan = plan_memory(graph, F32);
    expect_valid_plan(graph, plan, F32);
    EXPECT_LT(plan.arena_bytes, plan.unplanned_bytes);
    int views = 0;
    for (const BufferAssignment& buffer : plan.values) views += buffer.placement == Placement::View;
    EXPECT_GT(views, 0);
  }
}

TEST(MemoryPlan, Qwen15PrefillInBFloat16) {
  const Graph graph = compiled_fixture("ir/qwen15_prefill_ir.json");
  const MemoryPlan plan = plan_memory(graph, DType::BFloat16);
  expect_valid_plan(graph, plan, DType::BFloat16);
  EXPECT_LT(plan.arena_bytes * 4, plan.unplanned_bytes);
}
