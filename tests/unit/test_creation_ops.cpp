#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

// ---------------------------------------------------------------------------------------------------------------

TEST(Arange, EndOnlyAsInExportedGraphs) {
  const OpRun r = run_op("aten.arange.default", {},
                         make_attrs({{"end", int64_t{5}}, {"device", std::string("meta")}, {"pin_memory", false}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{5}, DType::Int64}));
  EXPECT_EQ(int_values(r.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const OpRun f = run_op("aten.arange.default", {}, make_attrs({{"end", 2.5}}));
  EXPECT_EQ(f.metas[0], (TensorMeta{{3}, DType::Float32}));
  EXPECT_EQ(float_values(f.outputs[0]), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(run_op("aten.arange.default", {}, make_attrs({{"end", int64_t{0}}})).metas[0].shape, (Shape{0}));
}

TEST(Arange, StartAndStepVariants) {
  EXPECT_EQ(
      int_values(run_op("aten.arange.start", {}, make_attrs({{"start", int64_t{-1}}, {"end", int64_t{3}}})).outputs[0]),
      (std::vector<int64_t>{-1, 0, 1, 2}));
  EXPECT_EQ(int_values(run_op("aten.arange.start_step", {},
                              make_attrs({{"start", int64_t{10}}, {"end", int64_t{0}}, {"step", int64_t{-3}}}))
                           .outputs[0]),
            (std::vector<int64_t>{10, 7, 4, 1}));
  const OpRun f =
      run_op("aten.arange.start_step", {}, make_attrs({{"start", int64_t{1}}, {"end", 2.5}, {"step", 0.5}}));
  EXPECT_EQ(f.metas[0].dtype, DType::Float32);
  EXPECT_EQ(float_values(f.outputs[0]), (std::vector<float>{1, 1.5f, 2}));
  EXPECT_EQ(run_op("aten.arange.start_step", {},
                   make_attrs({{"start", int64_t{0}}, {"end", int64_t{9}}, {"step", int64_t{3}}}))
                .metas[0]
                .shape,
            (Shape{3}));
}

TEST(Arange, DtypeAttributeWins) {
  const OpRun f =
      run_op("aten.arange.default", {}, make_attrs({{"end", int64_t{3}}, {"dtype", std::string("torch.float32")}}));
  EXPECT_EQ(f.metas[0].dtype, DType::Float32);
  EXPECT_EQ(float_values(f.outputs[0]), (std::vector<float>{0, 1, 2}));
  const OpRun half =
      run_op("aten.arange.default", {}, make_attrs({{"end", int64_t{2}}, {"dtype", std::string("torch.bfloat16")}}));
  EXPECT_EQ(half.metas[0].dtype, DType::BFloat16);
  EXPECT_EQ(float_values(half.outputs[0]), (std::vector<float>{0, 1}));
  // Integer outputs truncate the bounds and the step first, like PyTorch: arange(0, 5.5, 1.5, dtype=int64).
  const OpRun truncated =
      run_op("aten.arange.start_step", {},
             make_attrs({{"start", int64_t{0}}, {"end", 5.5}, {"step", 1.5}, {"dtype", std::string("torch.int64")}}));
  EXPECT_EQ(int_values(truncated.outputs[0]), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Arange, RejectsBadRanges) {
  EXPECT_THROW(run_op("aten.arange.start_step", {},
                      make_attrs({{"start", int64_t{0}}, {"end", int64_t{4}}, {"step", int64_t{0}}})),
               Error);
  EXPECT_THROW(run_op("aten.arange.start_step", {},
                      make_attrs({{"start", int64_t{0}}, {"end", int64_t{4}}, {"step", int64_t{-1}}})),
               Error);
  EXPECT_THROW(run_op("aten.arange.default", {}, make_attrs({{"end", int64_t{-3}}})), Error);
  EXPECT_THROW(run_op("aten.arange.default", {}, make_attrs({{"end", int64_t{1} << 41}})), Error);
  EXPECT_THROW(run_op("aten.arange.default", {}, make_attrs({{"end", INFINITY}})), Error);
  EXPECT_THROW(
      run_op("aten.arange.default", {}, make_attrs({{"end", int64_t{3}}, {"dtype", std::string("torch.bool")}})),
      Error);
  EXPECT_THROW(run_op("aten.arange.default", {}, make_attrs({{"end", std::string("3")}})), Error);
  EXPECT_THROW(run_op("aten.arange.default", {}), Error);  // end is required
}

TEST(Full, DtypeFollowsTheFillValue) {
  const OpRun f = run_op("aten.full.default", {}, make_attrs({{"size", ints_attr({2, 3})}, {"fill_value", 1.5}}));
  EXPECT_EQ(f.metas[0], (TensorMeta{{2, 3}, DType::Float32}));
  EXPECT_EQ(float_values(f.outputs[0]), std::vector<float>(6, 1.5f));
  const OpRun i = run_op("aten.full.default", {}, make_attrs({{"size", ints_attr({2})}, {"fill_value", int64_t{-7}}}));
  EXPECT_EQ(i.metas[0].dtype, DType::Int64);
  EXPECT_EQ(int_values(i.outputs[0]), (std::vector<int64_t>{-7, -7}));
  const OpRun b = run_op("aten.full.default", {}, make_attrs({{"size", ints_attr({1, 2})}, {"fill_value", true}}));
  EXPECT_EQ(b.metas[0].dtype, DType::Bool);
  EXPECT_EQ(bool_values(b.outputs[0]), (std::vector<uint8_t>{1, 1}));
  const OpRun h = run_op(
      "aten.full.default", {},
      make_attrs({{"size", ints_attr({})}, {"fill_value", int64_t{2}}, {"dtype", std::string("torch.float16")}}));
  EXPECT_EQ(h.metas[0], (TensorMeta{{}, DType::Float16}));
  EXPECT_EQ(float_values(h.outputs[0]), (std::vector<float>{2}));
  EXPECT_EQ(run_op("aten.full.default", {}, make_attrs({{"size", ints_attr({0, 4})}, {"fill_value", 1.0}}))
                .outputs[0]
                .numel(),
            0);
}

TEST(Full, ZerosOnesAndEmpty) {
  const OpRun zeros =
      run_op("aten.zeros.default", {}, make_attrs({{"size", ints_attr({2})}, {"dtype", std::string("torch.int64")}}));
  EXPECT_EQ(zeros.metas[0], (TensorMeta{{2}, DType::Int64}));
  EXPECT_EQ(int_values(zeros.outputs[0]), (std::vector<int64_t>{0, 0}));
  const OpRun ones = run_op("aten.ones.default", {}, make_attrs({{"size", ints_attr({3})}}));
  EXPECT_EQ(ones.metas[0].dtype, DType::Float32);
  EXPECT_EQ(float_values(ones.outputs[0]), (std::vector<float>{1, 1, 1}));
  const OpRun empty = run_op("aten.empty.memory_format", {},
                             make_attrs({{"size", ints_attr({2, 1})}, {"dtype", std::string("torch.bool")}}));
  EXPECT_EQ(empty.metas[0], (TensorMeta{{2, 1}, DType::Bool}));
  EXPECT_EQ(bool_values(empty.outputs[0]), (std::vector<uint8_t>{0, 0}));
}

TEST(Full, RejectsNegativeAndAbsurdSizes) {
  EXPECT_THROW(run_op("aten.full.default", {}, make_attrs({{"size", ints_attr({2, -1})}, {"fill_value", 1.0}})), Error);
  EXPECT_THROW(
      run_op("aten.zeros.default", {}, make_attrs({{"size", ints_attr({int64_t{1} << 21, int64_t{1} << 20})}})), Error);
  EXPECT_THROW(run_op("aten.ones.default", {}, make_attrs({{"size", ints_attr({int64_t{1} << 62, 4, 0})}})), Error);
  EXPECT_THROW(run_op("aten.full.default", {}, make_attrs({{"fill_value", 1.0}})), Error);       // no size
  EXPECT_THROW(run_op("aten.full.default", {}, make_attrs({{"size", ints_attr({2})}})), Error);  // no fill value
  EXPECT_THROW(
      run_op("aten.full.default", {},
             make_attrs({{"size", ints_attr({2})}, {"fill_value", 1.0}, {"dtype", std::string("torch.complex64")}})),
      Error);
  EXPECT_THROW(
      run_op("aten.full.default", {},
             make_attrs({{"size", ints_attr({1})}, {"fill_value", 1e300}, {"dtype", std::string("torch.int64")}})),
      Error);
}

TEST(FullLike, KeepsShapeAndDtype) {
  const Tensor ints_in = iota({2, 2}, DType::Int64);
  const OpRun f = run_op("aten.full_like.default", {ints_in}, make_attrs({{"fill_value", 2.7}}));
  EXPECT_EQ(f.metas[0], (TensorMeta{{2, 2}, DType::Int64}));
  EXPECT_EQ(int_values(f.outputs[0]), (std::vector<int64_t>{2, 2, 2, 2}));  // converted to the input dtype
  const OpRun zeros = run_op("aten.zeros_like.default", {bools({3}, {1, 1, 1})});
  EXPECT_EQ(bool_values(zeros.outputs[0]), (std::vector<uint8_t>{0, 0, 0}));
  const OpRun ones = run_op("aten.ones_like.default", {ints_in}, make_attrs({{"dtype", std::string("torch.float32")}}));
  EXPECT_EQ(ones.metas[0].dtype, DType::Float32);
  EXPECT_EQ(float_values(ones.outputs[0]), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(run_op("aten.empty_like.default", {iota({0, 2})}).metas[0].shape, (Shape{0, 2}));
}

TEST(NewFull, TemplateLendsOnlyTheDtype) {
  // As in the Qwen prefill graph: new_ones(int64 [1,1,16,1], size=[], dtype=torch.bool) -> a bool scalar.
  const OpRun r =
      run_op("aten.new_ones.default", {iota({1, 1, 16, 1}, DType::Int64)},
             make_attrs({{"size", ints_attr({})}, {"dtype", std::string("torch.bool")}, {"pin_memory", false}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{}, DType::Bool}));
  EXPECT_EQ(bool_values(r.outputs[0]), (std::vector<uint8_t>{1}));
  const OpRun zeros =
      run_op("aten.new_zeros.default", {iota({5}, DType::Int64)}, make_attrs({{"size", ints_attr({2, 1})}}));
  EXPECT_EQ(zeros.metas[0], (TensorMeta{{2, 1}, DType::Int64}));
  EXPECT_EQ(int_values(zeros.outputs[0]), (std::vector<int64_t>{0, 0}));
  const OpRun full =
      run_op("aten.new_full.default", {iota({1})}, make_attrs({{"size", ints_attr({3})}, {"fill_value", int64_t{4}}}));
  EXPECT_EQ(full.metas[0].dtype, DType::Float32);
  EXPECT_EQ(float_values(full.outputs[0]), (std::vector<float>{4, 4, 4}));
  EXPECT_EQ(
      float_values(run_op("aten.new_empty.default", {iota({1})}, make_attrs({{"size", ints_attr({2})}})).outputs[0]),
      (std::vector<float>{0, 0}));
  EXPECT_THROW(run_op("aten.new_ones.default", {iota({1})}, make_attrs({{"size", ints_attr({-2})}})), Error);
  EXPECT_THROW(run_op("aten.new_ones.default", {iota({1})}), Error);  // no size
}

TEST(ScalarTensor, DefaultsToFloat32) {
  const OpRun r = run_op("aten.scalar_tensor.default", {}, make_attrs({{"s", int64_t{3}}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{}, DType::Float32}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{3}));
  const OpRun b =
      run_op("aten.scalar_tensor.default", {}, make_attrs({{"s", true}, {"dtype", std::string("torch.bool")}}));
  EXPECT_EQ(bool_values(b.outputs[0]), (std::vector<uint8_t>{1}));
  EXPECT_THROW(run_op("aten.scalar_tensor.default", {}), Error);
}

TEST(Linspace, EndpointsAndIntegerOutput) {
  const OpRun r = run_op("aten.linspace.default", {},
                         make_attrs({{"start", int64_t{0}}, {"end", int64_t{1}}, {"steps", int64_t{5}}}));
  EXPECT_EQ(r.metas[0], (TensorMeta{{5}, DType::Float32}));
  EXPECT_EQ(float_values(r.outputs[0]), (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1}));
  const OpRun i = run_op(
      "aten.linspace.default", {},
      make_attrs(
          {{"start", int64_t{0}}, {"end", int64_t{10}}, {"steps", int64_t{4}}, {"dtype", std::string("torch.int64")}}));
  EXPECT_EQ(int_values(i.outputs[0]), (std::vector<int64_t>{0, 3, 6, 10}));
  EXPECT_EQ(float_values(
                run_op("aten.linspace.default", {}, make_attrs({{"start", 2.5}, {"end", 9.0}, {"steps", int64_t{1}}}))
                    .outputs[0]),
            (std::vector<float>{2.5f}));
  EXPECT_EQ(run_op("aten.linspace.default", {}, make_attrs({{"start", 0.0}, {"end", 1.0}, {"steps", int64_t{0}}}))
                .metas[0]
                .shape,
            (Shape{0}));
  EXPECT_THROW(run_op("aten.linspace.default", {}, make_attrs({{"start", 0.0}, {"end", 1.0}, {"steps", int64_t{-1}}})),
               Error);
}

// ---------------------------------------------------------------------------------------------------------------
// Rotary embedding (`wrap_with_set_grad_enabled`)

void expect_rope_tables(const OpRun& r, const std::vector<float>& inv_freq, const std::vector<int64_t>& positions,
                        float scaling) {
  const size_t half = inv_freq.size();
  ASSERT_EQ(r.outputs.size(), 2u);
  const std::vector<float> cos_table = float_values(r.outputs[0]);
  const std::vector<float> sin_table = float_values(r.outputs[1]);
  ASSERT_EQ(cos_table.size(), positions.size() * 2 * half);
  for (size_t row = 0; row < positions.size(); ++row) {
    for (size_t d = 0; d < 2 * half; ++d) {
      const float angle = static_cast<float>(positions[row]) * inv_freq[d % half];
      EXPECT_FLOAT_EQ(cos_table[row * 2 * half + d], std::cos(angle) * scaling) << row << "," << d;
      EXPECT_FLOAT_EQ(sin_table[row * 2 * half + d], std::sin(angle) * scaling) << row << "," << d;
    }
  }
}

TEST(RotaryEmbedding, MatchesTheHuggingFaceFormula) {
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f};
  const std::vector<int64_t> positions = {0, 1, 5, 7, 100, 2047};
  const OpRun r = run_op("wrap_with_set_grad_enabled", {floats({3}, inv_freq), ints({2, 3}, positions)});
  ASSERT_EQ(r.metas.size(), 2u);
  EXPECT_EQ(r.metas[0], (TensorMeta{{2, 3, 6}, DType::Float32}));
  EXPECT_EQ(r.metas[1], (TensorMeta{{2, 3, 6}, DType::Float32}));
  expect_rope_tables(r, inv_freq, positions, 1.0f);
  // Position 0: cos = 1 and sin = 0 everywhere; position 1 with inv_freq 1: exactly cos(1), sin(1).
  EXPECT_EQ(float_values(r.outputs[0])[0], 1.0f);
  EXPECT_EQ(float_values(r.outputs[1])[5], 0.0f);
  EXPECT_FLOAT_EQ(float_values(r.outputs[0])[6], 0.5403023f);
  EXPECT_FLOAT_EQ(float_values(r.outputs[1])[9], 0.84147098f);
}

TEST(RotaryEmbedding, AttentionScalingAndHalfPrecisionTables) {
  const std::vector<float> inv_freq = {0.5f, 0.25f};
  const OpRun r = run_op("wrap_with_set_grad_enabled", {floats({2}, inv_freq), ints({1, 2}, {3, 4})},
                         make_attrs({{"attention_scaling", 0.5}}));
  expect_rope_tables(r, inv_freq, {3, 4}, 0.5f);
  const OpRun bf16 =
      run_op("wrap_with_set_grad_enabled", {floats({2}, inv_freq).to(DType::BFloat16), ints({1, 1}, {2})});
  EXPECT_EQ(bf16.metas[0], (TensorMeta{{1, 1, 4}, DType::BFloat16}));
}

TEST(RotaryEmbedding, RejectsOtherForms) {
  const Tensor inv_freq = floats({2}, {1, 0.5f});
  const Tensor positions = ints({1, 2}, {0, 1});
  for (const std::vector<Tensor>& inputs :
       {std::vector<Tensor>{inv_freq}, std::vector<Tensor>{inv_freq, positions, positions},
        std::vector<Tensor>{positions, inv_freq}, std::vector<Tensor>{iota({1, 2}), positions},
        std::vector<Tensor>{inv_freq, iota({1, 2})}, std::vector<Tensor>{inv_freq, ints({2}, {0, 1})}}) {
    try {
      run_op("wrap_with_set_grad_enabled", inputs);
      ADD_FAILURE() << "accepted " << inputs.size() << " inputs";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "only the Hugging Face rotary-embedding form (inv_freq, position_ids) is supported"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
