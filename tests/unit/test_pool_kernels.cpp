// The fast max_pool2d kernel against the registry's reference, every element, including NaN propagation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/kernels.h"
#include "npusim/op_registry.h"
#include "unit/random_values.h"

namespace npusim::cpu {
namespace {

using test::random_tensor;

Tensor rounded(const Tensor& t, Elem elem) {
  std::vector<std::byte> bytes(static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * elem_size(elem));
  tensor_to_storage(t, bytes.data(), elem);
  return storage_to_tensor(bytes.data(), elem, t.shape());
}

struct PoolCase {
  std::string label;
  Shape x;
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil_mode = false;
};

void check(const PoolCase& c, Elem elem, int threads, bool with_nan) {
  SCOPED_TRACE(c.label + " elem " + std::to_string(static_cast<int>(elem)) + " threads " + std::to_string(threads) +
               (with_nan ? " nan" : ""));
  const OpDef* def = OpRegistry::instance().find("max_pool2d");
  Attrs attrs;
  attrs.set("kernel_size", c.kernel);
  attrs.set("stride", c.stride);
  attrs.set("padding", c.padding);
  attrs.set("dilation", c.dilation);
  attrs.set("ceil_mode", c.ceil_mode);
  OpRegistry::instance().normalize_attrs(*def, nullptr, attrs, "test");
  Tensor x = rounded(random_tensor(c.x, 3), elem);
  if (with_nan && x.numel() > 7) {
    x.mutable_data<float>()[7] = NAN;
    x.mutable_data<float>()[x.numel() - 1] = NAN;
  }
  const std::vector<TensorMeta> out_meta = def->infer(attrs, std::vector<TensorMeta>{{x.shape(), DType::Float32}});
  const Tensor expected = def->reference(attrs, std::vector<Tensor>{x}, out_meta)[0];

  KernelTable table;
  add_pool_kernels(table);
  Node node;
  node.op = "max_pool2d";
  node.attrs = attrs;
  ThreadPool pool(threads);
  ScratchSpace scratch;
  std::vector<std::byte> in(static_cast<size_t>(std::max<int64_t>(x.numel(), 1)) * elem_size(elem));
  tensor_to_storage(x, in.data(), elem);
  const int64_t count = shape_numel(out_meta[0].shape);
  std::vector<std::byte> out(static_cast<size_t>(std::max<int64_t>(count, 1)) * elem_size(elem));
  for (int64_t i = 0; i < count; ++i) store_float(out.data(), elem, i, 12345.0f);
  KernelContext ctx{node,
                    {Buffer{in.data(), elem, {x.shape(), DType::Float32}}},
                    {Buffer{out.data(), elem, out_meta[0]}},
                    pool,
                    scratch};
  const std::optional<Kernel> kernel = (*table.find("max_pool2d"))(ctx);
  ASSERT_TRUE(kernel);
  scratch.allocate(pool.size());
  kernel->run();
  const Tensor actual = storage_to_tensor(out.data(), elem, out_meta[0].shape);
  const Tensor want = rounded(expected, elem);
  for (int64_t i = 0; i < count; ++i) {
    const float a = actual.data<float>()[i], e = want.data<float>()[i];
    if (std::isnan(e))
      ASSERT_TRUE(std::isnan(a)) << "at " << i;
    else
      ASSERT_EQ(a, e) << "at " << i;
  }
}

TEST(PoolKernels, MaxPool2dMatchesReference) {
  const std::vector<PoolCase> cases = {
      {"resnet stem", {1, 4, 112, 112}, {3}, {2}, {1}, {1}},
      {"2x2", {2, 3, 8, 10}, {2}, {2}, {0}, {1}},
      {"odd sizes", {1, 5, 13, 7}, {3, 2}, {2, 1}, {1, 0}, {1}},
      {"ceil mode", {1, 2, 9, 11}, {3}, {2}, {0}, {1}, true},
      {"ceil mode padded", {1, 2, 10, 10}, {3}, {3}, {1}, {1}, true},
      {"dilation", {1, 3, 12, 9}, {3}, {1}, {1}, {2}},
      {"unbatched", {3, 7, 7}, {3}, {1}, {1}, {1}},
      {"window wider than stride", {1, 1, 6, 31}, {5}, {3}, {2}, {1}},
      {"empty", {0, 3, 8, 8}, {2}, {2}, {0}, {1}},
  };
  for (const PoolCase& c : cases)
    for (Elem elem : {Elem::F32, Elem::BF16})
      for (int threads : {1, 2})
        for (bool with_nan : {false, true}) {
          check(c, elem, threads, with_nan);
          if (testing::Test::HasFailure()) return;
        }
}

// The vectorized 3-wide, stride-2 horizontal pass: every width around its 8-lane steps, with and without padding,
// NaN propagation included.
TEST(PoolKernels, ThreeByThreeStrideTwoAllWidths) {
  for (int64_t width = 1; width <= 41; ++width)
    for (int64_t pad : {0, 1}) {
      if (width + 2 * pad < 3) continue;
      const PoolCase c{
          "width " + std::to_string(width) + " pad " + std::to_string(pad), {1, 2, 5, width}, {3}, {2}, {pad}, {1}};
      for (bool with_nan : {false, true}) {
        check(c, Elem::F32, 1, with_nan);
        if (testing::Test::HasFailure()) return;
      }
    }
}

TEST(PoolKernels, InvalidAttributesAreLeftToTheReference) {
  KernelTable table;
  add_pool_kernels(table);
  Node node;
  node.op = "max_pool2d";
  node.attrs.set("kernel_size", std::vector<int64_t>{0});
  ThreadPool pool(1);
  ScratchSpace scratch;
  std::vector<float> x(16), y(16);
  KernelContext ctx{node,
                    {Buffer{reinterpret_cast<std::byte*>(x.data()), Elem::F32, {{1, 1, 4, 4}, DType::Float32}}},
                    {Buffer{reinterpret_cast<std::byte*>(y.data()), Elem::F32, {{1, 1, 4, 4}, DType::Float32}}},
                    pool,
                    scratch};
  EXPECT_FALSE((*table.find("max_pool2d"))(ctx));
  node.attrs.set("kernel_size", std::vector<int64_t>{1, 2, 3});
  EXPECT_FALSE((*table.find("max_pool2d"))(ctx));
}

}  // namespace
}  // namespace npusim::cpu
