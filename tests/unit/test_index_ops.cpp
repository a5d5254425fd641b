#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"

using namespace npusim;

namespace {

using AttrList = std::vector<std::pair<std::string, AttrValue>>;

struct OpResult {
  std::vector<TensorMeta> metas;
  std::vector<Tensor> outputs;
};

// Runs one ATen spelling the way the compiler does: normalize attrs, infer, then run the reference.
OpResult run_op(const std::string& op_type, const std::vector<Tensor>& inputs, const AttrList& attr_values = {}) {
  const OpRegistry& registry = OpRegistry::instance();
  const auto [def, spelling] = registry.find_spelling(op_type);
  if (!def) fail("no op registered for " + op_type);
  Attrs attrs(op_type);
  for (const auto& [name, value] : attr_values) attrs.set(name, value);
  registry.normalize_attrs(*def, spelling, attrs, op_type);
  const int count = static_cast<int>(inputs.size());
  if (count < def->min_inputs || (def->max_inputs >= 0 && count > def->max_inputs))
    fail(op_type + ": wrong number of inputs");
  std::vector<TensorMeta> metas;
  std::vector<Tensor> reference_inputs;
  for (const Tensor& t : inputs) {
    metas.push_back({t.shape(), t.dtype()});
    reference_inputs.push_back(t.to_reference());
  }
  OpResult result;
  result.metas = def->infer(attrs, metas);
  result.outputs = def->reference(attrs, reference_inputs, result.metas);
  EXPECT_EQ(result.outputs.size(), result.metas.size());
  for (size_t i = 0; i < std::min(result.outputs.size(), result.metas.size()); ++i) {
    EXPECT_EQ(result.outputs[i].shape(), result.metas[i].shape) << op_type << " output " << i;
    EXPECT_EQ(result.outputs[i].dtype(), reference_dtype(result.metas[i].dtype)) << op_type << " output " << i;
  }
  return result;
}

Tensor f32(Shape shape, const std::vector<float>& values) {
  Tensor t(DType::Float32, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

Tensor i64(Shape shape, const std::vector<int64_t>& values) {
  Tensor t(DType::Int64, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.mutable_data<int64_t>());
  return t;
}

Tensor boolean(Shape shape, const std::vector<uint8_t>& values) {
  Tensor t(DType::Bool, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.mutable_data<uint8_t>());
  return t;
}

// 0, 1, 2, ... in row-major order.
Tensor iota_f32(Shape shape) {
  Tensor t(DType::Float32, std::move(shape));
  std::iota(t.mutable_data<float>(), t.mutable_data<float>() + t.numel(), 0.0f);
  return t;
}

Tensor iota_i64(Shape shape) {
  Tensor t(DType::Int64, std::move(shape));
  std::iota(t.mutable_data<int64_t>(), t.mutable_data<int64_t>() + t.numel(), int64_t{0});
  return t;
}

std::vector<float> floats(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Float32);
  return {t.data<float>(), t.data<float>() + t.numel()};
}

std::vector<int64_t> ints(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Int64);
  return {t.data<int64_t>(), t.data<int64_t>() + t.numel()};
}

std::vector<uint8_t> bools(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Bool);
  return {t.data<uint8_t>(), t.data<uint8_t>() + t.numel()};
}

std::vector<float> iota_values(int n) {
  std::vector<float> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), 0.0f);
  return values;
}

AttrValue ints_attr(std::vector<int64_t> values) { return values; }

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// ---------------------------------------------------------------------------------------------------------------

AttrValue none_mask(std::vector<bool> slots) { return slots; }

TEST(Index, AttentionMaskLookupAsInTheQwenPrefillGraph) {
  // index(attention_mask.to(bool) [1,16], [batch_arange [1,1,1,1], kv_arange [1,1,1,16]]) -> [1,1,1,16]
  std::vector<uint8_t> mask(16, 1);
  for (size_t k = 11; k < 16; ++k) mask[k] = 0;  // right padding
  std::vector<int64_t> kv(16);
  std::iota(kv.begin(), kv.end(), int64_t{0});
  const OpResult r =
      run_op("aten.index.Tensor", {boolean({1, 16}, mask), i64({1, 1, 1, 1}, {0}), i64({1, 1, 1, 16}, kv)},
             {{"_tensor_list_sizes", ints_attr({2})}});
  EXPECT_EQ(r.metas[0], (TensorMeta{{1, 1, 1, 16}, DType::Bool}));
  EXPECT_EQ(bools(r.outputs[0]), mask);
}

TEST(Index, NoneSlotKeepsTheLeadingDimension) {
  const OpResult r =
      run_op("aten.index.Tensor", {iota_i64({2, 3, 4}), i64({2}, {2, 0})},
             {{"_tensor_list_sizes", ints_attr({1})}, {"_tensor_list_none_masks", none_mask({true, false})}});
  EXPECT_EQ(r.metas[0], (TensorMeta{{2, 2, 4}, DType::Int64}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15}));
}

TEST(Index, AdjacentIndicesAfterANoneSlotStayInPlace) {
  const OpResult r = run_op("aten.index.Tensor", {iota_f32({2, 3, 4}), i64({2}, {0, 2}), i64({2}, {1, 3})},
                            {{"_tensor_list_none_masks", none_mask({true, false, false})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{1, 11, 13, 23}));  // x[a, i1[b], i2[b]]
}

TEST(Index, SeparatedIndicesMoveTheBroadcastDimsFirst) {
  const Tensor x = iota_i64({2, 3, 4});
  const AttrList attrs = {{"_tensor_list_sizes", ints_attr({2})},
                          {"_tensor_list_none_masks", none_mask({false, true, false})}};
  const OpResult r = run_op("aten.index.Tensor", {x, i64({2}, {1, 0}), i64({2}, {3, 1})}, attrs);
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{15, 19, 23, 1, 5, 9}));  // x[i0[b], j, i2[b]]
  const OpResult broadcast = run_op("aten.index.Tensor", {x, i64({2, 1}, {1, 0}), i64({2}, {3, 1})}, attrs);
  EXPECT_EQ(broadcast.metas[0].shape, (Shape{2, 2, 3}));
  EXPECT_EQ(ints(broadcast.outputs[0]), (std::vector<int64_t>{15, 19, 23, 13, 17, 21, 3, 7, 11, 1, 5, 9}));
}

TEST(Index, BroadcastIndicesAndNegativeValues) {
  const OpResult r = run_op("aten.index.Tensor", {iota_f32({2, 3}), i64({2, 1}, {0, 1}), i64({3}, {2, 0, -1})});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{2, 0, 2, 5, 3, 5}));
  const OpResult empty = run_op("aten.index.Tensor", {iota_f32({2, 3}), i64({0}, {})});
  EXPECT_EQ(empty.metas[0].shape, (Shape{0, 3}));
}

TEST(Index, RejectsMasksBadIndicesAndOutOfRangeValues) {
  const Tensor x = iota_f32({2, 3});
  EXPECT_THROW(run_op("aten.index.Tensor", {x, boolean({2}, {1, 0})}), Error);
  EXPECT_THROW(run_op("aten.index.Tensor", {x, f32({1}, {0})}), Error);
  EXPECT_THROW(run_op("aten.index.Tensor", {x, i64({1}, {2})}), Error);                          // row 2 of 2
  EXPECT_THROW(run_op("aten.index.Tensor", {x, i64({1}, {-3})}), Error);                         // wraps below zero
  EXPECT_THROW(run_op("aten.index.Tensor", {x, i64({2}, {0, 1}), i64({3}, {0, 1, 2})}), Error);  // no broadcast
  EXPECT_THROW(run_op("aten.index.Tensor", {x, i64({1}, {0}), i64({1}, {0}), i64({1}, {0})}), Error);  // rank 2
  EXPECT_THROW(run_op("aten.index.Tensor", {x, i64({1}, {0})}, {{"_tensor_list_sizes", ints_attr({2})}}), Error);
  EXPECT_THROW(run_op("aten.index.Tensor", {x, i64({1}, {0})}, {{"_tensor_list_none_masks", none_mask({true, true})}}),
               Error);
}

TEST(IndexPut, WritesAccumulatesAndBroadcastsValues) {
  const Tensor zeros = f32({3}, {0, 0, 0});
  EXPECT_EQ(floats(run_op("aten.index_put.default", {zeros, i64({2}, {0, -1}), f32({2}, {5, 6})}).outputs[0]),
            (std::vector<float>{5, 0, 6}));
  EXPECT_EQ(floats(run_op("aten.index_put.default", {zeros, i64({2}, {0, 0}), f32({2}, {1, 2})}, {{"accumulate", true}})
                       .outputs[0]),
            (std::vector<float>{3, 0, 0}));
  const OpResult rows = run_op("aten.index_put_.default", {iota_i64({3, 2}), i64({1}, {1}), i64({}, {-7})});
  EXPECT_EQ(ints(rows.outputs[0]), (std::vector<int64_t>{0, 1, -7, -7, 4, 5}));
  EXPECT_EQ(floats(zeros), (std::vector<float>{0, 0, 0}));  // out of place
  EXPECT_THROW(run_op("aten.index_put.default", {zeros, i64({2}, {0, 1}), f32({3}, {1, 2, 3})}), Error);
}

TEST(IndexSelect, RowsAndColumns) {
  const Tensor x = iota_f32({3, 2});
  const OpResult rows = run_op("aten.index_select.default", {x, i64({3}, {2, 0, 2})}, {{"dim", int64_t{0}}});
  EXPECT_EQ(rows.metas[0].shape, (Shape{3, 2}));
  EXPECT_EQ(floats(rows.outputs[0]), (std::vector<float>{4, 5, 0, 1, 4, 5}));
  const OpResult column =
      run_op("aten.index_select.default", {boolean({2, 2}, {1, 0, 0, 0}), i64({1}, {-2})}, {{"dim", int64_t{-1}}});
  EXPECT_EQ(column.metas[0], (TensorMeta{{2, 1}, DType::Bool}));
  EXPECT_EQ(bools(column.outputs[0]), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(run_op("aten.index_select.default", {x, i64({0}, {})}, {{"dim", int64_t{1}}}).metas[0].shape,
            (Shape{3, 0}));
  EXPECT_THROW(run_op("aten.index_select.default", {x, i64({1}, {3})}, {{"dim", int64_t{0}}}), Error);
  EXPECT_THROW(run_op("aten.index_select.default", {x, i64({1, 1}, {0})}, {{"dim", int64_t{0}}}), Error);
  EXPECT_THROW(run_op("aten.index_select.default", {x, i64({1}, {0})}), Error);  // dim is required
}

TEST(IndexCopy, WritesKvRowsAlongDimTwo) {
  // A static KV cache [1, 2 heads, 5 positions, 3] receiving two new positions (4 then 1).
  const Tensor cache = iota_f32({1, 2, 5, 3});
  Tensor source = iota_f32({1, 2, 2, 3});
  for (int i = 0; i < 12; ++i) source.mutable_data<float>()[i] += 100.0f;
  const OpResult r = run_op("aten.index_copy.default", {cache, i64({2}, {4, 1}), source}, {{"dim", int64_t{2}}});
  EXPECT_EQ(r.metas[0], (TensorMeta{{1, 2, 5, 3}, DType::Float32}));
  EXPECT_EQ(floats(r.outputs[0]),
            (std::vector<float>{0,  1,  2,  103, 104, 105, 6,  7,  8,  9,  10, 11, 100, 101, 102,
                                15, 16, 17, 109, 110, 111, 21, 22, 23, 24, 25, 26, 106, 107, 108}));
  EXPECT_EQ(floats(cache), iota_values(30));  // out of place
}

TEST(IndexCopy, InPlaceSpellingDefaultDimAndNegativeIndex) {
  const OpResult r = run_op("aten.index_copy_.default", {iota_i64({3, 2}), i64({1}, {-1}), i64({1, 2}, {7, 8})});
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 7, 8}));
  const OpResult b = run_op("aten.index_copy.default", {boolean({2}, {0, 0}), i64({}, {1}), boolean({1}, {1})});
  EXPECT_EQ(bools(b.outputs[0]), (std::vector<uint8_t>{0, 1}));
}

TEST(IndexCopy, RejectsMismatchedSourceAndBadIndex) {
  const Tensor cache = iota_f32({1, 2, 5, 3});
  EXPECT_THROW(run_op("aten.index_copy.default", {cache, i64({1}, {0}), iota_f32({1, 2, 2, 3})}, {{"dim", int64_t{2}}}),
               Error);
  EXPECT_THROW(run_op("aten.index_copy.default", {cache, i64({1}, {5}), iota_f32({1, 2, 1, 3})}, {{"dim", int64_t{2}}}),
               Error);
  EXPECT_THROW(run_op("aten.index_copy.default", {cache, f32({1}, {0}), iota_f32({1, 2, 1, 3})}, {{"dim", int64_t{2}}}),
               Error);
  EXPECT_THROW(run_op("aten.index_copy.default", {cache, i64({1}, {0}), iota_f32({1, 2, 1, 3})}, {{"dim", int64_t{4}}}),
               Error);
}

TEST(Gather, AlongTheLastDim) {
  const OpResult r =
      run_op("aten.gather.default", {iota_i64({2, 3}), i64({2, 2}, {0, 0, 2, 1})}, {{"dim", int64_t{-1}}});
  EXPECT_EQ(r.metas[0], (TensorMeta{{2, 2}, DType::Int64}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{0, 0, 5, 4}));
  EXPECT_THROW(run_op("aten.gather.default", {iota_i64({2, 3}), i64({2, 1}, {0, 3})}, {{"dim", int64_t{1}}}), Error);
  EXPECT_THROW(run_op("aten.gather.default", {iota_i64({2, 3}), i64({2}, {0, 1})}, {{"dim", int64_t{1}}}), Error);
  EXPECT_THROW(run_op("aten.gather.default", {iota_i64({2, 3}), i64({3, 1}, {0, 1, 2})}, {{"dim", int64_t{1}}}), Error);
}

TEST(Scatter, SrcValueAndAdd) {
  const Tensor zeros = f32({2, 3}, {0, 0, 0, 0, 0, 0});
  EXPECT_EQ(floats(run_op("aten.scatter.src", {zeros, i64({2, 1}, {2, 0}), f32({2, 1}, {1, 2})}, {{"dim", int64_t{1}}})
                       .outputs[0]),
            (std::vector<float>{0, 0, 1, 2, 0, 0}));
  EXPECT_EQ(
      floats(
          run_op("aten.scatter.value", {zeros, i64({1, 2}, {1, 0})}, {{"dim", int64_t{0}}, {"value", 9.5}}).outputs[0]),
      (std::vector<float>{0, 9.5f, 0, 9.5f, 0, 0}));
  EXPECT_EQ(floats(run_op("aten.scatter_add.default", {zeros, i64({2, 2}, {2, 2, 0, 1}), f32({2, 2}, {1, 2, 3, 4})},
                          {{"dim", int64_t{1}}})
                       .outputs[0]),
            (std::vector<float>{0, 0, 3, 3, 4, 0}));
  EXPECT_THROW(run_op("aten.scatter.value", {zeros, i64({2, 1}, {0, 0})}, {{"dim", int64_t{1}}}), Error);  // no value
  EXPECT_THROW(run_op("aten.scatter.src", {zeros, i64({2, 1}, {3, 0}), f32({2, 1}, {1, 2})}, {{"dim", int64_t{1}}}),
               Error);
}

}  // namespace
