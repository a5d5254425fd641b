#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

// ---------------------------------------------------------------------------------------------------------------

AttrValue none_mask(std::vector<bool> slots) { return slots; }

TEST(Index, AttentionMaskLookupAsInTheQwenPrefillGraph) {
  // index(attention_mask.to(bool) [1,16], [batch_arange [1,1,1,1], kv_arange [1,1,1,16]]) -> [1,1,1,16]
  std::vector<uint8_t> mask(16, 1);
  for (size_t k = 11; k < 16; ++k) mask[k] = 0;  // right padding
  std::vector<int64_t> kv(16);
  std::iota(kv.begin(), kv.end(), int64_t{0});
  const OpRun r = run_op("aten.index.Tensor", {bools({1, 16}, mask), ints({1, 1, 1, 1}, {0}), ints({1, 1, 1, 16}, kv)},
                         make_attrs({{"_tensor_list_sizes", ints_attr({2})}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{1, 1, 1, 16}, DType::Bool}));
  EXPECT_EQ(bool_values(r.outputs[0]), mask);
}

TEST(Index, NoneSlotKeepsTheLeadingDimension) {
  const OpRun r = run_op(
      "aten.index.Tensor", {iota({2, 3, 4}, DType::Int64), ints({2}, {2, 0})},
      make_attrs({{"_tensor_list_sizes", ints_attr({1})}, {"_tensor_list_none_masks", none_mask({true, false})}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{2, 2, 4}, DType::Int64}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15}));
}

TEST(Index, AdjacentIndicesAfterANoneSlotStayInPlace) {
  const OpRun r = run_op("aten.index.Tensor", {iota({2, 3, 4}), ints({2}, {0, 2}), ints({2}, {1, 3})},
                         make_attrs({{"_tensor_list_none_masks", none_mask({true, false, false})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{1, 11, 13, 23}));  // x[a, i1[b], i2[b]]
}

TEST(Index, SeparatedIndicesMoveTheBroadcastDimsFirst) {
  const Tensor x = iota({2, 3, 4}, DType::Int64);
  const AttrList attrs = {{"_tensor_list_sizes", ints_attr({2})},
                          {"_tensor_list_none_masks", none_mask({false, true, false})}};
  const OpRun r = run_op("aten.index.Tensor", {x, ints({2}, {1, 0}), ints({2}, {3, 1})}, make_attrs(attrs));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{15, 19, 23, 1, 5, 9}));  // x[i0[b], j, i2[b]]
  const OpRun broadcast = run_op("aten.index.Tensor", {x, ints({2, 1}, {1, 0}), ints({2}, {3, 1})}, make_attrs(attrs));
  EXPECT_EQ(broadcast.metas[0].shape, (Shape{2, 2, 3}));
  EXPECT_EQ(int_values(broadcast.outputs[0]), (std::vector<int64_t>{15, 19, 23, 13, 17, 21, 3, 7, 11, 1, 5, 9}));
}

TEST(Index, BroadcastIndicesAndNegativeValues) {
  const OpRun r = run_op("aten.index.Tensor", {iota({2, 3}), ints({2, 1}, {0, 1}), ints({3}, {2, 0, -1})});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{2, 0, 2, 5, 3, 5}));
  const OpRun empty = run_op("aten.index.Tensor", {iota({2, 3}), ints({0}, {})});
  EXPECT_EQ(empty.metas[0].shape, (Shape{0, 3}));
}

TEST(Index, RejectsMasksBadIndicesAndOutOfRangeValues) {
  const Tensor x = iota({2, 3});
  EXPECT_THROW(run_op("aten.index.Tensor", {x, bools({2}, {1, 0})}), Error);
  EXPECT_THROW(run_op("aten.index.Tensor", {x, floats({1}, {0})}), Error);
  EXPECT_THROW(run_op("aten.index.Tensor", {x, ints({1}, {2})}), Error);                           // row 2 of 2
  EXPECT_THROW(run_op("aten.index.Tensor", {x, ints({1}, {-3})}), Error);                          // wraps below zero
  EXPECT_THROW(run_op("aten.index.Tensor", {x, ints({2}, {0, 1}), ints({3}, {0, 1, 2})}), Error);  // no broadcast
  EXPECT_THROW(run_op("aten.index.Tensor", {x, ints({1}, {0}), ints({1}, {0}), ints({1}, {0})}), Error);  // rank 2
  EXPECT_THROW(run_op("aten.index.Tensor", {x, ints({1}, {0})}, make_attrs({{"_tensor_list_sizes", ints_attr({2})}})),
               Error);
  EXPECT_THROW(run_op("aten.index.Tensor", {x, ints({1}, {0})},
                      make_attrs({{"_tensor_list_none_masks", none_mask({true, true})}})),
               Error);
}

TEST(IndexPut, WritesAccumulatesAndBroadcastsValues) {
  const Tensor zeros = floats({3}, {0, 0, 0});
  EXPECT_EQ(float_values(run_op("aten.index_put.default", {zeros, ints({2}, {0, -1}), floats({2}, {5, 6})}).outputs[0]),
            (std::vector<float>{5, 0, 6}));
  EXPECT_EQ(float_values(run_op("aten.index_put.default", {zeros, ints({2}, {0, 0}), floats({2}, {1, 2})},
                                make_attrs({{"accumulate", true}}))
                             .outputs[0]),
            (std::vector<float>{3, 0, 0}));
  const OpRun rows = run_op("aten.index_put_.default", {iota({3, 2}, DType::Int64), ints({1}, {1}), ints({}, {-7})});
  EXPECT_EQ(int_values(rows.outputs[0]), (std::vector<int64_t>{0, 1, -7, -7, 4, 5}));
  EXPECT_EQ(float_values(zeros), (std::vector<float>{0, 0, 0}));  // out of place
  EXPECT_THROW(run_op("aten.index_put.default", {zeros, ints({2}, {0, 1}), floats({3}, {1, 2, 3})}), Error);
}

TEST(IndexSelect, RowsAndColumns) {
  const Tensor x = iota({3, 2});
  const OpRun rows = run_op("aten.index_select.default", {x, ints({3}, {2, 0, 2})}, make_attrs({{"dim", int64_t{0}}}));
  EXPECT_EQ(rows.metas[0].shape, (Shape{3, 2}));
  EXPECT_EQ(float_values(rows.outputs[0]), (std::vector<float>{4, 5, 0, 1, 4, 5}));
  const OpRun column = run_op("aten.index_select.default", {bools({2, 2}, {1, 0, 0, 0}), ints({1}, {-2})},
                              make_attrs({{"dim", int64_t{-1}}}));
  EXPECT_EQ(column.metas[0], (TensorMeta{{2, 1}, DType::Bool}));
  EXPECT_EQ(bool_values(column.outputs[0]), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(run_op("aten.index_select.default", {x, ints({0}, {})}, make_attrs({{"dim", int64_t{1}}})).metas[0].shape,
            (Shape{3, 0}));
  EXPECT_THROW(run_op("aten.index_select.default", {x, ints({1}, {3})}, make_attrs({{"dim", int64_t{0}}})), Error);
  EXPECT_THROW(run_op("aten.index_select.default", {x, ints({1, 1}, {0})}, make_attrs({{"dim", int64_t{0}}})), Error);
  EXPECT_THROW(run_op("aten.index_select.default", {x, ints({1}, {0})}), Error);  // dim is required
}

TEST(IndexCopy, WritesKvRowsAlongDimTwo) {
  // A static KV cache [1, 2 heads, 5 positions, 3] receiving two new positions (4 then 1).
  const Tensor cache = iota({1, 2, 5, 3});
  Tensor source = iota({1, 2, 2, 3});
  for (int i = 0; i < 12; ++i) source.mutable_data<float>()[i] += 100.0f;
  const OpRun r =
      run_op("aten.index_copy.default", {cache, ints({2}, {4, 1}), source}, make_attrs({{"dim", int64_t{2}}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{1, 2, 5, 3}, DType::Float32}));
  EXPECT_EQ(float_values(r.outputs[0]),
            (std::vector<float>{0,  1,  2,  103, 104, 105, 6,  7,  8,  9,  10, 11, 100, 101, 102,
                                15, 16, 17, 109, 110, 111, 21, 22, 23, 24, 25, 26, 106, 107, 108}));
  EXPECT_EQ(float_values(cache), iota_values(30));  // out of place
}

TEST(IndexCopy, InPlaceSpellingDefaultDimAndNegativeIndex) {
  const OpRun r =
      run_op("aten.index_copy_.default", {iota({3, 2}, DType::Int64), ints({1}, {-1}), ints({1, 2}, {7, 8})});
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 7, 8}));
  const OpRun b = run_op("aten.index_copy.default", {bools({2}, {0, 0}), ints({}, {1}), bools({1}, {1})});
  EXPECT_EQ(bool_values(b.outputs[0]), (std::vector<uint8_t>{0, 1}));
}

TEST(IndexCopy, RejectsMismatchedSourceAndBadIndex) {
  const Tensor cache = iota({1, 2, 5, 3});
  EXPECT_THROW(
      run_op("aten.index_copy.default", {cache, ints({1}, {0}), iota({1, 2, 2, 3})}, make_attrs({{"dim", int64_t{2}}})),
      Error);
  EXPECT_THROW(
      run_op("aten.index_copy.default", {cache, ints({1}, {5}), iota({1, 2, 1, 3})}, make_attrs({{"dim", int64_t{2}}})),
      Error);
  EXPECT_THROW(run_op("aten.index_copy.default", {cache, floats({1}, {0}), iota({1, 2, 1, 3})},
                      make_attrs({{"dim", int64_t{2}}})),
               Error);
  EXPECT_THROW(
      run_op("aten.index_copy.default", {cache, ints({1}, {0}), iota({1, 2, 1, 3})}, make_attrs({{"dim", int64_t{4}}})),
      Error);
}

TEST(Gather, AlongTheLastDim) {
  const OpRun r = run_op("aten.gather.default", {iota({2, 3}, DType::Int64), ints({2, 2}, {0, 0, 2, 1})},
                         make_attrs({{"dim", int64_t{-1}}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{2, 2}, DType::Int64}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{0, 0, 5, 4}));
  EXPECT_THROW(run_op("aten.gather.default", {iota({2, 3}, DType::Int64), ints({2, 1}, {0, 3})},
                      make_attrs({{"dim", int64_t{1}}})),
               Error);
  EXPECT_THROW(
      run_op("aten.gather.default", {iota({2, 3}, DType::Int64), ints({2}, {0, 1})}, make_attrs({{"dim", int64_t{1}}})),
      Error);
  EXPECT_THROW(run_op("aten.gather.default", {iota({2, 3}, DType::Int64), ints({3, 1}, {0, 1, 2})},
                      make_attrs({{"dim", int64_t{1}}})),
               Error);
}

TEST(Scatter, SrcValueAndAdd) {
  const Tensor zeros = floats({2, 3}, {0, 0, 0, 0, 0, 0});
  EXPECT_EQ(float_values(run_op("aten.scatter.src", {zeros, ints({2, 1}, {2, 0}), floats({2, 1}, {1, 2})},
                                make_attrs({{"dim", int64_t{1}}}))
                             .outputs[0]),
            (std::vector<float>{0, 0, 1, 2, 0, 0}));
  EXPECT_EQ(float_values(run_op("aten.scatter.value", {zeros, ints({1, 2}, {1, 0})},
                                make_attrs({{"dim", int64_t{0}}, {"value", 9.5}}))
                             .outputs[0]),
            (std::vector<float>{0, 9.5f, 0, 9.5f, 0, 0}));
  EXPECT_EQ(
      float_values(run_op("aten.scatter_add.default", {zeros, ints({2, 2}, {2, 2, 0, 1}), floats({2, 2}, {1, 2, 3, 4})},
                          make_attrs({{"dim", int64_t{1}}}))
                       .outputs[0]),
      (std::vector<float>{0, 0, 3, 3, 4, 0}));
  EXPECT_THROW(run_op("aten.scatter.value", {zeros, ints({2, 1}, {0, 0})}, make_attrs({{"dim", int64_t{1}}})),
               Error);  // no value
  EXPECT_THROW(run_op("aten.scatter.src", {zeros, ints({2, 1}, {3, 0}), floats({2, 1}, {1, 2})},
                      make_attrs({{"dim", int64_t{1}}})),
               Error);
}

}  // namespace
