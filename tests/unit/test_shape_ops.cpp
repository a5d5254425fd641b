#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
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

TEST(Reshape, ViewSizeWithMinusOneIsRenamedToShape) {
  const OpResult r = run_op("aten.view.default", {iota_f32({2, 3, 4})}, {{"size", ints_attr({4, -1})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{4, 6}));
  EXPECT_EQ(r.metas[0].dtype, DType::Float32);
  EXPECT_EQ(floats(r.outputs[0]), iota_values(24));
}

TEST(Reshape, ReshapeUnsafeViewAndViewAs) {
  EXPECT_EQ(run_op("aten.reshape.default", {iota_i64({2, 3})}, {{"shape", ints_attr({-1})}}).metas[0].shape,
            (Shape{6}));
  const OpResult unsafe = run_op("aten._unsafe_view.default", {iota_i64({6})}, {{"size", ints_attr({3, 1, 2})}});
  EXPECT_EQ(unsafe.metas[0].shape, (Shape{3, 1, 2}));
  EXPECT_EQ(ints(unsafe.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  const OpResult as = run_op("aten.view_as.default", {boolean({4}, {1, 0, 0, 1}), iota_f32({2, 2})});
  EXPECT_EQ(as.metas[0], (TensorMeta{{2, 2}, DType::Bool}));
  EXPECT_EQ(bools(as.outputs[0]), (std::vector<uint8_t>{1, 0, 0, 1}));
}

TEST(Reshape, ScalarAndEmptyTensors) {
  EXPECT_EQ(run_op("aten.reshape.default", {f32({}, {7})}, {{"shape", ints_attr({1, 1})}}).metas[0].shape,
            (Shape{1, 1}));
  EXPECT_EQ(run_op("aten.reshape.default", {f32({1}, {7})}, {{"shape", ints_attr({})}}).metas[0].shape, (Shape{}));
  const OpResult empty = run_op("aten.view.default", {iota_f32({0, 3})}, {{"size", ints_attr({3, -1})}});
  EXPECT_EQ(empty.metas[0].shape, (Shape{3, 0}));
  EXPECT_EQ(empty.outputs[0].numel(), 0);
}

TEST(Reshape, RejectsBadShapes) {
  EXPECT_THROW(run_op("aten.view.default", {iota_f32({2, 3})}, {{"size", ints_attr({-1, -1})}}), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota_f32({2, 3})}, {{"size", ints_attr({4, -1})}}), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota_f32({2, 3})}, {{"size", ints_attr({7})}}), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota_f32({2, 3})}, {{"size", ints_attr({-2, -3})}}), Error);
  EXPECT_THROW(run_op("aten.view.default", {iota_f32({0, 3})}, {{"size", ints_attr({0, -1})}}), Error);
  EXPECT_THROW(run_op("aten.reshape.default", {iota_f32({2, 3})}), Error);  // no shape at all
  EXPECT_THROW(run_op("aten.reshape.default", {iota_f32({2, 3})}, {{"shape", std::string("6")}}), Error);
}

TEST(Flatten, UsingIntsDefaultsAndNegativeDims) {
  EXPECT_EQ(run_op("aten.flatten.using_ints", {iota_f32({2, 3, 4})}).metas[0].shape, (Shape{24}));
  const OpResult r = run_op("aten.flatten.using_ints", {iota_f32({2, 3, 4})}, {{"start_dim", int64_t{1}}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 12}));
  EXPECT_EQ(floats(r.outputs[0]), iota_values(24));
  EXPECT_EQ(run_op("aten.flatten.using_ints", {iota_f32({2, 3, 4, 5})},
                   {{"start_dim", int64_t{-3}}, {"end_dim", int64_t{-2}}})
                .metas[0]
                .shape,
            (Shape{2, 12, 5}));
  EXPECT_EQ(run_op("aten.flatten.using_ints", {f32({}, {3})}).metas[0].shape, (Shape{1}));
  EXPECT_THROW(
      run_op("aten.flatten.using_ints", {iota_f32({2, 3, 4})}, {{"start_dim", int64_t{2}}, {"end_dim", int64_t{1}}}),
      Error);
  EXPECT_THROW(run_op("aten.flatten.using_ints", {iota_f32({2, 3})}, {{"start_dim", int64_t{2}}}), Error);
}

TEST(Unflatten, SplitsOneDimension) {
  const OpResult r =
      run_op("aten.unflatten.int", {iota_i64({2, 6})}, {{"dim", int64_t{-1}}, {"sizes", ints_attr({3, -1})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3, 2}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_THROW(run_op("aten.unflatten.int", {iota_i64({2, 6})}, {{"dim", int64_t{1}}, {"sizes", ints_attr({4, -1})}}),
               Error);
  EXPECT_THROW(run_op("aten.unflatten.int", {iota_i64({2, 6})}, {{"sizes", ints_attr({3, 2})}}), Error);
}

TEST(Squeeze, AllOneDimAndListOfDims) {
  const Tensor x = iota_f32({1, 3, 1, 2});
  EXPECT_EQ(run_op("aten.squeeze.default", {x}).metas[0].shape, (Shape{3, 2}));
  EXPECT_EQ(run_op("aten.squeeze.dim", {x}, {{"dim", int64_t{-2}}}).metas[0].shape, (Shape{1, 3, 2}));
  EXPECT_EQ(run_op("aten.squeeze.dim", {x}, {{"dim", int64_t{1}}}).metas[0].shape, (Shape{1, 3, 1, 2}));
  const OpResult r = run_op("aten.squeeze.dims", {x}, {{"dim", ints_attr({0, 2})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{3, 2}));
  EXPECT_EQ(floats(r.outputs[0]), iota_values(6));
  EXPECT_EQ(run_op("aten.squeeze.default", {f32({}, {1})}).metas[0].shape, (Shape{}));
  EXPECT_THROW(run_op("aten.squeeze.dim", {x}, {{"dim", int64_t{4}}}), Error);
}

TEST(Unsqueeze, NegativeAndEndDims) {
  const Tensor x = boolean({2, 3}, {1, 0, 1, 0, 0, 1});
  const OpResult last = run_op("aten.unsqueeze.default", {x}, {{"dim", int64_t{-1}}});
  EXPECT_EQ(last.metas[0], (TensorMeta{{2, 3, 1}, DType::Bool}));
  EXPECT_EQ(bools(last.outputs[0]), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(run_op("aten.unsqueeze.default", {x}, {{"dim", int64_t{2}}}).metas[0].shape, (Shape{2, 3, 1}));
  EXPECT_EQ(run_op("aten.unsqueeze.default", {x}, {{"dim", int64_t{-3}}}).metas[0].shape, (Shape{1, 2, 3}));
  EXPECT_EQ(run_op("aten.unsqueeze.default", {f32({}, {2})}, {{"dim", int64_t{0}}}).metas[0].shape, (Shape{1}));
  EXPECT_THROW(run_op("aten.unsqueeze.default", {x}, {{"dim", int64_t{3}}}), Error);
  EXPECT_THROW(run_op("aten.unsqueeze.default", {x}, {{"dim", int64_t{-4}}}), Error);
  EXPECT_THROW(run_op("aten.unsqueeze.default", {x}), Error);  // dim is required
}

TEST(Permute, MovesEveryElement) {
  const OpResult r = run_op("aten.permute.default", {iota_f32({2, 3, 4})}, {{"dims", ints_attr({2, 0, 1})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{4, 2, 3}));
  // out[a][b][c] = in[b][c][a] = 12b + 4c + a
  EXPECT_EQ(floats(r.outputs[0]),
            (std::vector<float>{0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}));
  const OpResult negative = run_op("aten.permute.default", {iota_f32({2, 3, 4})}, {{"dims", ints_attr({-1, 0, -2})}});
  EXPECT_EQ(floats(negative.outputs[0]), floats(r.outputs[0]));
  EXPECT_THROW(run_op("aten.permute.default", {iota_f32({2, 3, 4})}, {{"dims", ints_attr({0, 0, 1})}}), Error);
  EXPECT_THROW(run_op("aten.permute.default", {iota_f32({2, 3, 4})}, {{"dims", ints_attr({0, 1})}}), Error);
  EXPECT_THROW(run_op("aten.permute.default", {iota_f32({2, 3, 4})}, {{"dims", ints_attr({0, 1, 3})}}), Error);
}

TEST(Transpose, IntAndBoolWithNegativeDims) {
  const OpResult r = run_op("aten.transpose.int", {iota_i64({2, 3})}, {{"dim0", int64_t{0}}, {"dim1", int64_t{-1}}});
  EXPECT_EQ(r.metas[0], (TensorMeta{{3, 2}, DType::Int64}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  const OpResult b =
      run_op("aten.transpose.int", {boolean({1, 2, 2}, {1, 1, 0, 0})}, {{"dim0", int64_t{-2}}, {"dim1", int64_t{2}}});
  EXPECT_EQ(bools(b.outputs[0]), (std::vector<uint8_t>{1, 0, 1, 0}));
  const OpResult swapped =
      run_op("aten.swapaxes.default", {iota_f32({2, 1, 3})}, {{"axis0", int64_t{2}}, {"axis1", int64_t{0}}});
  EXPECT_EQ(swapped.metas[0].shape, (Shape{3, 1, 2}));
  EXPECT_EQ(floats(swapped.outputs[0]), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(
      run_op("aten.transpose.int", {iota_f32({0, 3})}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}).metas[0].shape,
      (Shape{3, 0}));
  EXPECT_THROW(run_op("aten.transpose.int", {iota_f32({2, 3})}, {{"dim0", int64_t{0}}, {"dim1", int64_t{2}}}), Error);
  EXPECT_THROW(run_op("aten.transpose.int", {iota_f32({2, 3})}, {{"dim0", int64_t{0}}}), Error);
}

TEST(Expand, MinusOneKeepsAndNewLeadingDims) {
  const OpResult r = run_op("aten.expand.default", {f32({3, 1}, {1, 2, 3})}, {{"size", ints_attr({2, -1, 2})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 3, 2}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  // As in the Qwen attention mask: bool, -1 on an existing dimension.
  const OpResult mask =
      run_op("aten.expand.default", {boolean({1, 1, 2, 2}, {1, 0, 1, 1})}, {{"size", ints_attr({1, -1, 2, 2})}});
  EXPECT_EQ(mask.metas[0], (TensorMeta{{1, 1, 2, 2}, DType::Bool}));
  EXPECT_EQ(bools(mask.outputs[0]), (std::vector<uint8_t>{1, 0, 1, 1}));
  const OpResult as = run_op("aten.expand_as.default", {i64({2}, {5, -6}), iota_f32({2, 2})});
  EXPECT_EQ(as.metas[0], (TensorMeta{{2, 2}, DType::Int64}));
  EXPECT_EQ(ints(as.outputs[0]), (std::vector<int64_t>{5, -6, 5, -6}));
  EXPECT_EQ(run_op("aten.expand.default", {iota_f32({1})}, {{"size", ints_attr({0})}}).outputs[0].numel(), 0);
}

TEST(Expand, RejectsIncompatibleSizes) {
  const Tensor x = f32({3, 1}, {1, 2, 3});
  EXPECT_THROW(run_op("aten.expand.default", {x}, {{"size", ints_attr({2, 4})}}), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, {{"size", ints_attr({4})}}), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, {{"size", ints_attr({-1, 3, 1})}}), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, {{"size", ints_attr({3, -2})}}), Error);
  EXPECT_THROW(run_op("aten.expand.default", {x}, {{"size", ints_attr({int64_t{1} << 30, 1 << 20, 3, 1})}}), Error);
}

TEST(Repeat, TilesWithNewLeadingDims) {
  const OpResult r = run_op("aten.repeat.default", {i64({2, 2}, {1, 2, 3, 4})}, {{"repeats", ints_attr({1, 2, 3})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{1, 4, 6}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4,  //
                                                      1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
  EXPECT_EQ(run_op("aten.repeat.default", {iota_f32({3})}, {{"repeats", ints_attr({0})}}).metas[0].shape, (Shape{0}));
  EXPECT_THROW(run_op("aten.repeat.default", {iota_f32({2, 2})}, {{"repeats", ints_attr({2})}}), Error);
  EXPECT_THROW(run_op("aten.repeat.default", {iota_f32({2})}, {{"repeats", ints_attr({-1})}}), Error);
}

TEST(Slice, OpenEndNegativeStartAndStep) {
  const Tensor x = iota_f32({2, 10});
  const OpResult open =
      run_op("aten.slice.Tensor", {x}, {{"dim", int64_t{1}}, {"start", int64_t{8}}, {"end", kInt64Max}});
  EXPECT_EQ(open.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(floats(open.outputs[0]), (std::vector<float>{8, 9, 18, 19}));
  const OpResult stepped =
      run_op("aten.slice.Tensor", {x},
             {{"dim", int64_t{-1}}, {"start", int64_t{-3}}, {"end", kInt64Max}, {"step", int64_t{2}}});
  EXPECT_EQ(stepped.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(floats(stepped.outputs[0]), (std::vector<float>{7, 9, 17, 19}));
  const OpResult every_third = run_op("aten.slice.Tensor", {x}, {{"dim", int64_t{1}}, {"step", int64_t{3}}});
  EXPECT_EQ(floats(every_third.outputs[0]), (std::vector<float>{0, 3, 6, 9, 10, 13, 16, 19}));
  const OpResult tail =
      run_op("aten.slice.Tensor", {x}, {{"dim", int64_t{1}}, {"start", int64_t{-100}}, {"end", int64_t{-8}}});
  EXPECT_EQ(floats(tail.outputs[0]), (std::vector<float>{0, 1, 10, 11}));
}

TEST(Slice, DefaultsNullsAndEmptyRanges) {
  const Tensor x = iota_i64({3, 2});
  const OpResult rows = run_op("aten.slice.Tensor", {x}, {{"start", int64_t{1}}});  // dim defaults to 0
  EXPECT_EQ(ints(rows.outputs[0]), (std::vector<int64_t>{2, 3, 4, 5}));
  const OpResult nulls = run_op("aten.slice.Tensor", {x}, {{"start", NoneValue{}}, {"end", NoneValue{}}});
  EXPECT_EQ(ints(nulls.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  const OpResult empty =
      run_op("aten.slice.Tensor", {x}, {{"dim", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{1}}});
  EXPECT_EQ(empty.metas[0].shape, (Shape{3, 0}));
  const OpResult bools_out =
      run_op("aten.slice.Tensor", {boolean({4}, {0, 1, 1, 0})}, {{"start", int64_t{1}}, {"end", int64_t{3}}});
  EXPECT_EQ(bools(bools_out.outputs[0]), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(run_op("aten.slice.Tensor", {iota_f32({0})}).metas[0].shape, (Shape{0}));
}

TEST(Slice, RejectsBadAttributes) {
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota_f32({4})}, {{"step", int64_t{0}}}), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota_f32({4})}, {{"step", int64_t{-1}}}), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota_f32({4})}, {{"dim", int64_t{1}}}), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {f32({}, {1})}), Error);
  EXPECT_THROW(run_op("aten.slice.Tensor", {iota_f32({4})}, {{"start", 1.5}}), Error);
}

TEST(Select, NegativeIndexAndDim) {
  const OpResult r = run_op("aten.select.int", {iota_f32({2, 3, 4})}, {{"dim", int64_t{1}}, {"index", int64_t{-1}}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 4}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  const OpResult scalar =
      run_op("aten.select.int", {i64({3}, {4, 5, 6})}, {{"dim", int64_t{-1}}, {"index", int64_t{1}}});
  EXPECT_EQ(scalar.metas[0].shape, (Shape{}));
  EXPECT_EQ(ints(scalar.outputs[0]), (std::vector<int64_t>{5}));
  EXPECT_THROW(run_op("aten.select.int", {iota_f32({2, 3})}, {{"dim", int64_t{1}}, {"index", int64_t{3}}}), Error);
  EXPECT_THROW(run_op("aten.select.int", {iota_f32({2, 3})}, {{"dim", int64_t{1}}, {"index", int64_t{-4}}}), Error);
}

TEST(Narrow, NegativeStart) {
  const OpResult r = run_op("aten.narrow.default", {iota_f32({2, 5})},
                            {{"dim", int64_t{1}}, {"start", int64_t{-3}}, {"length", int64_t{2}}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{2, 3, 7, 8}));
  EXPECT_THROW(run_op("aten.narrow.default", {iota_f32({2, 5})},
                      {{"dim", int64_t{1}}, {"start", int64_t{4}}, {"length", int64_t{2}}}),
               Error);
  EXPECT_THROW(run_op("aten.narrow.default", {iota_f32({2, 5})},
                      {{"dim", int64_t{1}}, {"start", int64_t{0}}, {"length", int64_t{-1}}}),
               Error);
}

TEST(Cat, SkipsTheEmptyKvCacheOfPrefillGraphs) {
  // As in the exported prefill graph: cat([empty [0] cache, new keys], dim=-2).
  const Tensor keys = iota_f32({1, 2, 3, 2});
  const OpResult r =
      run_op("aten.cat.default", {f32({0}, {}), keys}, {{"dim", int64_t{-2}}, {"_tensor_list_sizes", ints_attr({2})}});
  EXPECT_EQ(r.metas[0], (TensorMeta{{1, 2, 3, 2}, DType::Float32}));
  EXPECT_EQ(floats(r.outputs[0]), iota_values(12));
}

TEST(Cat, ThreeInputsAlongTheLastDim) {
  const OpResult r = run_op("aten.cat.default", {f32({2, 1}, {0, 1}), f32({2, 2}, {2, 3, 4, 5}), iota_f32({2, 3})},
                            {{"dim", int64_t{-1}}, {"_tensor_list_sizes", ints_attr({3})}});
  EXPECT_EQ(r.metas[0].shape, (Shape{2, 6}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{0, 2, 3, 0, 1, 2, 1, 4, 5, 3, 4, 5}));
}

TEST(Cat, DefaultDimPromotionAndOtherDtypes) {
  const OpResult rows = run_op("aten.cat.default", {i64({1, 2}, {1, 2}), i64({2, 2}, {3, 4, 5, 6})});
  EXPECT_EQ(rows.metas[0], (TensorMeta{{3, 2}, DType::Int64}));
  EXPECT_EQ(ints(rows.outputs[0]), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const OpResult mixed = run_op("aten.cat.default", {i64({2}, {1, 2}), f32({1}, {0.5f})});
  EXPECT_EQ(mixed.metas[0], (TensorMeta{{3}, DType::Float32}));
  EXPECT_EQ(floats(mixed.outputs[0]), (std::vector<float>{1, 2, 0.5f}));
  const OpResult b = run_op("aten.cat.default", {boolean({1}, {1}), boolean({2}, {0, 1})});
  EXPECT_EQ(bools(b.outputs[0]), (std::vector<uint8_t>{1, 0, 1}));
  const OpResult empties = run_op("aten.cat.default", {f32({0}, {}), f32({0}, {})});
  EXPECT_EQ(empties.metas[0].shape, (Shape{0}));
  const OpResult zero_rows = run_op("aten.cat.default", {iota_f32({0, 2}), iota_f32({1, 2})});
  EXPECT_EQ(floats(zero_rows.outputs[0]), (std::vector<float>{0, 1}));
}

TEST(Cat, RejectsMismatchedInputs) {
  EXPECT_THROW(run_op("aten.cat.default", {iota_f32({2, 2}), iota_f32({2, 3})}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {iota_f32({2, 2}), iota_f32({2, 2, 1})}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {f32({}, {1}), f32({}, {2})}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {iota_f32({2}), iota_f32({2})}, {{"dim", int64_t{1}}}), Error);
  EXPECT_THROW(run_op("aten.cat.default", {iota_f32({2}), iota_f32({2})}, {{"_tensor_list_sizes", ints_attr({3})}}),
               Error);
}

TEST(Stack, NewDimAtFrontAndBack) {
  const Tensor a = i64({2}, {1, 2});
  const Tensor b = i64({2}, {3, 4});
  const OpResult front = run_op("aten.stack.default", {a, b});
  EXPECT_EQ(front.metas[0].shape, (Shape{2, 2}));
  EXPECT_EQ(ints(front.outputs[0]), (std::vector<int64_t>{1, 2, 3, 4}));
  const OpResult back = run_op("aten.stack.default", {a, b, a}, {{"dim", int64_t{-1}}});
  EXPECT_EQ(back.metas[0].shape, (Shape{2, 3}));
  EXPECT_EQ(ints(back.outputs[0]), (std::vector<int64_t>{1, 3, 1, 2, 4, 2}));
  EXPECT_THROW(run_op("aten.stack.default", {a, i64({3}, {1, 2, 3})}), Error);
  EXPECT_THROW(run_op("aten.stack.default", {a, b}, {{"dim", int64_t{2}}}), Error);
}

TEST(Split, SplitSizeAndSizes) {
  const OpResult r = run_op("aten.split.Tensor", {iota_f32({5, 2})}, {{"split_size", int64_t{2}}});
  ASSERT_EQ(r.metas.size(), 3u);
  EXPECT_EQ(r.metas[2].shape, (Shape{1, 2}));
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(floats(r.outputs[1]), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(floats(r.outputs[2]), (std::vector<float>{8, 9}));
  const OpResult sizes = run_op("aten.split_with_sizes.default", {iota_i64({2, 3})},
                                {{"split_sizes", ints_attr({1, 0, 2})}, {"dim", int64_t{-1}}});
  ASSERT_EQ(sizes.metas.size(), 3u);
  EXPECT_EQ(ints(sizes.outputs[0]), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(sizes.metas[1].shape, (Shape{2, 0}));
  EXPECT_EQ(ints(sizes.outputs[2]), (std::vector<int64_t>{1, 2, 4, 5}));
  EXPECT_EQ(run_op("aten.split.Tensor", {iota_f32({3})}, {{"split_size", int64_t{5}}}).metas.size(), 1u);
  EXPECT_EQ(run_op("aten.split.Tensor", {iota_f32({0})}, {{"split_size", int64_t{0}}}).metas.size(), 1u);
}

TEST(Split, RejectsBadSizes) {
  EXPECT_THROW(run_op("aten.split.Tensor", {iota_f32({4})}, {{"split_size", int64_t{0}}}), Error);
  EXPECT_THROW(run_op("aten.split.Tensor", {iota_f32({4})}, {{"split_size", int64_t{-1}}}), Error);
  EXPECT_THROW(run_op("aten.split_with_sizes.default", {iota_f32({4})}, {{"split_sizes", ints_attr({1, 2})}}), Error);
  EXPECT_THROW(run_op("aten.split_with_sizes.default", {iota_f32({4})}, {{"split_sizes", ints_attr({5, -1})}}), Error);
}

TEST(Chunk, UnevenAndEmpty) {
  const OpResult r = run_op("aten.chunk.default", {iota_f32({5})}, {{"chunks", int64_t{3}}});
  ASSERT_EQ(r.metas.size(), 3u);
  EXPECT_EQ(floats(r.outputs[0]), (std::vector<float>{0, 1}));
  EXPECT_EQ(floats(r.outputs[1]), (std::vector<float>{2, 3}));
  EXPECT_EQ(floats(r.outputs[2]), (std::vector<float>{4}));
  EXPECT_EQ(
      run_op("aten.chunk.default", {iota_f32({2, 6})}, {{"chunks", int64_t{4}}, {"dim", int64_t{-1}}}).metas.size(),
      3u);  // chunk size 2
  const OpResult empty = run_op("aten.chunk.default", {iota_f32({0})}, {{"chunks", int64_t{3}}});
  EXPECT_EQ(empty.metas.size(), 3u);
  EXPECT_THROW(run_op("aten.chunk.default", {iota_f32({4})}, {{"chunks", int64_t{0}}}), Error);
}

TEST(Unbind, OneOutputPerIndex) {
  const OpResult r = run_op("aten.unbind.int", {iota_i64({2, 3})}, {{"dim", int64_t{-1}}});
  ASSERT_EQ(r.metas.size(), 3u);
  EXPECT_EQ(r.metas[0].shape, (Shape{2}));
  EXPECT_EQ(ints(r.outputs[0]), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(ints(r.outputs[1]), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(ints(r.outputs[2]), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(run_op("aten.unbind.int", {iota_i64({0, 3})}).metas.size(), 0u);
}

TEST(Flip, OneAndTwoDims) {
  EXPECT_EQ(floats(run_op("aten.flip.default", {iota_f32({2, 3})}, {{"dims", ints_attr({0, -1})}}).outputs[0]),
            (std::vector<float>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(ints(run_op("aten.flip.default", {iota_i64({2, 3})}, {{"dims", ints_attr({1})}}).outputs[0]),
            (std::vector<int64_t>{2, 1, 0, 5, 4, 3}));
  EXPECT_EQ(run_op("aten.flip.default", {iota_f32({0, 3})}, {{"dims", ints_attr({0})}}).metas[0].shape, (Shape{0, 3}));
  EXPECT_THROW(run_op("aten.flip.default", {iota_f32({2, 3})}, {{"dims", ints_attr({1, -1})}}), Error);
}

TEST(Roll, FlatAndPerDim) {
  EXPECT_EQ(floats(run_op("aten.roll.default", {iota_f32({5})}, {{"shifts", ints_attr({2})}}).outputs[0]),
            (std::vector<float>{3, 4, 0, 1, 2}));
  EXPECT_EQ(floats(run_op("aten.roll.default", {iota_f32({2, 3})}, {{"shifts", ints_attr({1})}}).outputs[0]),
            (std::vector<float>{5, 0, 1, 2, 3, 4}));
  EXPECT_EQ(ints(run_op("aten.roll.default", {iota_i64({2, 3})},
                        {{"shifts", ints_attr({1, -1})}, {"dims", ints_attr({0, 1})}})
                     .outputs[0]),
            (std::vector<int64_t>{4, 5, 3, 1, 2, 0}));
  EXPECT_THROW(run_op("aten.roll.default", {iota_f32({2, 3})}, {{"shifts", ints_attr({1, 2})}}), Error);
  EXPECT_THROW(
      run_op("aten.roll.default", {iota_f32({2, 3})}, {{"shifts", ints_attr({1})}, {"dims", ints_attr({0, 1})}}),
      Error);
}

TEST(ShapeOps, EmptyTensorsFlowThrough) {
  const Tensor empty = iota_f32({0, 1, 3});
  EXPECT_EQ(run_op("aten.permute.default", {empty}, {{"dims", ints_attr({2, 0, 1})}}).metas[0].shape, (Shape{3, 0, 1}));
  EXPECT_EQ(run_op("aten.expand.default", {empty}, {{"size", ints_attr({0, 4, 3})}}).metas[0].shape, (Shape{0, 4, 3}));
  EXPECT_EQ(run_op("aten.repeat.default", {empty}, {{"repeats", ints_attr({2, 2, 2})}}).metas[0].shape,
            (Shape{0, 2, 6}));
  EXPECT_EQ(run_op("aten.select.int", {empty}, {{"dim", int64_t{1}}, {"index", int64_t{0}}}).metas[0].shape,
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
