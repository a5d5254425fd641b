#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

// ---------------------------------------------------------------------------------------------------------------

TEST(Reshape, ViewSizeWithMinusOneIsRenamedToShape) {
  const OpRun r = run_op("aten.view.default", {iota({2, 3, 4})}, make_attrs({{"size", ints_attr({4, -1})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{4, 6}));
  EXPECT_EQ(r.metas[0].dtype, DType::Float32);
  EXPECT_EQ(float_values(r.outputs[0]), iota_values(24));
}

TEST(Reshape, ReshapeUnsafeViewAndViewAs) {
  EXPECT_EQ(run_op("aten.reshape.default", {iota({2, 3}, DType::Int64)}, make_attrs({{"shape", ints_attr({-1})}}))
                .metas[0]
                .shape,
            (Shape{6}));
  const OpRun unsafe =
      run_op("aten._unsafe_view.default", {iota({6}, DType::Int64)}, make_attrs({{"size", ints_attr({3, 1, 2})}}));
  EXPECT_EQ(unsafe.metas[0].shape, (Shape{3, 1, 2}));
  EXPECT_EQ(int_values(unsafe.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  const OpRun as = run_op("aten.view_as.default", {bools({4}, {1, 0, 0, 1}), iota({2, 2})});
  EXPECT_EQ(as.metas[0], (TensorMeta{{2, 2}, DType::Bool}));
  EXPECT_EQ(bool_values(as.outputs[0]), (std::vector<uint8_t>{1, 0, 0, 1}));
}

TEST(Reshape, ScalarAndEmptyTensors) {
  EXPECT_EQ(
      run_op("aten.reshape.default", {floats({}, {7})}, make_attrs({{"shape", ints_attr({1, 1})}})).metas[0].shape,
      (Shape{1, 1}));
  EXPECT_EQ(run_op("aten.reshape.default", {floats({1}, {7})}, make_attrs({{"shape", ints_attr({})}})).metas[0].shape,
            (Shape{}));
  const OpRun empty = run_op("aten.view.default", {iota({0, 3})}, make_attrs({{"size", ints_attr({3, -1})}}));
  EXPECT_EQ(empty.metas[0].shape, (Shape{3, 0}));
  EXPECT_EQ(empty.outputs[0].numel(), 0);
}

TEST(Reshape, RejectsBadShapes) {
  EXPECT_THROW(run_op("aten.view.default", {iota({2, 3})}, make_attrs({{"size", ints_attr({-1, -1})}})), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota({2, 3})}, make_attrs({{"size", ints_attr({4, -1})}})), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota({2, 3})}, make_attrs({{"size", ints_attr({7})}})), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota({2, 3})}, make_attrs({{"size", ints_attr({-2, -3})}})), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota({0, 3})}, make_attrs({{"size", ints_attr({0, -1})}})), Error);
  EXPECT_THROW(run_op("aten.reshape.default", {iota({2, 3})}), Error);  // no shape at all
  EXPECT_THROW(run_op("aten.reshape.default", {iota({2, 3})}, make_attrs({{"shape", std::string("6")}})), Error);
}

TEST(Flatten, UsingIntsDefaultsAndNegativeDims) {
  EXPECT_EQ(run_op("aten.flatten.using_ints", {iota({2, 3, 4})}).metas[0].shape, (Shape{24}));
  const OpRun r = run_op("aten.flatten.using_ints", {iota({2, 3, 4})}, make_attrs({{"start_dim", int64_t{1}}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 12}));
  EXPECT_EQ(float_values(r.outputs[0]), iota_values(24));
  EXPECT_EQ(run_op("aten.flatten.using_ints", {iota({2, 3, 4, 5})},
                   make_attrs({{"start_dim", int64_t{-3}}, {"end_dim", int64_t{-2}}}))
                .metas[0]
                .shape,
            (Shape{2, 12, 5}));
  EXPECT_EQ(run_op("aten.flatten.using_ints", {floats({}, {3})}).metas[0].shape, (Shape{1}));
  EXPECT_THROW(run_op("aten.flatten.using_ints", {iota({2, 3, 4})},
                      make_attrs({{"start_dim", int64_t{2}}, {"end_dim", int64_t{1}}})),
               Error);
  EXPECT_THROW(run_op("aten.flatten.using_ints", {iota({2, 3})}, make_attrs({{"start_dim", int64_t{2}}})), Error);
}

TEST(Unflatten, SplitsOneDimension) {
  const OpRun r = run_op("aten.unflatten.int", {iota({2, 6}, DType::Int64)},
                         make_attrs({{"dim", int64_t{-1}}, {"sizes", ints_attr({3, -1})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3, 2}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_THROW(run_op("aten.unflatten.int", {iota({2, 6}, DType::Int64)},
                      make_attrs({{"dim", int64_t{1}}, {"sizes", ints_attr({4, -1})}})),
               Error);
  EXPECT_THROW(run_op("aten.unflatten.int", {iota({2, 6}, DType::Int64)}, make_attrs({{"sizes", ints_attr({3, 2})}})),
               Error);
}

TEST(Squeeze, AllOneDimAndListOfDims) {
  const Tensor x = iota({1, 3, 1, 2});
  EXPECT_EQ(run_op("aten.squeeze.default", {x}).metas[0].shape, (Shape{3, 2}));
  EXPECT_EQ(run_op("aten.squeeze.dim", {x}, make_attrs({{"dim", int64_t{-2}}})).metas[0].shape, (Shape{1, 3, 2}));
  EXPECT_EQ(run_op("aten.squeeze.dim", {x}, make_attrs({{"dim", int64_t{1}}})).metas[0].shape, (Shape{1, 3, 1, 2}));
  const OpRun r = run_op("aten.squeeze.dims", {x}, make_attrs({{"dim", ints_attr({0, 2})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{3, 2}));
  EXPECT_EQ(float_values(r.outputs[0]), iota_values(6));
  EXPECT_EQ(run_op("aten.squeeze.default", {floats({}, {1})}).metas[0].shape, (Shape{}));
  EXPECT_THROW(run_op("aten.squeeze.dim", {x}, make_attrs({{"dim", int64_t{4}}})), Error);
}

TEST(Unsqueeze, NegativeAndEndDims) {
  const Tensor x = bools({2, 3}, {1, 0, 1, 0, 0, 1});
  const OpRun last = run_op("aten.unsqueeze.default", {x}, make_attrs({{"dim", int64_t{-1}}}));
  EXPECT_EQ(last.metas[0], (TensorMeta{{2, 3, 1}, DType::Bool}));
  EXPECT_EQ(bool_values(last.outputs[0]), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(run_op("aten.unsqueeze.default", {x}, make_attrs({{"dim", int64_t{2}}})).metas[0].shape, (Shape{2, 3, 1}));
  EXPECT_EQ(run_op("aten.unsqueeze.default", {x}, make_attrs({{"dim", int64_t{-3}}})).metas[0].shape, (Shape{1, 2, 3}));
  EXPECT_EQ(run_op("aten.unsqueeze.default", {floats({}, {2})}, make_attrs({{"dim", int64_t{0}}})).metas[0].shape,
            (Shape{1}));
  EXPECT_THROW(run_op("aten.unsqueeze.default", {x}, make_attrs({{"dim", int64_t{3}}})), Error);
  EXPECT_THROW(run_op("aten.unsqueeze.default", {x}, make_attrs({{"dim", int64_t{-4}}})), Error);
  EXPECT_THROW(run_op("aten.unsqueeze.default", {x}), Error);  // dim is required
}

TEST(Permute, MovesEveryElement) {
  const OpRun r = run_op("aten.permute.default", {iota({2, 3, 4})}, make_attrs({{"dims", ints_attr({2, 0, 1})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{4, 2, 3}));
  // out[a][b][c] = in[b][c][a] = 12b + 4c + a
  EXPECT_EQ(float_values(r.outputs[0]),
            (std::vector<float>{0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}));
  const OpRun negative =
      run_op("aten.permute.default", {iota({2, 3, 4})}, make_attrs({{"dims", ints_attr({-1, 0, -2})}}));
  EXPECT_EQ(float_values(negative.outputs[0]), float_values(r.outputs[0]));
  EXPECT_THROW(run_op("aten.permute.default", {iota({2, 3, 4})}, make_attrs({{"dims", ints_attr({0, 0, 1})}})), Error);
  EXPECT_THROW(run_op("aten.permute.default", {iota({2, 3, 4})}, make_attrs({{"dims", ints_attr({0, 1})}})), Error);
  EXPECT_THROW(run_op("aten.permute.default", {iota({2, 3, 4})}, make_attrs({{"dims", ints_attr({0, 1, 3})}})), Error);
}

TEST(Transpose, IntAndBoolWithNegativeDims) {
  const OpRun r = run_op("aten.transpose.int", {iota({2, 3}, DType::Int64)},
                         make_attrs({{"dim0", int64_t{0}}, {"dim1", int64_t{-1}}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{3, 2}, DType::Int64}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  const OpRun b = run_op("aten.transpose.int", {bools({1, 2, 2}, {1, 1, 0, 0})},
                         make_attrs({{"dim0", int64_t{-2}}, {"dim1", int64_t{2}}}));
  EXPECT_EQ(bool_values(b.outputs[0]), (std::vector<uint8_t>{1, 0, 1, 0}));
  const OpRun swapped =
      run_op("aten.swapaxes.default", {iota({2, 1, 3})}, make_attrs({{"axis0", int64_t{2}}, {"axis1", int64_t{0}}}));
  EXPECT_EQ(swapped.metas[0].shape, (Shape{3, 1, 2}));
  EXPECT_EQ(float_values(swapped.outputs[0]), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(run_op("aten.transpose.int", {iota({0, 3})}, make_attrs({{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}))
                .metas[0]
                .shape,
            (Shape{3, 0}));
  EXPECT_THROW(run_op("aten.transpose.int", {iota({2, 3})}, make_attrs({{"dim0", int64_t{0}}, {"dim1", int64_t{2}}})),
               Error);
  EXPECT_THROW(run_op("aten.transpose.int", {iota({2, 3})}, make_attrs({{"dim0", int64_t{0}}})), Error);
}

TEST(Expand, MinusOneKeepsAndNewLeadingDims) {
  const OpRun r =
      run_op("aten.expand.default", {floats({3, 1}, {1, 2, 3})}, make_attrs({{"size", ints_attr({2, -1, 2})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3, 2}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  // As in the Qwen attention mask: bool, -1 on an existing dimension.
  const OpRun mask = run_op("aten.expand.default", {bools({1, 1, 2, 2}, {1, 0, 1, 1})},
                            make_attrs({{"size", ints_attr({1, -1, 2, 2})}}));
  EXPECT_EQ(mask.metas[0], (TensorMeta{{1, 1, 2, 2}, DType::Bool}));
  EXPECT_EQ(bool_values(mask.outputs[0]), (std::vector<uint8_t>{1, 0, 1, 1}));
  const OpRun as = run_op("aten.expand_as.default", {ints({2}, {5, -6}), iota({2, 2})});
  EXPECT_EQ(as.metas[0], (TensorMeta{{2, 2}, DType::Int64}));
  EXPECT_EQ(int_values(as.outputs[0]), (std::vector<int64_t>{5, -6, 5, -6}));
  EXPECT_EQ(run_op("aten.expand.default", {iota({1})}, make_attrs({{"size", ints_attr({0})}})).outputs[0].numel(), 0);
}

TEST(Expand, RejectsIncompatibleSizes) {
  const Tensor x = floats({3, 1}, {1, 2, 3});
  EXPECT_THROW(run_op("aten.expand.default", {x}, make_attrs({{"size", ints_attr({2, 4})}})), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, make_attrs({{"size", ints_attr({4})}})), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, make_attrs({{"size", ints_attr({-1, 3, 1})}})), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, make_attrs({{"size", ints_attr({3, -2})}})), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, make_attrs({{"size", ints_attr({int64_t{1} << 30, 1 << 20, 3, 1})}})),
               Error);
}

TEST(Repeat, TilesWithNewLeadingDims) {
  const OpRun r =
      run_op("aten.repeat.default", {ints({2, 2}, {1, 2, 3, 4})}, make_attrs({{"repeats", ints_attr({1, 2, 3})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{1, 4, 6}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4,  //
                                                            1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
  EXPECT_EQ(run_op("aten.repeat.default", {iota({3})}, make_attrs({{"repeats", ints_attr({0})}})).metas[0].shape,
            (Shape{0}));
  EXPECT_THROW(run_op("aten.repeat.default", {iota({2, 2})}, make_attrs({{"repeats", ints_attr({2})}})), Error);
  EXPECT_THROW(run_op("aten.repeat.default", {iota({2})}, make_attrs({{"repeats", ints_attr({-1})}})), Error);
}

TEST(Slice, OpenEndNegativeStartAndStep) {
  const Tensor x = iota({2, 10});
  const OpRun open =
      run_op("aten.slice.Tensor", {x}, make_attrs({{"dim", int64_t{1}}, {"start", int64_t{8}}, {"end", kInt64Max}}));
  EXPECT_EQ(open.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(float_values(open.outputs[0]), (std::vector<float>{8, 9, 18, 19}));
  const OpRun stepped =
      run_op("aten.slice.Tensor", {x},
             make_attrs({{"dim", int64_t{-1}}, {"start", int64_t{-3}}, {"end", kInt64Max}, {"step", int64_t{2}}}));
  EXPECT_EQ(stepped.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(float_values(stepped.outputs[0]), (std::vector<float>{7, 9, 17, 19}));
  const OpRun every_third = run_op("aten.slice.Tensor", {x}, make_attrs({{"dim", int64_t{1}}, {"step", int64_t{3}}}));
  EXPECT_EQ(float_values(every_third.outputs[0]), (std::vector<float>{0, 3, 6, 9, 10, 13, 16, 19}));
  const OpRun tail = run_op("aten.slice.Tensor", {x},
                            make_attrs({{"dim", int64_t{1}}, {"start", int64_t{-100}}, {"end", int64_t{-8}}}));
  EXPECT_EQ(float_values(tail.outputs[0]), (std::vector<float>{0, 1, 10, 11}));
}

TEST(Slice, DefaultsNullsAndEmptyRanges) {
  const Tensor x = iota({3, 2}, DType::Int64);
  const OpRun rows = run_op("aten.slice.Tensor", {x}, make_attrs({{"start", int64_t{1}}}));  // dim defaults to 0
  EXPECT_EQ(int_values(rows.outputs[0]), (std::vector<int64_t>{2, 3, 4, 5}));
  const OpRun nulls = run_op("aten.slice.Tensor", {x}, make_attrs({{"start", NoneValue{}}, {"end", NoneValue{}}}));
  EXPECT_EQ(int_values(nulls.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  const OpRun empty =
      run_op("aten.slice.Tensor", {x}, make_attrs({{"dim", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{1}}}));
  EXPECT_EQ(empty.metas[0].shape, (Shape{3, 0}));
  const OpRun bools_out =
      run_op("aten.slice.Tensor", {bools({4}, {0, 1, 1, 0})}, make_attrs({{"start", int64_t{1}}, {"end", int64_t{3}}}));
  EXPECT_EQ(bool_values(bools_out.outputs[0]), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(run_op("aten.slice.Tensor", {iota({0})}).metas[0].shape, (Shape{0}));
}

TEST(Slice, RejectsBadAttributes) {
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota({4})}, make_attrs({{"step", int64_t{0}}})), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota({4})}, make_attrs({{"step", int64_t{-1}}})), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota({4})}, make_attrs({{"dim", int64_t{1}}})), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {floats({}, {1})}), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota({4})}, make_attrs({{"start", 1.5}})), Error);
}

TEST(Select, NegativeIndexAndDim) {
  const OpRun r =
      run_op("aten.select.int", {iota({2, 3, 4})}, make_attrs({{"dim", int64_t{1}}, {"index", int64_t{-1}}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 4}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  const OpRun scalar =
      run_op("aten.select.int", {ints({3}, {4, 5, 6})}, make_attrs({{"dim", int64_t{-1}}, {"index", int64_t{1}}}));
  EXPECT_EQ(scalar.metas[0].shape, (Shape{}));
  EXPECT_EQ(int_values(scalar.outputs[0]), (std::vector<int64_t>{5}));
  EXPECT_THROW(run_op("aten.select.int", {iota({2, 3})}, make_attrs({{"dim", int64_t{1}}, {"index", int64_t{3}}})),
               Error);
  EXPECT_THROW(run_op("aten.select.int", {iota({2, 3})}, make_attrs({{"dim", int64_t{1}}, {"index", int64_t{-4}}})),
               Error);
}

TEST(Narrow, NegativeStart) {
  const OpRun r = run_op("aten.narrow.default", {iota({2, 5})},
                         make_attrs({{"dim", int64_t{1}}, {"start", int64_t{-3}}, {"length", int64_t{2}}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{2, 3, 7, 8}));
  EXPECT_THROW(run_op("aten.narrow.default", {iota({2, 5})},
                      make_attrs({{"dim", int64_t{1}}, {"start", int64_t{4}}, {"length", int64_t{2}}})),
               Error);
  EXPECT_THROW(run_op("aten.narrow.default", {iota({2, 5})},
                      make_attrs({{"dim", int64_t{1}}, {"start", int64_t{0}}, {"length", int64_t{-1}}})),
               Error);
}

TEST(Cat, SkipsTheEmptyKvCacheOfPrefillGraphs) {
  // As in the exported prefill graph: cat([empty [0] cache, new keys], dim=-2).
  const Tensor keys = iota({1, 2, 3, 2});
  const OpRun r = run_op("aten.cat.default", {floats({0}, {}), keys},
                         make_attrs({{"dim", int64_t{-2}}, {"_tensor_list_sizes", ints_attr({2})}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{1, 2, 3, 2}, DType::Float32}));
  EXPECT_EQ(float_values(r.outputs[0]), iota_values(12));
}

TEST(Cat, ThreeInputsAlongTheLastDim) {
  const OpRun r = run_op("aten.cat.default", {floats({2, 1}, {0, 1}), floats({2, 2}, {2, 3, 4, 5}), iota({2, 3})},
                         make_attrs({{"dim", int64_t{-1}}, {"_tensor_list_sizes", ints_attr({3})}}));
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 6}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{0, 2, 3, 0, 1, 2, 1, 4, 5, 3, 4, 5}));
}

TEST(Cat, DefaultDimPromotionAndOtherDtypes) {
  const OpRun rows = run_op("aten.cat.default", {ints({1, 2}, {1, 2}), ints({2, 2}, {3, 4, 5, 6})});
  EXPECT_EQ(rows.metas[0], (TensorMeta{{3, 2}, DType::Int64}));
  EXPECT_EQ(int_values(rows.outputs[0]), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const OpRun mixed = run_op("aten.cat.default", {ints({2}, {1, 2}), floats({1}, {0.5f})});
  EXPECT_EQ(mixed.metas[0], (TensorMeta{{3}, DType::Float32}));
  EXPECT_EQ(float_values(mixed.outputs[0]), (std::vector<float>{1, 2, 0.5f}));
  const OpRun b = run_op("aten.cat.default", {bools({1}, {1}), bools({2}, {0, 1})});
  EXPECT_EQ(bool_values(b.outputs[0]), (std::vector<uint8_t>{1, 0, 1}));
  const OpRun empties = run_op("aten.cat.default", {floats({0}, {}), floats({0}, {})});
  EXPECT_EQ(empties.metas[0].shape, (Shape{0}));
  const OpRun zero_rows = run_op("aten.cat.default", {iota({0, 2}), iota({1, 2})});
  EXPECT_EQ(float_values(zero_rows.outputs[0]), (std::vector<float>{0, 1}));
}

TEST(Cat, RejectsMismatchedInputs) {
  EXPECT_THROW(run_op("aten.cat.default", {iota({2, 2}), iota({2, 3})}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {iota({2, 2}), iota({2, 2, 1})}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {floats({}, {1}), floats({}, {2})}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {iota({2}), iota({2})}, make_attrs({{"dim", int64_t{1}}})), Error);
  EXPECT_THROW(run_op("aten.cat.default", {iota({2}), iota({2})}, make_attrs({{"_tensor_list_sizes", ints_attr({3})}})),
               Error);
}

TEST(Stack, NewDimAtFrontAndBack) {
  const Tensor a = ints({2}, {1, 2});
  const Tensor b = ints({2}, {3, 4});
  const OpRun front = run_op("aten.stack.default", {a, b});
  EXPECT_EQ(front.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(int_values(front.outputs[0]), (std::vector<int64_t>{1, 2, 3, 4}));
  const OpRun back = run_op("aten.stack.default", {a, b, a}, make_attrs({{"dim", int64_t{-1}}}));
  EXPECT_EQ(back.metas[0].shape, (Shape{2, 3}));
  EXPECT_EQ(int_values(back.outputs[0]), (std::vector<int64_t>{1, 3, 1, 2, 4, 2}));
  EXPECT_THROW(run_op("aten.stack.default", {a, ints({3}, {1, 2, 3})}), Error);
  EXPECT_THROW(run_op("aten.stack.default", {a, b}, make_attrs({{"dim", int64_t{2}}})), Error);
}

TEST(Split, SplitSizeAndSizes) {
  const OpRun r = run_op("aten.split.Tensor", {iota({5, 2})}, make_attrs({{"split_size", int64_t{2}}}));
  ASSERT_EQ(r.metas.size(), 3u);
  EXPECT_EQ(r.metas[2].shape, (Shape{1, 2}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(float_values(r.outputs[1]), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(float_values(r.outputs[2]), (std::vector<float>{8, 9}));
  const OpRun sizes = run_op("aten.split_with_sizes.default", {iota({2, 3}, DType::Int64)},
                             make_attrs({{"split_sizes", ints_attr({1, 0, 2})}, {"dim", int64_t{-1}}}));
  ASSERT_EQ(sizes.metas.size(), 3u);
  EXPECT_EQ(int_values(sizes.outputs[0]), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(sizes.metas[1].shape, (Shape{2, 0}));
  EXPECT_EQ(int_values(sizes.outputs[2]), (std::vector<int64_t>{1, 2, 4, 5}));
  EXPECT_EQ(run_op("aten.split.Tensor", {iota({3})}, make_attrs({{"split_size", int64_t{5}}})).metas.size(), 1u);
  EXPECT_EQ(run_op("aten.split.Tensor", {iota({0})}, make_attrs({{"split_size", int64_t{0}}})).metas.size(), 1u);
}

TEST(Split, RejectsBadSizes) {
  EXPECT_THROW(run_op("aten.split.Tensor", {iota({4})}, make_attrs({{"split_size", int64_t{0}}})), Error);
  EXPECT_THROW(run_op("aten.split.Tensor", {iota({4})}, make_attrs({{"split_size", int64_t{-1}}})), Error);
  EXPECT_THROW(run_op("aten.split_with_sizes.default", {iota({4})}, make_attrs({{"split_sizes", ints_attr({1, 2})}})),
               Error);
  EXPECT_THROW(run_op("aten.split_with_sizes.default", {iota({4})}, make_attrs({{"split_sizes", ints_attr({5, -1})}})),
               Error);
}

TEST(Chunk, UnevenAndEmpty) {
  const OpRun r = run_op("aten.chunk.default", {iota({5})}, make_attrs({{"chunks", int64_t{3}}}));
  ASSERT_EQ(r.metas.size(), 3u);
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{0, 1}));
  EXPECT_EQ(float_values(r.outputs[1]), (std::vector<float>{2, 3}));
  EXPECT_EQ(float_values(r.outputs[2]), (std::vector<float>{4}));
  EXPECT_EQ(run_op("aten.chunk.default", {iota({2, 6})}, make_attrs({{"chunks", int64_t{4}}, {"dim", int64_t{-1}}}))
                .metas.size(),
            3u);  // chunk size 2
  const OpRun empty = run_op("aten.chunk.default", {iota({0})}, make_attrs({{"chunks", int64_t{3}}}));
  EXPECT_EQ(empty.metas.size(), 3u);
  EXPECT_THROW(run_op("aten.chunk.default", {iota({4})}, make_attrs({{"chunks", int64_t{0}}})), Error);
}

TEST(Unbind, OneOutputPerIndex) {
  const OpRun r = run_op("aten.unbind.int", {iota({2, 3}, DType::Int64)}, make_attrs({{"dim", int64_t{-1}}}));
  ASSERT_EQ(r.metas.size(), 3u);
  EXPECT_EQ(r.metas[0].shape, (Shape{2}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(int_values(r.outputs[1]), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(int_values(r.outputs[2]), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(run_op("aten.unbind.int", {iota({0, 3}, DType::Int64)}).metas.size(), 0u);
}

TEST(Flip, OneAndTwoDims) {
  EXPECT_EQ(
      float_values(run_op("aten.flip.default", {iota({2, 3})}, make_attrs({{"dims", ints_attr({0, -1})}})).outputs[0]),
      (std::vector<float>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(
      int_values(
          run_op("aten.flip.default", {iota({2, 3}, DType::Int64)}, make_attrs({{"dims", ints_attr({1})}})).outputs[0]),
      (std::vector<int64_t>{2, 1, 0, 5, 4, 3}));
  EXPECT_EQ(run_op("aten.flip.default", {iota({0, 3})}, make_attrs({{"dims", ints_attr({0})}})).metas[0].shape,
            (Shape{0, 3}));
  EXPECT_THROW(run_op("aten.flip.default", {iota({2, 3})}, make_attrs({{"dims", ints_attr({1, -1})}})), Error);
}

TEST(Roll, FlatAndPerDim) {
  EXPECT_EQ(float_values(run_op("aten.roll.default", {iota({5})}, make_attrs({{"shifts", ints_attr({2})}})).outputs[0]),
            (std::vector<float>{3, 4, 0, 1, 2}));
  EXPECT_EQ(
      float_values(run_op("aten.roll.default", {iota({2, 3})}, make_attrs({{"shifts", ints_attr({1})}})).outputs[0]),
      (std::vector<float>{5, 0, 1, 2, 3, 4}));
  EXPECT_EQ(int_values(run_op("aten.roll.default", {iota({2, 3}, DType::Int64)},
                              make_attrs({{"shifts", ints_attr({1, -1})}, {"dims", ints_attr({0, 1})}}))
                           .outputs[0]),
            (std::vector<int64_t>{4, 5, 3, 1, 2, 0}));
  EXPECT_THROW(run_op("aten.roll.default", {iota({2, 3})}, make_attrs({{"shifts", ints_attr({1, 2})}})), Error);
  EXPECT_THROW(run_op("aten.roll.default", {iota({2, 3})},
                      make_attrs({{"shifts", ints_attr({1})}, {"dims", ints_attr({0, 1})}})),
               Error);
}

TEST(ShapeOps, EmptyTensorsFlowThrough) {
  const Tensor empty = iota({0, 1, 3});
  EXPECT_EQ(run_op("aten.permute.default", {empty}, make_attrs({{"dims", ints_attr({2, 0, 1})}})).metas[0].shape,
            (Shape{3, 0, 1}));
  EXPECT_EQ(run_op("aten.expand.default", {empty}, make_attrs({{"size", ints_attr({0, 4, 3})}})).metas[0].shape,
            (Shape{0, 4, 3}));
  EXPECT_EQ(run_op("aten.repeat.default", {empty}, make_attrs({{"repeats", ints_attr({2, 2, 2})}})).metas[0].shape,
            (Shape{0, 2, 6}));
  EXPECT_EQ(run_op("aten.select.int", {empty}, make_attrs({{"dim", int64_t{1}}, {"index", int64_t{0}}})).metas[0].shape,
            (Shape{0, 3}));
}

// ---------------------------------------------------------------------------------------------------------------
// Every node of the exported fixtures that these op families own: the inferred metas equal the recorded ones.

AttrValue attr_from_json(const nlohmann::json& j) {
  if (j.is_null()) return NoneValue{};
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  std::vector<nlohmann::json> flat;
  for (const auto& item : j) {  // the one nested form, [[...]], is a single tensor list's None mask
    if (item.is_array())
      flat.insert(flat.end(), item.begin(), item.end());
    else
      flat.push_back(item);
  }
  if (!flat.empty() && flat[0].is_boolean()) {
    std::vector<bool> values;
    for (const auto& item : flat) values.push_back(item.get<bool>());
    return values;
  }
  std::vector<int64_t> values;
  for (const auto& item : flat) values.push_back(item.get<int64_t>());
  return values;
}

TensorMeta meta_from_json(const nlohmann::json& j) {
  return {j.at("shape").get<Shape>(), parse_dtype(j.at("dtype").get<std::string>()).value()};
}

TEST(ExportedGraphs, InferredMetasMatchEveryOwnedNode) {
  const std::set<std::string> owned = {"reshape",      "flatten",     "unflatten",
                                       "squeeze",      "unsqueeze",   "permute",
                                       "transpose",    "expand",      "repeat",
                                       "slice",        "select",      "narrow",
                                       "cat",          "stack",       "split",
                                       "chunk",        "unbind",      "flip",
                                       "roll",         "index",       "index_put",
                                       "index_select", "index_copy",  "gather",
                                       "scatter",      "scatter_add", "full",
                                       "full_like",    "new_full",    "scalar_tensor",
                                       "arange",       "linspace",    "rotary_embedding"};
  const OpRegistry& registry = OpRegistry::instance();
  std::map<std::string, int> checked;
  for (const char* file : {"qwen_tiny/prefill_ir.json", "qwen_tiny/decode_ir.json", "ir/qwen15_prefill_ir.json",
                           "ir/qwen15_decode_ir.json", "ir/resnet18_ir.json"}) {
    std::ifstream in(std::string(NPUSIM_TEST_DATA) + "/fixtures/" + file);
    ASSERT_TRUE(in) << file;
    const nlohmann::json ir = nlohmann::json::parse(in);
    for (const auto& node : ir.at("nodes")) {
      const auto [def, spelling] = registry.find_spelling(node.at("op_type").get<std::string>());
      if (!def || !owned.count(def->name)) continue;
      const std::string where = std::string(file) + ":" + node.at("name").get<std::string>();
      Attrs attrs(where);
      for (const auto& [name, value] : node.at("attrs").items()) attrs.set(name, attr_from_json(value));
      registry.normalize_attrs(*def, spelling, attrs, where);
      std::vector<TensorMeta> inputs;
      for (const auto& input : node.at("inputs")) inputs.push_back(meta_from_json(input));
      std::vector<TensorMeta> expected;
      for (const auto& output : node.at("outputs")) expected.push_back(meta_from_json(output));
      EXPECT_EQ(def->infer(attrs, inputs), expected) << where;
      ++checked[def->name];
    }
  }
  for (const char* op : {"reshape", "flatten", "unsqueeze", "transpose", "expand", "slice", "cat", "index",
                         "index_copy", "arange", "new_full", "rotary_embedding"})
    EXPECT_GT(checked[op], 0) << op;
}

}  // namespace
