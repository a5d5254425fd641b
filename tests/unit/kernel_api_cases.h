#pragma once
// Kernel API tests that run the same on every device. Include once, after defining `kTestDevice`.
// Every output starts as a sentinel (init_value) and every element is checked, at sizes smaller than one
// threadgroup, not a multiple of it, and large.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "npusim/error.h"
#include "npusim/kernel_api.h"
#include "unit/error_expectations.h"

namespace npusim::kernels::test {

constexpr double kSentinel = -777.0;

inline LaunchConfig launch(Grid grid, ThreadGroup threadgroup, std::map<std::string, OutputSpec> outputs = {}) {
  LaunchConfig config;
  config.grid = grid;
  config.threadgroup = threadgroup;
  config.outputs = std::move(outputs);
  config.init_value = kSentinel;
  config.device = kTestDevice;
  return config;
}

template <typename T>
Tensor make_tensor(DType dtype, Shape shape, const std::function<T(int64_t)>& value) {
  Tensor tensor(dtype, std::move(shape));
  T* data = tensor.mutable_data<T>();
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = value(i);
  return tensor;
}

inline Tensor float_tensor(Shape shape, const std::function<float(int64_t)>& value) {
  return make_tensor<float>(DType::Float32, std::move(shape), value);
}

// Runs `action`, expecting an npusim::Error whose message contains every one of `parts`.
using npusim::test::expect_error;

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

const std::vector<int64_t> kSizes = {1, 100, 1000, 1 << 20};  // < one group of 256, not a multiple, large

// ---- write the thread index ----

TEST(KernelApi, WritesThreadIndex) {
  const Kernel kernel({.name = "thread_index",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "out[thread_position_in_grid.x] = thread_position_in_grid.x;\n"});
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const std::vector<Tensor> outputs =
        kernel({}, launch(Grid{n, 1, 1}, ThreadGroup{256, 1, 1}, {{"out", {{n}, DType::Int32}}}));
    ASSERT_EQ(outputs.size(), 1u);
    ASSERT_EQ(outputs[0].shape(), Shape{n});
    const int32_t* out = outputs[0].data<int32_t>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += out[i] != i;
    EXPECT_EQ(wrong, 0);
  }
}

TEST(KernelApi, ThreadsPastTheGridDoNotRun) {
  // 10 threads in groups of 4: the third group has 2 threads past the grid, which must not write.
  const Kernel kernel(
      {.name = "past_grid", .inputs = {}, .outputs = {"out"}, .body = "out[thread_position_in_grid.x] = 1.0f;\n"});
  const Tensor out = kernel({}, launch(Grid{10, 1, 1}, ThreadGroup{4, 1, 1}, {{"out", {{12}, DType::Float32}}}))[0];
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(out.data<float>()[i], i < 10 ? 1.0f : kSentinel) << i;
}

TEST(KernelApi, PositionsInThreeDimensions) {
  const Kernel kernel({.name = "positions_3d",
                       .inputs = {},
                       .outputs = {"global", "local", "group", "sizes"},
                       .body = R"(const uint3 p = thread_position_in_grid;
const int64_t i = (int64_t(p.z) * threads_per_grid.y + p.y) * threads_per_grid.x + p.x;
global[i] = p.x + 10 * p.y + 100 * p.z;
local[i] = thread_position_in_threadgroup.x + 10 * thread_position_in_threadgroup.y + 100 * thread_position_in_threadgroup.z;
group[i] = threadgroup_position_in_grid.x + 10 * threadgroup_position_in_grid.y + 100 * threadgroup_position_in_grid.z;
sizes[i] = threads_per_threadgroup.x + 10 * threads_per_threadgroup.y + 100 * threads_per_threadgroup.z +
           1000 * (threadgroups_per_grid.x + 10 * threadgroups_per_grid.y + 100 * threadgroups_per_grid.z);
)"});
  const Shape shape{2, 3, 5};
  std::map<std::string, OutputSpec> outputs;
  for (const char* name : {"global", "local", "group", "sizes"}) outputs[name] = {shape, DType::Int32};
  const std::vector<Tensor> result = kernel({}, launch(Grid{5, 3, 2}, ThreadGroup{2, 2, 1}, outputs));
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 5; ++x) {
        const int i = (z * 3 + y) * 5 + x;
        EXPECT_EQ(result[0].data<int32_t>()[i], x + 10 * y + 100 * z);
        EXPECT_EQ(result[1].data<int32_t>()[i], x % 2 + 10 * (y % 2));
        EXPECT_EQ(result[2].data<int32_t>()[i], x / 2 + 10 * (y / 2) + 100 * z);
        EXPECT_EQ(result[3].data<int32_t>()[i], 2 + 20 + 100 + 1000 * (3 + 20 + 200));
      }
}

// ---- vector add, scalar multiply, dtypes ----

TEST(KernelApi, VectorAdd) {
  const Kernel kernel({.name = "vector_add",
                       .inputs = {"a", "b"},
                       .outputs = {"out"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\nout[i] = a[i] + b[i];\n"});
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const Tensor a = float_tensor({n}, [](int64_t i) { return 0.5f * static_cast<float>(i % 1000); });
    const Tensor b = float_tensor({n}, [](int64_t i) { return 3.0f - static_cast<float>(i % 77); });
    const Tensor out = kernel({{"a", a}, {"b", b}},
                              launch(Grid{n, 1, 1}, ThreadGroup{256, 1, 1}, {{"out", {{n}, DType::Float32}}}))[0];
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += out.data<float>()[i] != 0.5f * (i % 1000) + 3.0f - (i % 77);
    EXPECT_EQ(wrong, 0);
  }
}

TEST(KernelApi, MultiplyByScalarArgument) {
  const Kernel kernel({.name = "scale",
                       .inputs = {"x", "factor"},
                       .outputs = {"out"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\nout[i] = x[i] * factor;\n"});
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const Tensor x = float_tensor({n}, [](int64_t i) { return static_cast<float>(i % 101) - 50.0f; });
    const Tensor out = kernel({{"x", x}, {"factor", Scalar(DType::Float32, 2.5)}},
                              launch(Grid{n, 1, 1}, ThreadGroup{256, 1, 1}, {{"out", {{n}, DType::Float32}}}))[0];
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += out.data<float>()[i] != (static_cast<float>(i % 101) - 50.0f) * 2.5f;
    EXPECT_EQ(wrong, 0);
  }
  // Integer scalars stay exact: int64 beyond 2^53.
  const Tensor x = make_tensor<int64_t>(DType::Int64, {3}, [](int64_t i) { return i + 1; });
  const int64_t big = (int64_t{1} << 53) + 1;
  const Tensor out = kernel({{"x", x}, {"factor", Scalar(DType::Int64, big)}},
                            launch(Grid{3, 1, 1}, ThreadGroup{32, 1, 1}, {{"out", {{3}, DType::Int64}}}))[0];
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out.data<int64_t>()[i], big * (i + 1));
}

TEST(KernelApi, HalfAndBfloat16) {
  const Kernel kernel({.name = "add_16bit",
                       .inputs = {"a", "b"},
                       .outputs = {"out", "wide"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\nout[i] = a[i] + b[i];\n"
                               "wide[i] = float(a[i]) * 2.0f;\n"});
  const int64_t n = 1000;
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    auto encode = [&](float value) { return dtype == DType::Float16 ? float_to_fp16(value) : float_to_bf16(value); };
    auto decode = [&](uint16_t bits) { return dtype == DType::Float16 ? fp16_to_float(bits) : bf16_to_float(bits); };
    auto a_value = [](int64_t i) { return 0.5f * static_cast<float>(i % 16); };
    auto b_value = [](int64_t i) { return static_cast<float>(i % 5) - 2.0f; };
    const Tensor a = make_tensor<uint16_t>(dtype, {n}, [&](int64_t i) { return encode(a_value(i)); });
    const Tensor b = make_tensor<uint16_t>(dtype, {n}, [&](int64_t i) { return encode(b_value(i)); });
    const std::vector<Tensor> out =
        kernel({{"a", a}, {"b", b}},
               launch(Grid{n, 1, 1}, ThreadGroup{128, 1, 1}, {{"out", {{n}, dtype}}, {"wide", {{n}, DType::Float32}}}));
    ASSERT_EQ(out[0].dtype(), dtype);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(decode(out[0].data<uint16_t>()[i]), a_value(i) + b_value(i)) << i;
      ASSERT_EQ(out[1].data<float>()[i], 2.0f * a_value(i)) << i;
    }
  }
}

TEST(KernelApi, IntegerAndBoolDtypes) {
  const Kernel kernel({.name = "int_types",
                       .inputs = {"small", "bytes"},
                       .outputs = {"sum", "positive"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\n"
                               "sum[i] = int32_t(small[i]) * 1000 + bytes[i];\npositive[i] = small[i] > 0;\n"});
  const int64_t n = 300;
  const Tensor small =
      make_tensor<int8_t>(DType::Int8, {n}, [](int64_t i) { return static_cast<int8_t>(i % 256 - 128); });
  const Tensor bytes =
      make_tensor<uint8_t>(DType::UInt8, {n}, [](int64_t i) { return static_cast<uint8_t>(i * 7 % 256); });
  LaunchConfig config =
      launch(Grid{n, 1, 1}, ThreadGroup{64, 1, 1}, {{"sum", {{n}, DType::Int32}}, {"positive", {{n}, DType::Bool}}});
  config.init_value = 0;  // a bool holds 0 or 1
  const std::vector<Tensor> out = kernel({{"small", small}, {"bytes", bytes}}, config);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[0].data<int32_t>()[i], (i % 256 - 128) * 1000 + i * 7 % 256) << i;
    EXPECT_EQ(out[1].data<uint8_t>()[i], i % 256 - 128 > 0 ? 1 : 0) << i;
  }
}

TEST(KernelApi, TemplateTypesAndConstants) {
  const Kernel kernel({.name = "templated",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\n"
                               "out[i] = NEGATE ? -T(i * SCALE) / T(4) : T(i * SCALE) / T(4);\n"});
  LaunchConfig config = launch(Grid{50, 1, 1}, ThreadGroup{16, 1, 1}, {{"out", {{50}, DType::Float64}}});
  config.template_args = {{"T", DType::Float64}, {"SCALE", int64_t{3}}, {"NEGATE", true}};
  const Tensor doubles = kernel({}, config)[0];
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(doubles.data<double>()[i], -(i * 3) / 4.0) << i;
  // Other template values compile another kernel: integer division now.
  config.outputs = {{"out", {{50}, DType::Int64}}};
  config.template_args = {{"T", DType::Int64}, {"SCALE", int64_t{5}}, {"NEGATE", false}};
  const Tensor integers = kernel({}, config)[0];
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(integers.data<int64_t>()[i], i * 5 / 4) << i;
}

TEST(KernelApi, ShapeStridesAndRankNames) {
  const Kernel kernel({.name = "shape_names",
                       .inputs = {"a"},
                       .outputs = {"out"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\n"
                               "out[i] = a_ndim * 1000 + a_shape[i] * 10 + a_strides[i] + out_shape[0] * 100000;\n"});
  const Tensor a = float_tensor({2, 3, 4}, [](int64_t) { return 0.0f; });
  const Tensor out =
      kernel({{"a", a}}, launch(Grid{3, 1, 1}, ThreadGroup{32, 1, 1}, {{"out", {{3}, DType::Int64}}}))[0];
  const int64_t expected[3] = {3 * 1000 + 2 * 10 + 12, 3 * 1000 + 3 * 10 + 4, 3 * 1000 + 4 * 10 + 1};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out.data<int64_t>()[i], expected[i] + 300000) << i;
}

TEST(KernelApi, HeaderFunctions) {
  const Kernel kernel({.name = "with_header",
                       .inputs = {"x"},
                       .outputs = {"out"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\nout[i] = cube(x[i]) + offset();\n",
                       .header = "inline float cube(float v) { return v * v * v; }\n"
                                 "inline float offset() { return 0.25f; }\n"});
  const Tensor x = float_tensor({7}, [](int64_t i) { return static_cast<float>(i) - 3.0f; });
  const Tensor out =
      kernel({{"x", x}}, launch(Grid{7, 1, 1}, ThreadGroup{4, 1, 1}, {{"out", {{7}, DType::Float32}}}))[0];
  for (int64_t i = 0; i < 7; ++i) {
    const float v = static_cast<float>(i) - 3.0f;
    EXPECT_EQ(out.data<float>()[i], v * v * v + 0.25f) << i;
  }
}

// ---- reduction with block shared memory, atomics ----

TEST(KernelApi, BlockReductionInSharedMemory) {
  const Kernel kernel({.name = "block_sum",
                       .inputs = {"x"},
                       .outputs = {"sums"},
                       .body = R"(float* partial = reinterpret_cast<float*>(shared_memory);
const uint32_t local = thread_position_in_threadgroup.x;
const uint32_t i = thread_position_in_grid.x;
partial[local] = i < x_shape[0] ? x[i] : 0.0f;
threadgroup_barrier();
for (uint32_t stride = threads_per_threadgroup.x / 2; stride > 0; stride /= 2) {
  if (local < stride) partial[local] += partial[local + stride];
  threadgroup_barrier();
}
if (local == 0) sums[threadgroup_position_in_grid.x] = partial[0];
)"});
  constexpr int64_t kGroup = 128;
  for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{1000}, int64_t{1} << 15}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const int64_t groups = round_up(n, kGroup) / kGroup;
    const Tensor x = float_tensor({n}, [](int64_t i) { return static_cast<float>(i % 13) - 6.0f; });
    LaunchConfig config =
        launch(Grid{round_up(n, kGroup), 1, 1}, ThreadGroup{kGroup, 1, 1}, {{"sums", {{groups}, DType::Float32}}});
    config.shared_memory_bytes = kGroup * 4;
    const Tensor sums = kernel({{"x", x}}, config)[0];
    for (int64_t g = 0; g < groups; ++g) {
      float expected = 0;
      for (int64_t i = g * kGroup; i < std::min(n, (g + 1) * kGroup); ++i)
        expected += static_cast<float>(i % 13) - 6.0f;
      ASSERT_EQ(sums.data<float>()[g], expected) << "group " << g;
    }
  }
}

TEST(KernelApi, AtomicSum) {
  const Kernel kernel({.name = "atomic_sum",
                       .inputs = {"x"},
                       .outputs = {"total", "count"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\n"
                               "atomic_add(&total[0], x[i]);\natomic_add(&count[i % 3], int64_t(1));\n",
                       .atomic_outputs = true});
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const Tensor x = float_tensor({n}, [](int64_t i) { return static_cast<float>(i % 13) - 6.0f; });
    LaunchConfig config = launch(Grid{n, 1, 1}, ThreadGroup{256, 1, 1},
                                 {{"total", {{1}, DType::Float32}}, {"count", {{3}, DType::Int64}}});
    config.init_value = 0;
    const std::vector<Tensor> out = kernel({{"x", x}}, config);
    double expected = 0;  // integers below 2^24: exact in any order of float additions
    for (int64_t i = 0; i < n; ++i) expected += static_cast<double>(i % 13) - 6.0;
    EXPECT_EQ(out[0].data<float>()[0], expected);
    for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(out[1].data<int64_t>()[r], (n - r + 2) / 3) << r;
  }
}

TEST(KernelApi, AtomicStoreAndLoad) {
  const Kernel kernel({.name = "atomic_store_load",
                       .inputs = {},
                       .outputs = {"f", "d", "i", "l"},
                       .body = R"(const uint32_t t = thread_position_in_grid.x;
atomic_store(&f[t], float(t));
atomic_add(&f[t], atomic_load(&f[t]));
atomic_store(&d[t], 0.5 * t);
atomic_add(&d[t], atomic_load(&d[t]));
atomic_store(&i[t], int32_t(t));
atomic_add(&i[t], atomic_load(&i[t]));
atomic_store(&l[t], int64_t(t) << 40);
atomic_add(&l[t], atomic_load(&l[t]));
)",
                       .atomic_outputs = true});
  const int64_t n = 300;
  const std::vector<Tensor> out = kernel({}, launch(Grid{n, 1, 1}, ThreadGroup{128, 1, 1},
                                                    {{"f", {{n}, DType::Float32}},
                                                     {"d", {{n}, DType::Float64}},
                                                     {"i", {{n}, DType::Int32}},
                                                     {"l", {{n}, DType::Int64}}}));
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(out[0].data<float>()[t], 2.0f * t) << t;
    EXPECT_EQ(out[1].data<double>()[t], 1.0 * t) << t;
    EXPECT_EQ(out[2].data<int32_t>()[t], 2 * t) << t;
    EXPECT_EQ(out[3].data<int64_t>()[t], t << 41) << t;
  }
}

// ---- matrix multiply ----

struct MatmulCase {
  int64_t m, k, n;
};
const std::vector<MatmulCase> kMatmulSizes = {{3, 5, 7}, {37, 19, 23}, {128, 64, 96}};

Tensor matrix(int64_t rows, int64_t cols, int salt) {
  return float_tensor({rows, cols}, [=](int64_t i) { return static_cast<float>((i * 7 + salt) % 11) - 5.0f; });
}

// Small integers: every product and sum is exact in float, whatever the order.
void expect_matmul(const Tensor& a, const Tensor& b, const Tensor& c) {
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  ASSERT_EQ(c.shape(), (Shape{m, n}));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t col = 0; col < n; ++col) {
      float expected = 0;
      for (int64_t i = 0; i < k; ++i) expected += a.data<float>()[r * k + i] * b.data<float>()[i * n + col];
      ASSERT_EQ(c.data<float>()[r * n + col], expected) << r << ", " << col;
    }
}

TEST(KernelApi, MatrixMultiply) {
  const Kernel kernel({.name = "matmul",
                       .inputs = {"a", "b"},
                       .outputs = {"c"},
                       .body = R"(const uint32_t col = thread_position_in_grid.x, row = thread_position_in_grid.y;
const int64_t K = a_shape[1], N = b_shape[1];
float acc = 0.0f;
for (int64_t k = 0; k < K; ++k) acc += a[row * K + k] * b[k * N + col];
c[row * N + col] = acc;
)"});
  for (const MatmulCase& size : kMatmulSizes) {
    SCOPED_TRACE(std::to_string(size.m) + "x" + std::to_string(size.k) + "x" + std::to_string(size.n));
    const Tensor a = matrix(size.m, size.k, 1), b = matrix(size.k, size.n, 2);
    const Tensor c = kernel({{"a", a}, {"b", b}}, launch(Grid{size.n, size.m, 1}, ThreadGroup{16, 16, 1},
                                                         {{"c", {{size.m, size.n}, DType::Float32}}}))[0];
    expect_matmul(a, b, c);
  }
}

TEST(KernelApi, TiledMatrixMultiplyWithBarriers) {
  const Kernel kernel({.name = "matmul_tiled",
                       .inputs = {"a", "b"},
                       .outputs = {"c"},
                       .body = R"(float* tile_a = reinterpret_cast<float*>(shared_memory);
float* tile_b = tile_a + TILE * TILE;
const uint32_t tx = thread_position_in_threadgroup.x, ty = thread_position_in_threadgroup.y;
const uint32_t col = thread_position_in_grid.x, row = thread_position_in_grid.y;
const int64_t M = a_shape[0], K = a_shape[1], N = b_shape[1];
float acc = 0.0f;
for (int64_t k0 = 0; k0 < K; k0 += TILE) {
  tile_a[ty * TILE + tx] = (row < M && k0 + tx < K) ? a[row * K + k0 + tx] : 0.0f;
  tile_b[ty * TILE + tx] = (k0 + ty < K && col < N) ? b[(k0 + ty) * N + col] : 0.0f;
  threadgroup_barrier();
  for (int k = 0; k < TILE; ++k) acc += tile_a[ty * TILE + k] * tile_b[k * TILE + tx];
  threadgroup_barrier();
}
if (row < M && col < N) c[row * N + col] = acc;
)"});
  constexpr int64_t kTile = 8;
  for (const MatmulCase& size : kMatmulSizes) {
    SCOPED_TRACE(std::to_string(size.m) + "x" + std::to_string(size.k) + "x" + std::to_string(size.n));
    const Tensor a = matrix(size.m, size.k, 3), b = matrix(size.k, size.n, 4);
    LaunchConfig config = launch(Grid{round_up(size.n, kTile), round_up(size.m, kTile), 1},
                                 ThreadGroup{kTile, kTile, 1}, {{"c", {{size.m, size.n}, DType::Float32}}});
    config.shared_memory_bytes = 2 * kTile * kTile * 4;
    config.template_args = {{"TILE", kTile}};
    expect_matmul(a, b, kernel({{"a", a}, {"b", b}}, config)[0]);
  }
}

// ---- in-place update ----

TEST(KernelApi, InPlaceUpdate) {
  const Kernel kernel(
      {.name = "in_place",
       .inputs = {"delta"},
       .outputs = {"buffer"},
       .body = "const uint32_t i = thread_position_in_grid.x;\nbuffer[i] = buffer[i] * 2.0f + delta[i];\n"});
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Tensor buffer = float_tensor({n}, [](int64_t i) { return static_cast<float>(i % 50); });
    const Tensor delta = float_tensor({n}, [](int64_t i) { return static_cast<float>(i % 3); });
    const std::vector<Tensor> out =
        kernel({{"delta", delta}, {"buffer", buffer}}, launch(Grid{n, 1, 1}, ThreadGroup{256, 1, 1}));
    EXPECT_EQ(out[0].bytes(), buffer.bytes());  // the same storage
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += buffer.data<float>()[i] != 2.0f * (i % 50) + (i % 3);
    EXPECT_EQ(wrong, 0);
  }
}

TEST(KernelApi, FreshOutputsWithoutInitValueAreNotZero) {
  // Elements the kernel skips keep the 0xff fill: NaN for floats, -1 for integers.
  const Kernel kernel({.name = "writes_evens",
                       .inputs = {},
                       .outputs = {"f", "i"},
                       .body = "const uint32_t t = thread_position_in_grid.x;\n"
                               "if (t % 2 == 0) { f[t] = 1.0f; i[t] = 1; }\n"});
  LaunchConfig config =
      launch(Grid{6, 1, 1}, ThreadGroup{4, 1, 1}, {{"f", {{6}, DType::Float32}}, {"i", {{6}, DType::Int32}}});
  config.init_value.reset();
  const std::vector<Tensor> out = kernel({}, config);
  for (int64_t t = 0; t < 6; ++t) {
    if (t % 2 == 0) {
      EXPECT_EQ(out[0].data<float>()[t], 1.0f);
      EXPECT_EQ(out[1].data<int32_t>()[t], 1);
    } else {
      EXPECT_TRUE(std::isnan(out[0].data<float>()[t])) << t;
      EXPECT_EQ(out[1].data<int32_t>()[t], -1) << t;
    }
  }
}

TEST(KernelApi, EmptyTensors) {
  const Kernel kernel({.name = "empty_tensors",
                       .inputs = {"x"},
                       .outputs = {"count", "nothing"},
                       .body = "count[0] = x_shape[0] + 10 * x_ndim + 100 * x_shape[1];\n"});
  const Tensor x(DType::Float32, {0, 3});
  const std::vector<Tensor> out =
      kernel({{"x", x}}, launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1},
                                {{"count", {{1}, DType::Int64}}, {"nothing", {{0}, DType::Float32}}}));
  EXPECT_EQ(out[0].data<int64_t>()[0], 320);
  EXPECT_EQ(out[1].shape(), Shape{0});
}

// ---- verbose, source, cache ----

TEST(KernelApi, VerbosePrintsTheGeneratedSource) {
  const Kernel kernel({.name = "verbose_kernel",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "out[thread_position_in_grid.x] = 42;  // the body line\n"});
  LaunchConfig config = launch(Grid{4, 1, 1}, ThreadGroup{4, 1, 1}, {{"out", {{4}, DType::Int32}}});
  config.verbose = true;
  testing::internal::CaptureStderr();
  const Tensor out = kernel({}, config)[0];
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("out[thread_position_in_grid.x] = 42;  // the body line"), std::string::npos) << printed;
  EXPECT_NE(printed.find(kernel.generated_source({}, config)), std::string::npos);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(out.data<int32_t>()[i], 42);
}

TEST(KernelApi, SecondLaunchUsesTheLoadedKernel) {
  const Kernel kernel(
      {.name = "cached_twice", .inputs = {}, .outputs = {"out"}, .body = "out[thread_position_in_grid.x] = 7;\n"});
  const LaunchConfig config = launch(Grid{3, 1, 1}, ThreadGroup{4, 1, 1}, {{"out", {{3}, DType::Int32}}});
  kernel({}, config);
  const CacheStats before = cache_stats();
  const Tensor out = kernel({}, config)[0];
  const CacheStats after = cache_stats();
  EXPECT_EQ(after.compiled, before.compiled);
  EXPECT_EQ(after.disk_hits, before.disk_hits);
  EXPECT_EQ(after.memory_hits, before.memory_hits + 1);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out.data<int32_t>()[i], 7);
}

// ---- every misuse is an error ----

const Kernel& copy_kernel() {
  static const Kernel kernel({.name = "copy",
                              .inputs = {"x"},
                              .outputs = {"y"},
                              .body = "y[thread_position_in_grid.x] = x[thread_position_in_grid.x];\n"});
  return kernel;
}

TEST(KernelApiErrors, EmptyGrid) {
  const Tensor x = float_tensor({4}, [](int64_t) { return 1.0f; });
  for (Grid grid : {Grid{0, 1, 1}, Grid{4, 0, 1}, Grid{4, 1, -2}})
    expect_error(
        [&] {
          copy_kernel()({{"x", x}}, launch(grid, ThreadGroup{4, 1, 1}, {{"y", {{4}, DType::Float32}}}));
        },
        {"kernel 'copy'", "grid", "is empty"});
  expect_error(
      [&] {
        copy_kernel()({{"x", x}}, launch(Grid{4, 1, 1}, ThreadGroup{0, 1, 1}, {{"y", {{4}, DType::Float32}}}));
      },
      {"threadgroup", "is empty"});
}

TEST(KernelApiErrors, ThreadgroupLargerThanTheKernelAllows) {
  const Tensor x = float_tensor({4}, [](int64_t) { return 1.0f; });
  expect_error(
      [&] {
        copy_kernel()({{"x", x}}, launch(Grid{4096, 1, 1}, ThreadGroup{2048, 1, 1}, {{"y", {{4}, DType::Float32}}}));
      },
      {"kernel 'copy'", "2048 threads", "limit"});
  // A kernel compiled with a launch bound of 64 threads refuses 128.
  const Kernel bounded({.name = "bounded",
                        .inputs = {},
                        .outputs = {"y"},
                        .body = "y[thread_position_in_grid.x] = 1.0f;\n",
                        .max_threads_per_threadgroup = 64});
  expect_error(
      [&] {
        bounded({}, launch(Grid{128, 1, 1}, ThreadGroup{128, 1, 1}, {{"y", {{128}, DType::Float32}}}));
      },
      {"kernel 'bounded'", "128 threads", "limit of 64"});
  const Tensor ok = bounded({}, launch(Grid{128, 1, 1}, ThreadGroup{64, 1, 1}, {{"y", {{128}, DType::Float32}}}))[0];
  for (int64_t i = 0; i < 128; ++i) EXPECT_EQ(ok.data<float>()[i], 1.0f);
}

TEST(KernelApiErrors, SharedMemoryOverTheDeviceLimit) {
  const Kernel kernel({.name = "big_shared",
                       .inputs = {},
                       .outputs = {"y"},
                       .body = "shared_memory[0] = 1;\ny[thread_position_in_grid.x] = shared_memory[0];\n"});
  LaunchConfig config = launch(Grid{4, 1, 1}, ThreadGroup{4, 1, 1}, {{"y", {{4}, DType::Float32}}});
  config.shared_memory_bytes = int64_t{1} << 30;
  expect_error([&] { kernel({}, config); }, {"kernel 'big_shared'", "shared memory", "device limit"});
  config.shared_memory_bytes = 0;
  expect_error([&] { kernel({}, config); }, {"kernel 'big_shared'", "shared_memory", "reserves none"});
}

TEST(KernelApiErrors, UnboundArgument) {
  const Kernel kernel({.name = "two_inputs",
                       .inputs = {"a", "b"},
                       .outputs = {"y"},
                       .body = "y[thread_position_in_grid.x] = a[0] + b[0];\n"});
  const Tensor a = float_tensor({1}, [](int64_t) { return 1.0f; });
  const LaunchConfig config = launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"y", {{1}, DType::Float32}}});
  expect_error([&] { kernel({{"a", a}}, config); }, {"kernel 'two_inputs'", "unbound argument 'b'"});
  expect_error(
      [&] {
        kernel({{"a", a}, {"b", a}}, launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}));
      },
      {"unbound argument 'y'"});
  expect_error([&] { kernel({{"a", a}, {"b", a}, {"c", a}}, config); }, {"'c'", "not declared by the kernel"});
  LaunchConfig extra_output = config;
  extra_output.outputs["z"] = {{1}, DType::Float32};
  expect_error([&] { kernel({{"a", a}, {"b", a}}, extra_output); }, {"'z'", "not an output"});
  expect_error(
      [&] {
        kernel({{"a", a}, {"b", a}, {"y", Scalar(DType::Float32, 1.0)}}, config);
      },
      {"output 'y' is bound to a scalar"});
}

TEST(KernelApiErrors, NameUsedButNotDeclared) {
  const Kernel kernel({.name = "undeclared",
                       .inputs = {"x"},
                       .outputs = {"y"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\ny[i] = x[i] + not_a_name;\n"});
  const Tensor x = float_tensor({2}, [](int64_t) { return 1.0f; });
  expect_error(
      [&] {
        kernel({{"x", x}}, launch(Grid{2, 1, 1}, ThreadGroup{2, 1, 1}, {{"y", {{2}, DType::Float32}}}));
      },
      {"kernel 'undeclared'", "does not compile", "body line 2", "not_a_name", "y[i] = x[i] + not_a_name;"});
}

TEST(KernelApiErrors, CompileErrorNamesTheLine) {
  const Kernel kernel({.name = "syntax_error",
                       .inputs = {},
                       .outputs = {"y"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\nfloat v = 1.0f;\ny[i] = v +;\n",
                       .header = "inline float helper() { return 1.0f; }\n"});
  expect_error(
      [&] {
        kernel({}, launch(Grid{2, 1, 1}, ThreadGroup{2, 1, 1}, {{"y", {{2}, DType::Float32}}}));
      },
      {"kernel 'syntax_error'", "body line 3", "y[i] = v +;"});
  const Kernel bad_header({.name = "header_error",
                           .inputs = {},
                           .outputs = {"y"},
                           .body = "y[0] = helper();\n",
                           .header = "inline float helper() {\n  return missing;\n}\n"});
  expect_error(
      [&] {
        bad_header({}, launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"y", {{1}, DType::Float32}}}));
      },
      {"header line 2", "return missing;"});
}

TEST(KernelApiErrors, UnsupportedDtype) {
  const Kernel kernel({.name = "atomic_half",
                       .inputs = {},
                       .outputs = {"y"},
                       .body = "atomic_add(&y[0], 1.0f);\n",
                       .atomic_outputs = true});
  for (DType dtype : {DType::Float16, DType::BFloat16, DType::Bool, DType::Int8})
    expect_error(
        [&] {
          kernel({}, launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"y", {{1}, dtype}}}));
        },
        {"kernel 'atomic_half'", std::string(dtype_name(dtype)), "not supported"});
}

TEST(KernelApiErrors, KernelAssertFailsTheLaunch) {
  const Kernel kernel({.name = "asserting",
                       .inputs = {"x"},
                       .outputs = {"y"},
                       .body = "const uint32_t i = thread_position_in_grid.x;\n"
                               "kernel_assert(x[i] >= 0.0f);\ny[i] = x[i];\n"});
  const Tensor x = float_tensor({300}, [](int64_t i) { return i == 257 ? -1.0f : 1.0f; });
  expect_error(
      [&] {
        kernel({{"x", x}}, launch(Grid{300, 1, 1}, ThreadGroup{64, 1, 1}, {{"y", {{300}, DType::Float32}}}));
      },
      {"kernel 'asserting'", "kernel_assert failed", "body line 2", "(257, 0, 0)", "x[i] >= 0.0f"});
  // The same kernel runs when the condition holds.
  const Tensor fine = float_tensor({300}, [](int64_t) { return 2.0f; });
  const Tensor y =
      kernel({{"x", fine}}, launch(Grid{300, 1, 1}, ThreadGroup{64, 1, 1}, {{"y", {{300}, DType::Float32}}}))[0];
  for (int64_t i = 0; i < 300; ++i) EXPECT_EQ(y.data<float>()[i], 2.0f);
}

TEST(KernelApiErrors, BarrierNeedsWholeThreadgroups) {
  const Kernel kernel({.name = "barrier_grid",
                       .inputs = {},
                       .outputs = {"y"},
                       .body = "threadgroup_barrier();\ny[thread_position_in_grid.x] = 1.0f;\n"});
  expect_error(
      [&] {
        kernel({}, launch(Grid{100, 1, 1}, ThreadGroup{64, 1, 1}, {{"y", {{100}, DType::Float32}}}));
      },
      {"kernel 'barrier_grid'", "threadgroup_barrier", "multiple of the threadgroup"});
}

TEST(KernelApiErrors, BadNames) {
  auto make = [](KernelSource source) { return [source] { Kernel kernel(source); }; };
  expect_error(make({.name = "k", .inputs = {"int"}, .outputs = {"y"}, .body = "y[0] = 1;"}), {"input 'int'"});
  expect_error(make({.name = "k", .inputs = {"threadIdx"}, .outputs = {"y"}, .body = "y[0] = 1;"}), {"'threadIdx'"});
  expect_error(make({.name = "k", .inputs = {"x"}, .outputs = {"x"}, .body = "x[0] = 1;"}), {"clashes"});
  expect_error(make({.name = "k", .inputs = {"x", "x_shape"}, .outputs = {"y"}, .body = "y[0] = 1;"}), {"clashes"});
  expect_error(make({.name = "k", .inputs = {"2x"}, .outputs = {"y"}, .body = "y[0] = 1;"}), {"not a C identifier"});
  expect_error(make({.name = "k", .inputs = {"npusim_x"}, .outputs = {"y"}, .body = "y[0] = 1;"}), {"reserved"});
  expect_error(make({.name = "k k", .inputs = {}, .outputs = {"y"}, .body = "y[0] = 1;"}), {"kernel name"});
  expect_error(make({.name = "k", .inputs = {}, .outputs = {}, .body = "return;"}), {"no outputs"});
  expect_error(make({.name = "k", .inputs = {}, .outputs = {"y"}, .body = "  \n"}), {"body is empty"});
  // Template parameters: not twice, not clashing with a parameter's names.
  const Kernel kernel({.name = "templ", .inputs = {"x"}, .outputs = {"y"}, .body = "y[0] = x[0];\n"});
  const Tensor x = float_tensor({1}, [](int64_t) { return 1.0f; });
  LaunchConfig config = launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"y", {{1}, DType::Float32}}});
  config.template_args = {{"x_shape", int64_t{1}}};
  expect_error([&] { kernel({{"x", x}}, config); }, {"template parameter 'x_shape'", "clashes"});
  config.template_args = {{"N", int64_t{1}}, {"N", int64_t{2}}};
  expect_error([&] { kernel({{"x", x}}, config); }, {"template parameter 'N' is given twice"});
}

TEST(KernelApiErrors, BadValuesAndOutputs) {
  const Tensor x = float_tensor({4}, [](int64_t) { return 1.0f; });
  const Kernel scale({.name = "scale_int8",
                      .inputs = {"x", "s"},
                      .outputs = {"y"},
                      .body = "y[thread_position_in_grid.x] = x[thread_position_in_grid.x] * s;\n"});
  const LaunchConfig config = launch(Grid{4, 1, 1}, ThreadGroup{4, 1, 1}, {{"y", {{4}, DType::Float32}}});
  expect_error(
      [&] {
        scale({{"x", x}, {"s", Scalar(DType::Int8, int64_t{300})}}, config);
      },
      {"scalar 's'", "300", "int8"});
  expect_error([&] { scale({{"x", x}, {"s", Scalar(DType::Int32, 0.5)}}, config); }, {"scalar 's'", "whole number"});
  LaunchConfig bad_init = config;
  bad_init.outputs["y"].dtype = DType::Int32;
  bad_init.init_value = 1.5;
  expect_error(
      [&] {
        scale({{"x", x}, {"s", Scalar(DType::Float32, 1.0)}}, bad_init);
      },
      {"init_value", "whole number"});
  // An output bound in place must agree with its spec and be writable.
  Tensor y(DType::Float32, {5});
  expect_error(
      [&] {
        scale({{"x", x}, {"s", Scalar(DType::Float32, 1.0)}, {"y", y}}, config);
      },
      {"output 'y' is bound to a float32 tensor of shape [5]"});
  auto owner = std::make_shared<std::vector<float>>(4, 0.0f);
  const Tensor borrowed = Tensor::borrow(DType::Float32, {4}, owner->data(), owner);
  expect_error(
      [&] {
        scale({{"x", x}, {"s", Scalar(DType::Float32, 1.0)}, {"y", borrowed}},
              launch(Grid{4, 1, 1}, ThreadGroup{4, 1, 1}));
      },
      {"read-only"});
  const Tensor big_rank(DType::Float32, Shape(9, 1));
  expect_error([&] { scale({{"x", big_rank}, {"s", Scalar(DType::Float32, 1.0)}}, config); }, {"rank 9"});
}

}  // namespace npusim::kernels::test
