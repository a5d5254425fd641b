// The CPU convolution kernels (packed-GEMM, depthwise and Winograd paths) against the registry's reference conv2d,
// every output element, in fp32 and in half-precision storage, with 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include "backends/cpu/conv_winograd.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/packed_gemm.h"
#include "npusim/error.h"
#include "npusim/op_registry.h"
#include "unit/random_values.h"

namespace npusim::cpu {
namespace {

using test::random_tensor;

// Values as stored in `elem` and read back: what a kernel with that storage sees.
Tensor rounded(const Tensor& t, Elem elem) {
  std::vector<std::byte> bytes(static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * elem_size(elem));
  tensor_to_storage(t, bytes.data(), elem);
  return storage_to_tensor(bytes.data(), elem, t.shape());
}

Attrs normalized(const std::string& op, Attrs attrs) {
  const OpDef* def = OpRegistry::instance().find(op);
  OpRegistry::instance().normalize_attrs(*def, nullptr, attrs, "test");
  return attrs;
}

Tensor reference(const std::string& op, const Attrs& attrs, const std::vector<Tensor>& inputs) {
  const OpDef* def = OpRegistry::instance().find(op);
  std::vector<TensorMeta> metas;
  for (const Tensor& t : inputs) metas.push_back({t.shape(), t.dtype()});
  const std::vector<TensorMeta> out = def->infer(attrs, metas);
  return def->reference(attrs, inputs, out)[0];
}

// Runs the backend's kernel for `op` on inputs stored as `elem`; nothing when the factory declines. With
// `constant_weight`, input 1 is marked a weight (packed once; 3x3 convolutions may take the Winograd path).
std::optional<Tensor> run_kernel(const std::string& op, const Attrs& attrs, const std::vector<Tensor>& inputs,
                                 const Shape& out_shape, Elem elem, int threads, bool constant_weight = false) {
  std::vector<std::vector<std::byte>> storage;
  Node node;
  node.name = "conv";
  node.op = op;
  node.attrs = attrs;
  ThreadPool pool(threads);
  ScratchSpace scratch;
  KernelContext ctx{node, {}, {}, pool, scratch};
  for (const Tensor& t : inputs) {
    storage.emplace_back(static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * elem_size(elem));
    tensor_to_storage(t, storage.back().data(), elem);
    ctx.inputs.push_back(Buffer{storage.back().data(), elem, {t.shape(), DType::Float32}});
  }
  storage.emplace_back(static_cast<size_t>(std::max<int64_t>(shape_numel(out_shape), 1)) * elem_size(elem));
  std::vector<std::byte>& out = storage.back();
  for (int64_t i = 0; i < shape_numel(out_shape); ++i) store_float(out.data(), elem, i, NAN);
  ctx.outputs.push_back(Buffer{out.data(), elem, {out_shape, DType::Float32}});
  ctx.constant_inputs.assign(inputs.size(), false);
  if (constant_weight && inputs.size() > 1) ctx.constant_inputs[1] = true;
  const std::optional<Kernel> kernel = (*kernel_table().find(op))(ctx);
  if (!kernel) return std::nullopt;
  scratch.allocate(pool.size());
  kernel->run();
  kernel->run();  // a second run over the same scratch gives the same answer
  return storage_to_tensor(out.data(), elem, out_shape);
}

double max_abs(const Tensor& t) {
  double scale = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) scale = std::max(scale, std::fabs(static_cast<double>(t.data<float>()[i])));
  return scale;
}

// Within rtol * (|expected| + scale), scale being the largest |expected| unless given (the magnitude of the sums
// before an activation squeezed them, which is what rounding errors scale with).
void expect_close(const Tensor& actual, const Tensor& expected, double rtol, const std::string& label,
                  double scale = -1.0) {
  ASSERT_EQ(actual.shape(), expected.shape()) << label;
  const float* a = actual.data<float>();
  const float* e = expected.data<float>();
  if (scale < 0.0) scale = max_abs(expected);
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_LE(std::fabs(a[i] - e[i]), rtol * (std::fabs(e[i]) + scale) + 1e-30)
        << label << " at " << i << ": " << a[i] << " vs " << e[i];
}

double tolerance(Elem elem) { return elem == Elem::F32 ? 2e-5 : elem == Elem::F16 ? 2e-3 : 1.6e-2; }

struct ConvCase {
  std::string label;
  Shape x, w;
  bool bias = false;
  std::vector<int64_t> stride{1}, padding{0}, dilation{1};
  int64_t groups = 1;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"pointwise", {1, 5, 6, 7}, {3, 5, 1, 1}, true},
      {"pointwise wide", {1, 33, 9, 13}, {40, 33, 1, 1}},
      {"3x3", {1, 3, 9, 9}, {4, 3, 3, 3}, true, {1}, {1}},
      {"3x3 many channels", {1, 20, 17, 15}, {24, 20, 3, 3}, true, {1}, {1}},
      {"3x3 small image", {2, 32, 7, 6}, {16, 32, 3, 3}, true, {1}, {1}},
      {"3x3 unpadded many channels", {1, 16, 20, 9}, {17, 16, 3, 3}},
      {"3x3 stride 2", {1, 16, 15, 13}, {8, 16, 3, 3}, true, {2}, {1}},
      {"3x3 no padding", {2, 4, 7, 8}, {6, 4, 3, 3}},
      {"7x7 stride 2 pad 3", {1, 3, 31, 29}, {16, 3, 7, 7}, true, {2}, {3}},
      {"1x1 stride 2", {1, 16, 14, 14}, {32, 16, 1, 1}, false, {2}},
      {"7x7 stride 2 rows of 67", {1, 3, 7, 133}, {5, 3, 7, 7}, true, {2}, {3}},
      {"1x1 stride 2 rows of 65", {1, 6, 4, 130}, {7, 6, 1, 1}, true, {2}},
      {"3x3 stride 3 rows of 64", {1, 2, 8, 190}, {3, 2, 3, 3}, false, {3}, {1}},
      {"3x3 stride 2 rows of 13", {1, 8, 13, 26}, {49, 8, 3, 3}, true, {2}, {1}},
      {"dilation 2", {1, 4, 11, 10}, {5, 4, 3, 3}, true, {1}, {2}, {2}},
      {"asymmetric", {2, 4, 7, 8}, {6, 2, 3, 2}, false, {1, 2}, {1, 0}, {1, 1}, 2},
      {"groups", {1, 8, 9, 9}, {12, 2, 3, 3}, true, {1}, {1}, {1}, 4},
      {"depthwise", {2, 6, 9, 11}, {6, 1, 3, 3}, true, {1}, {1}, {1}, 6},
      {"depthwise stride 2 multiplier 2", {1, 4, 10, 9}, {8, 1, 3, 3}, true, {2}, {1}, {1}, 4},
      {"depthwise 5x5 dilated", {1, 3, 12, 12}, {3, 1, 5, 5}, false, {1}, {4}, {2}, 3},
      {"depthwise 7x7 planes", {1, 16, 7, 7}, {16, 1, 3, 3}, true, {1}, {1}, {1}, 16},
      {"depthwise stride 2 odd sizes", {1, 5, 13, 17}, {5, 1, 3, 3}, true, {2}, {1}, {1}, 5},
      {"depthwise 5x5 stride 2 rows of 37", {1, 3, 11, 74}, {3, 1, 5, 5}, true, {2}, {2}, {1}, 3},
      {"depthwise 7x7 pad 3 rows of 41", {1, 4, 9, 41}, {4, 1, 7, 7}, false, {1}, {3}, {1}, 4},
      {"depthwise stride 3 dilation 2", {1, 2, 14, 20}, {2, 1, 3, 3}, true, {3}, {2}, {2}, 2},
      {"depthwise stride 2 by 1", {1, 3, 9, 10}, {3, 1, 3, 3}, true, {2, 1}, {1}, {1}, 3},
      {"depthwise unpadded one column", {1, 3, 5, 3}, {3, 1, 3, 3}, true, {1}, {0}, {1}, 3},
      {"depthwise 1x1", {1, 4, 6, 6}, {4, 1, 1, 1}, true, {1}, {0}, {1}, 4},
      {"depthwise padding wider than the kernel", {1, 2, 4, 4}, {2, 1, 3, 3}, true, {1}, {3}, {1}, 2},
      {"depthwise rows of 33 batch 2", {2, 3, 6, 33}, {3, 1, 3, 3}, true, {1}, {1}, {1}, 3},
      {"depthwise tall, bands of rows", {1, 9, 150, 20}, {9, 1, 3, 3}, true, {1}, {1}, {1}, 9},
      {"depthwise stride 2 tall, batch 2", {2, 10, 141, 45}, {10, 1, 3, 3}, true, {2}, {1}, {1}, 10},
      {"groups of 4 channels", {1, 16, 13, 15}, {16, 4, 3, 3}, true, {1}, {1}, {1}, 4},
      {"groups of 8 stride 2 batch 2", {2, 16, 14, 11}, {24, 8, 3, 3}, true, {2}, {1}, {1}, 2},
      {"groups of 3 in, 5 out, 5x5", {1, 6, 9, 9}, {10, 3, 5, 5}, false, {1}, {2}, {1}, 2},
      {"RGB stem 3x3 stride 2", {1, 3, 23, 21}, {8, 3, 3, 3}, true, {2}, {1}},
      {"RGB stem 7x7 stride 2 batch 2", {2, 3, 19, 25}, {5, 3, 7, 7}, false, {2}, {3}},
      {"one channel 3x3", {1, 1, 10, 10}, {3, 1, 3, 3}, true, {1}, {1}},
      {"batch 2 odd sizes", {2, 7, 13, 5}, {9, 7, 3, 3}, true, {1}, {1}},
      {"one pixel", {1, 17, 1, 1}, {31, 17, 1, 1}, true},
      {"empty batch", {0, 3, 5, 5}, {4, 3, 3, 3}, true, {1}, {1}},
  };
}

Attrs conv_attrs(const ConvCase& c) {
  Attrs attrs;
  attrs.set("stride", c.stride);
  attrs.set("padding", c.padding);
  attrs.set("dilation", c.dilation);
  attrs.set("groups", c.groups);
  return attrs;
}

std::vector<Tensor> conv_inputs(const ConvCase& c) {
  std::vector<Tensor> inputs{random_tensor(c.x, 1), random_tensor(c.w, 2)};
  if (c.bias) inputs.push_back(random_tensor({c.w[0]}, 3));
  return inputs;
}

// The conv2d kernel on `c` with operands rounded to `elem`, against the reference on the same rounded operands.
void check_conv(const ConvCase& c, Elem elem, int threads, const std::string& label) {
  const Attrs attrs = normalized("conv2d", conv_attrs(c));
  std::vector<Tensor> inputs = conv_inputs(c);
  for (Tensor& t : inputs) t = rounded(t, elem);
  const Tensor expected = reference("conv2d", attrs, inputs);
  const std::optional<Tensor> actual = run_kernel("conv2d", attrs, inputs, expected.shape(), elem, threads);
  ASSERT_TRUE(actual) << label;
  expect_close(*actual, rounded(expected, elem), tolerance(elem), label);
}

TEST(ConvKernels, Conv2dMatchesReference) {
  for (const ConvCase& c : conv_cases())
    for (Elem elem : {Elem::F32, Elem::F16, Elem::BF16})
      for (int threads : {1, 2})
        check_conv(c, elem, threads,
                   c.label + " elem " + std::to_string(static_cast<int>(elem)) + " threads " + std::to_string(threads));
}

struct Fused {
  std::string activation;
  Attrs extra;  // the activation's parameters
};

// fused_conv2d on `c` with `f`'s activation and a residual when asked, operands rounded to `elem`, the weight marked
// constant when asked, against the reference on the same rounded operands.
void check_fused(const ConvCase& c, const Fused& f, bool with_residual, Elem elem, int threads, bool constant,
                 const std::string& label) {
  Attrs attrs = conv_attrs(c);
  for (const auto& [name, value] : f.extra.values()) attrs.set(name, value);
  attrs.set("activation", f.activation);
  attrs.set("has_bias", c.bias);
  attrs.set("has_residual", with_residual);
  attrs = normalized("fused_conv2d", attrs);
  std::vector<Tensor> inputs = conv_inputs(c);
  const Shape out_shape = reference("conv2d", normalized("conv2d", conv_attrs(c)), inputs).shape();
  if (with_residual) inputs.push_back(random_tensor(out_shape, 4));
  for (Tensor& t : inputs) t = rounded(t, elem);
  const Tensor expected = reference("fused_conv2d", attrs, inputs);
  Attrs plain = attrs;
  plain.set("activation", std::string("none"));
  const double scale = max_abs(reference("fused_conv2d", plain, inputs));
  const std::optional<Tensor> actual = run_kernel("fused_conv2d", attrs, inputs, out_shape, elem, threads, constant);
  ASSERT_TRUE(actual) << label;
  expect_close(*actual, rounded(expected, elem), tolerance(elem), label, scale);
}

TEST(ConvKernels, FusedConvWithResidualAndActivations) {
  Attrs hardtanh;
  hardtanh.set("min_val", 0.0);
  hardtanh.set("max_val", 0.5);
  const std::vector<Fused> activations = {{"none", {}}, {"relu", {}}, {"hardtanh", hardtanh}, {"silu", {}}};
  for (const ConvCase& c : conv_cases()) {
    if (shape_numel(c.x) == 0) continue;
    for (const Fused& f : activations)
      for (bool with_residual : {false, true})
        for (Elem elem : {Elem::F32, Elem::BF16}) {
          const bool constant = with_residual != (elem == Elem::F32);
          check_fused(c, f, with_residual, elem, 2, constant,
                      c.label + " " + f.activation + (with_residual ? " residual" : "") + " elem " +
                          std::to_string(static_cast<int>(elem)) + (constant ? " constant weight" : ""));
        }
  }
}

// Grouped convolutions of more than four input channels a group with a constant fp32 weight take the weight's
// packed panels straight over the inputs (no patch matrix): bias, residual and every activation, one and two threads.
TEST(ConvKernels, GroupedPanelsMatchReference) {
  const std::vector<ConvCase> cases = {
      {"groups of 8 over 28x28", {1, 32, 28, 28}, {32, 8, 3, 3}, true, {1}, {1}, {1}, 4},
      {"groups of 16 stride 2 batch 2", {2, 64, 14, 13}, {64, 16, 3, 3}, true, {2}, {1}, {1}, 4},
      {"groups of 6 in, 10 out", {1, 12, 9, 9}, {20, 6, 3, 3}, false, {1}, {1}, {1}, 2},
      {"groups of 32 over 7x7", {1, 64, 7, 7}, {64, 32, 3, 3}, true, {1}, {1}, {1}, 2},
      {"groups of 8, 5x5 dilated", {1, 16, 12, 11}, {16, 8, 5, 5}, true, {1}, {4}, {2}, 2},
  };
  Attrs clamp;
  clamp.set("min_val", -0.2);
  clamp.set("max_val", 0.3);
  const std::vector<Fused> activations = {{"relu", {}}, {"hardtanh", clamp}, {"silu", {}}};
  for (const ConvCase& c : cases)
    for (const Fused& f : activations)
      for (bool with_residual : {false, true})
        for (int threads : {1, 2})
          check_fused(c, f, with_residual, Elem::F32, threads, true,
                      c.label + " " + f.activation + (with_residual ? " residual" : "") + " threads " +
                          std::to_string(threads));
}

TEST(ConvKernels, Conv1dMatchesReference) {
  Attrs attrs;
  attrs.set("stride", std::vector<int64_t>{3});
  attrs.set("padding", std::vector<int64_t>{2});
  attrs = normalized("conv1d", attrs);
  const std::vector<Tensor> inputs{random_tensor({2, 3, 33}, 5), random_tensor({4, 3, 5}, 6), random_tensor({4}, 7)};
  const Tensor expected = reference("conv1d", attrs, inputs);
  const std::optional<Tensor> actual = run_kernel("conv1d", attrs, inputs, expected.shape(), Elem::F32, 2);
  ASSERT_TRUE(actual);
  expect_close(*actual, expected, 2e-5, "conv1d");
  // Depthwise along a sequence (a causal-style padded 1-D depthwise filter, dilation 2), batch 2.
  Attrs depthwise;
  depthwise.set("padding", std::vector<int64_t>{6});
  depthwise.set("dilation", std::vector<int64_t>{2});
  depthwise.set("groups", int64_t{6});
  depthwise = normalized("conv1d", depthwise);
  const std::vector<Tensor> dw_inputs{random_tensor({2, 6, 37}, 8), random_tensor({6, 1, 4}, 9),
                                      random_tensor({6}, 10)};
  const Tensor dw_expected = reference("conv1d", depthwise, dw_inputs);
  for (int threads : {1, 2}) {
    const std::optional<Tensor> dw_actual =
        run_kernel("conv1d", depthwise, dw_inputs, dw_expected.shape(), Elem::F32, threads);
    ASSERT_TRUE(dw_actual);
    expect_close(*dw_actual, dw_expected, 2e-5, "depthwise conv1d threads " + std::to_string(threads));
  }
}

TEST(ConvKernels, UnsupportedGeometryIsLeftToTheReference) {
  Attrs attrs = normalized("conv2d", Attrs{});
  attrs.set("groups", int64_t{3});  // 4 input channels do not split into 3 groups
  const std::vector<Tensor> inputs{random_tensor({1, 4, 5, 5}, 1), random_tensor({3, 1, 3, 3}, 2)};
  EXPECT_FALSE(run_kernel("conv2d", attrs, inputs, {1, 3, 3, 3}, Elem::F32, 1));
  attrs.set("groups", int64_t{1});
  attrs.set("stride", std::vector<int64_t>{0});
  const std::vector<Tensor> plain{random_tensor({1, 4, 5, 5}, 1), random_tensor({3, 4, 3, 3}, 2)};
  EXPECT_FALSE(run_kernel("conv2d", attrs, plain, {1, 3, 3, 3}, Elem::F32, 1));
}

// Winograd directly (the kernel uses it only for weights known to be constant).
// The GEMM-based paths with each micro-kernel forced in turn (kernels this CPU lacks are skipped).
TEST(ConvKernels, EveryMicroKernelMatchesReference) {
  for (GemmKernelChoice kernel : {GemmKernelChoice::Portable, GemmKernelChoice::Avx2, GemmKernelChoice::Avx512}) {
    if (!gemm_kernel_supported(kernel)) continue;
    set_gemm_kernel_choice(kernel);
    for (const ConvCase& c : conv_cases())
      for (Elem elem : {Elem::F32, Elem::BF16})
        for (int threads : {1, 2}) {
          check_conv(c, elem, threads,
                     c.label + " kernel " + std::to_string(static_cast<int>(kernel)) + " elem " +
                         std::to_string(static_cast<int>(elem)) + " threads " + std::to_string(threads));
          if (testing::Test::HasFailure()) break;
        }
  }
  set_gemm_kernel_choice(GemmKernelChoice::Best);
}

// A 3x3 convolution with bias for the Winograd tests: seeded operands (seeds `seed` .. seed + 3) and the
// reference's output, bias included.
struct WinogradShape {
  int64_t cin, cout, height, width, pad;
};
struct WinogradOperands {
  Tensor x, w, bias, residual, expected;
  WinogradConv::Geometry g;
  int64_t pixels;
  std::string label;
};
WinogradOperands winograd_operands(const WinogradShape& c, uint64_t seed) {
  WinogradOperands o;
  o.label = "cin " + std::to_string(c.cin) + " cout " + std::to_string(c.cout) + " " + std::to_string(c.height) + "x" +
            std::to_string(c.width) + " pad " + std::to_string(c.pad);
  o.x = random_tensor({1, c.cin, c.height, c.width}, seed);
  o.w = random_tensor({c.cout, c.cin, 3, 3}, seed + 1);
  o.bias = random_tensor({c.cout}, seed + 2);
  Attrs attrs;
  attrs.set("padding", std::vector<int64_t>{c.pad});
  o.expected = reference("conv2d", normalized("conv2d", attrs), {o.x, o.w, o.bias});
  const int64_t out_h = o.expected.shape()[2], out_w = o.expected.shape()[3];
  o.pixels = out_h * out_w;
  o.residual = random_tensor(o.expected.shape(), seed + 3);
  o.g = WinogradConv::Geometry{c.cin, c.cout, c.height, c.width, c.pad, c.pad, out_h, out_w};
  return o;
}

TEST(ConvKernels, WinogradMatchesReference) {
  const std::vector<WinogradShape> cases = {{16, 16, 7, 7, 1},  {16, 24, 14, 14, 1}, {17, 19, 13, 11, 1},
                                            {32, 16, 9, 23, 0}, {16, 33, 30, 17, 2}, {24, 16, 5, 6, 1},
                                            {64, 64, 28, 28, 1}};
  for (const WinogradShape& c : cases)
    for (int threads : {1, 2})
      for (int variant = 0; variant < 4; ++variant) {
        WinogradOperands o = winograd_operands(c, 11);
        const std::string label = o.label + " variant " + std::to_string(variant);
        const Tensor &x = o.x, &w = o.w, &bias = o.bias, &residual = o.residual;
        Tensor& expected = o.expected;
        const WinogradConv::Geometry& g = o.g;
        const int64_t pixels = o.pixels;
        ASSERT_TRUE(WinogradConv::suitable(g)) << label;
        ThreadPool pool(threads);
        ScratchSpace scratch;
        const WinogradConv conv(g, w.bytes(), Elem::F32, scratch);
        scratch.allocate(pool.size());
        std::vector<float> workspace(static_cast<size_t>(conv.workspace_floats()));
        const Elem out_elem = variant == 3 ? Elem::BF16 : Elem::F32;
        std::vector<std::byte> out(static_cast<size_t>(c.cout * pixels) * elem_size(out_elem));
        for (int64_t i = 0; i < c.cout * pixels; ++i) store_float(out.data(), out_elem, i, NAN);
        GemmEpilogue epilogue;
        epilogue.bias = bias.data<float>();
        float* e = expected.mutable_data<float>();
        if (variant >= 1) {
          epilogue.residual = residual.bytes();
          epilogue.residual_ld = pixels;
          for (int64_t i = 0; i < expected.numel(); ++i) e[i] += residual.data<float>()[i];
        }
        if (variant == 2) {
          epilogue.activation = GemmActivation::Relu;
          for (int64_t i = 0; i < expected.numel(); ++i) e[i] = std::max(e[i], 0.0f);
        }
        if (variant == 3) {
          epilogue.activation = GemmActivation::Clamp;
          epilogue.low = -0.5f;
          epilogue.high = 1.0f;
          for (int64_t i = 0; i < expected.numel(); ++i) e[i] = std::clamp(e[i], -0.5f, 1.0f);
        }
        conv.run(x.data<float>(), workspace.data(), {out.data(), out_elem, pixels}, epilogue, pool, scratch);
        const Tensor actual = storage_to_tensor(out.data(), out_elem, expected.shape());
        expect_close(actual, rounded(expected, out_elem), out_elem == Elem::F32 ? 2e-5 : 1.6e-2, label);
      }
}

// Weights transformed over a pool's threads (whole packed lines per thread) and into a packing arena give the
// same outputs, bit for bit, as transformed alone; both match the reference. Output channel counts leave partial
// panels of 6 (tiles as columns) and of 16 (few tiles: tiles as rows).
TEST(ConvKernels, WinogradWeightsTransformedInParallelMatch) {
  struct Case {
    int64_t cin, cout, height, width;
  };
  for (const Case& c : {Case{16, 33, 14, 14}, Case{17, 19, 5, 6}, Case{24, 50, 4, 4}, Case{32, 16, 12, 9}}) {
    const std::string label = "cin " + std::to_string(c.cin) + " cout " + std::to_string(c.cout) + " " +
                              std::to_string(c.height) + "x" + std::to_string(c.width);
    const Tensor x = random_tensor({1, c.cin, c.height, c.width}, 21);
    const Tensor w = random_tensor({c.cout, c.cin, 3, 3}, 22);
    Attrs attrs;
    attrs.set("padding", std::vector<int64_t>{1});
    attrs = normalized("conv2d", attrs);
    const Tensor expected = reference("conv2d", attrs, {x, w});
    const int64_t pixels = c.height * c.width;
    const WinogradConv::Geometry g{c.cin, c.cout, c.height, c.width, 1, 1, c.height, c.width};
    ASSERT_TRUE(WinogradConv::suitable(g)) << label;
    std::vector<std::vector<float>> outputs;
    for (int threads : {1, 2, 0}) {  // 0: two threads, packed into an arena
      ThreadPool pool(std::max(threads, 2));
      ScratchSpace scratch;
      auto arena = std::make_shared<ZeroedArena>();
      std::optional<PackingArenaScope> scope;
      if (threads == 0) scope.emplace(arena);
      const WinogradConv conv(g, w.bytes(), Elem::F32, scratch, threads == 1 ? nullptr : &pool);
      scope.reset();
      if (threads == 0) EXPECT_GT(arena->used_bytes(), static_cast<size_t>(c.cout * c.cin * 4)) << label;
      scratch.allocate(pool.size());
      std::vector<float> workspace(static_cast<size_t>(conv.workspace_floats()));
      std::vector<float> out(static_cast<size_t>(c.cout * pixels), NAN);
      conv.run(x.data<float>(), workspace.data(), {reinterpret_cast<std::byte*>(out.data()), Elem::F32, pixels}, {},
               pool, scratch);
      Tensor actual(DType::Float32, expected.shape());
      std::copy(out.begin(), out.end(), actual.mutable_data<float>());
      expect_close(actual, expected, 2e-5, label);
      outputs.push_back(std::move(out));
    }
    for (size_t i = 1; i < outputs.size(); ++i)
      for (size_t j = 0; j < outputs[0].size(); ++j)
        ASSERT_EQ(outputs[i][j], outputs[0][j]) << label << " variant " << i << " at " << j;
  }
}

// Images wide enough for the vector paths of the transforms (eight tiles and more per row of tiles: the phase
// split of the input rows, the 1-D passes and the interleaving of the output rows), for F(4x4) and F(2x2), with
// bias, residual and ReLU; every element against the reference, the output prefilled with NaN.
TEST(ConvKernels, WinogradWideImagesMatchReference) {
  for (const WinogradShape& c : {WinogradShape{16, 20, 70, 70, 1}, WinogradShape{16, 24, 4, 35, 1},
                                 WinogradShape{17, 16, 9, 67, 2}, WinogradShape{16, 16, 3, 45, 0}})
    for (int threads : {1, 2}) {
      WinogradOperands o = winograd_operands(c, 31);
      const std::string label = o.label + " threads " + std::to_string(threads);
      const Tensor &x = o.x, &w = o.w, &bias = o.bias, &residual = o.residual;
      Tensor& expected = o.expected;
      const WinogradConv::Geometry& g = o.g;
      const int64_t pixels = o.pixels;
      const double scale = max_abs(expected);
      float* e = expected.mutable_data<float>();
      for (int64_t i = 0; i < expected.numel(); ++i) e[i] = std::max(e[i] + residual.data<float>()[i], 0.0f);
      ASSERT_TRUE(WinogradConv::suitable(g)) << label;
      ThreadPool pool(threads);
      ScratchSpace scratch;
      const WinogradConv conv(g, w.bytes(), Elem::F32, scratch, &pool);
      scratch.allocate(pool.size());
      std::vector<float> workspace(static_cast<size_t>(conv.workspace_floats()));
      std::vector<float> out(static_cast<size_t>(c.cout * pixels), NAN);
      GemmEpilogue epilogue;
      epilogue.bias = bias.data<float>();
      epilogue.residual = residual.bytes();
      epilogue.residual_ld = pixels;
      epilogue.activation = GemmActivation::Relu;
      conv.run(x.data<float>(), workspace.data(), {reinterpret_cast<std::byte*>(out.data()), Elem::F32, pixels},
               epilogue, pool, scratch);
      Tensor actual(DType::Float32, expected.shape());
      std::copy(out.begin(), out.end(), actual.mutable_data<float>());
      expect_close(actual, expected, 2e-5, label, scale + 1.0);
    }
}

// Rows of 2 to 16 tiles, F(4x4) and F(2x2), paddings 0 to 2: the input plane copied inside its zero border, the
// phase split and the horizontal pass in whole vectors of tiles (the lanes past a row of tiles computed and then
// overwritten by the next row), the output rows interleaved likewise. Workspace and output prefilled with NaN;
// every element against a double-precision convolution with bias, residual and ReLU, on 1 and 2 threads.
TEST(ConvKernels, WinogradEdgeTilesMatchDoubleReference) {
  const std::vector<WinogradShape> cases = {
      {19, 16, 12, 13, 1},  // F4, 4 tiles a row, 3 rows of tiles
      {17, 18, 20, 26, 1},  // F4, 7 tiles a row
      {16, 17, 30, 22, 0},  // F4, 5 tiles a row, no padding
      {16, 16, 36, 9, 1},   // F4, 3 tiles a row (not rounded up: 8 lanes would span three rows)
      {16, 16, 9, 60, 2},   // F4, 16 tiles a row, padding 2
      {16, 16, 5, 27, 2},   // F4, 8 tiles a row, 2 rows of tiles
      {16, 16, 13, 9, 2},   // F4, 3 tiles a row, padding 2
      {21, 16, 8, 11, 1},   // F2, 6 tiles a row
      {16, 20, 10, 5, 0},   // F2, 2 tiles a row
      {16, 16, 7, 7, 1},    // F2, 4 tiles a row (ResNet's last stage)
      {16, 16, 6, 38, 0},   // F4, one row of 9 tiles (the last row of tiles is the first)
      {16, 17, 2, 41, 1},   // F2, one row of 21 tiles
      {33, 16, 60, 3, 1},   // F4, 1 tile a row, 15 rows of tiles
      {16, 31, 14, 14, 1},  // F4, 4 tiles a row, 4 rows (ResNet's 14x14 stage), odd channel count
  };
  for (const WinogradShape& c : cases)
    for (int threads : {1, 2}) {
      WinogradOperands o = winograd_operands(c, 41);
      const std::string label = o.label + " threads " + std::to_string(threads);
      const WinogradConv::Geometry& g = o.g;
      ASSERT_TRUE(WinogradConv::suitable(g)) << label;
      const float *x = o.x.data<float>(), *w = o.w.data<float>(), *bias = o.bias.data<float>(),
                  *residual = o.residual.data<float>();
      ThreadPool pool(threads);
      ScratchSpace scratch;
      const WinogradConv conv(g, o.w.bytes(), Elem::F32, scratch);
      scratch.allocate(pool.size());
      float* scratch_floats = scratch.shared_as<float>();
      std::fill(scratch_floats, scratch_floats + scratch.allocated_bytes() / sizeof(float), NAN);
      std::vector<float> workspace(static_cast<size_t>(conv.workspace_floats()), NAN);
      std::vector<float> out(static_cast<size_t>(c.cout * o.pixels), NAN);
      GemmEpilogue epilogue;
      epilogue.bias = bias;
      epilogue.residual = o.residual.bytes();
      epilogue.residual_ld = o.pixels;
      epilogue.activation = GemmActivation::Relu;
      conv.run(x, workspace.data(), {reinterpret_cast<std::byte*>(out.data()), Elem::F32, o.pixels}, epilogue, pool,
               scratch);
      for (int64_t oc = 0; oc < c.cout; ++oc)
        for (int64_t oy = 0; oy < g.out_h; ++oy)
          for (int64_t ox = 0; ox < g.out_w; ++ox) {
            const int64_t at = (oc * g.out_h + oy) * g.out_w + ox;
            double sum = bias[oc] + static_cast<double>(residual[at]);
            double magnitude = std::abs(bias[oc]) + std::abs(residual[at]);
            for (int64_t ic = 0; ic < c.cin; ++ic)
              for (int64_t ky = 0; ky < 3; ++ky)
                for (int64_t kx = 0; kx < 3; ++kx) {
                  const int64_t iy = oy + ky - c.pad, ix = ox + kx - c.pad;
                  if (iy < 0 || iy >= c.height || ix < 0 || ix >= c.width) continue;
                  const double term = static_cast<double>(x[(ic * c.height + iy) * c.width + ix]) *
                                      w[((oc * c.cin + ic) * 3 + ky) * 3 + kx];
                  sum += term;
                  magnitude += std::abs(term);
                }
            const double expected = std::max(sum, 0.0);
            ASSERT_NEAR(out[static_cast<size_t>(at)], expected, 1e-5 * magnitude + 1e-5)
                << label << " at channel " << oc << " row " << oy << " column " << ox;
          }
    }
}

TEST(ConvKernels, WinogradOnlyWhereItPays) {
  EXPECT_FALSE(WinogradConv::suitable({3, 64, 32, 32, 1, 1, 32, 32}));
  EXPECT_FALSE(WinogradConv::suitable({64, 8, 32, 32, 1, 1, 32, 32}));
  EXPECT_FALSE(WinogradConv::suitable({64, 64, 3, 3, 1, 1, 3, 3}));
  EXPECT_TRUE(WinogradConv::suitable({64, 64, 56, 56, 1, 1, 56, 56}));
  EXPECT_FALSE(WinogradConv::suitable({64, 64, 1024, 1024, 1, 1, 1024, 1024}));  // workspace too large
}

}  // namespace
}  // namespace npusim::cpu
