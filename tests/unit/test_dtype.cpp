#include <gtest/gtest.h>

#include <cmath>

#include "npusim/dtype.h"
#include "npusim/tensor.h"

using namespace npusim;

TEST(DType, ParsesTorchAndSafetensorsNames) {
  EXPECT_EQ(parse_dtype("torch.float32"), DType::Float32);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BFloat16);
  EXPECT_EQ(parse_dtype("BF16"), DType::BFloat16);
  EXPECT_EQ(parse_dtype("torch.bool"), DType::Bool);
  EXPECT_EQ(parse_dtype("I64"), DType::Int64);
  EXPECT_FALSE(parse_dtype("complex64").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
}

TEST(DType, HalfConversionsRoundTripExactValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-08f}) {
    EXPECT_EQ(fp16_to_float(float_to_fp16(v)), v) << v;
  }
  for (float v : {0.0f, 1.0f, -2.5f, 3.0e38f, 1.0e-38f}) {
    const float back = bf16_to_float(float_to_bf16(v));
    EXPECT_NEAR(back, v, std::abs(v) / 128.0f) << v;
  }
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256.0f), float_to_bf16(1.0f));  // ties go to even
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(1.0e6f))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(Tensor, ConvertsBetweenDtypes) {
  Tensor t(DType::Float32, {2, 3});
  for (int i = 0; i < 6; ++i) t.mutable_data<float>()[i] = static_cast<float>(i) - 2.5f;
  Tensor as_int = t.to(DType::Int64);
  EXPECT_EQ(as_int.data<int64_t>()[0], -2);
  EXPECT_EQ(as_int.data<int64_t>()[5], 2);
  Tensor as_bf16 = t.to(DType::BFloat16).to(DType::Float32);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(as_bf16.data<float>()[i], t.data<float>()[i]);
  EXPECT_THROW(t.reshaped({4, 2}).reshaped({7}), Error);
  EXPECT_THROW(shape_numel({-1, 2}), Error);
}
