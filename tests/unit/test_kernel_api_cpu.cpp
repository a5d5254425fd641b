// The kernel API on the CPU: the shared cases (kernel_api_cases.h), the disk cache, the JSON spec and CLI, and
// user kernels as custom ops inside a compiled model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "npusim/kernel_api.h"

namespace npusim::kernels::test {
constexpr Device kTestDevice = Device::Cpu;
}  // namespace npusim::kernels::test

#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "kernel_api/kernel_spec_json.h"
#include "runtime/backend.h"
#include "unit/kernel_api_cases.h"

namespace npusim::kernels::test {

namespace {

std::filesystem::path fresh_folder(const std::string& name) {
  const std::filesystem::path folder =
      std::filesystem::path(NPUSIM_WORK_DIR) / ("kernel_api_" + std::to_string(getpid())) / name;
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

// Every test binary compiles into its own cache folder, so that the statistics start from nothing.
class CacheFolder : public testing::Environment {
 public:
  void SetUp() override { setenv("NPUSIM_CACHE_DIR", fresh_folder("cache").c_str(), 1); }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(NPUSIM_WORK_DIR) / ("kernel_api_" + std::to_string(getpid())),
                                ignored);
  }
};
const auto* const kCacheFolder = testing::AddGlobalTestEnvironment(new CacheFolder);

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

// ---- disk cache ----

TEST(KernelApiCpu, DiskCacheServesAFreshProcess) {
  const std::filesystem::path folder = fresh_folder("disk_cache");
  const ScopedEnv env("NPUSIM_CACHE_DIR", folder.string());
  const Kernel kernel({.name = "disk_cached",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = "out[thread_position_in_grid.x] = 3 * thread_position_in_grid.x;\n"});
  const LaunchConfig config = launch(Grid{5, 1, 1}, ThreadGroup{2, 1, 1}, {{"out", {{5}, DType::Int32}}});
  auto check = [](const Tensor& out) {
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(out.data<int32_t>()[i], 3 * i);
  };
  clear_memory_cache();
  check(kernel({}, config)[0]);
  EXPECT_EQ(cache_stats().compiled, 1);
  EXPECT_EQ(cache_directory(), folder.string());
  std::vector<std::filesystem::path> libraries;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.path().extension() == ".so") libraries.push_back(entry.path());
  ASSERT_EQ(libraries.size(), 1u);
  EXPECT_EQ(libraries[0].filename().string().rfind("disk_cached-", 0), 0u) << libraries[0];
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(libraries[0]).replace_extension(".cpp")));

  // As a new process would: nothing loaded, the library read from disk.
  clear_memory_cache();
  check(kernel({}, config)[0]);
  EXPECT_EQ(cache_stats().compiled, 0);
  EXPECT_EQ(cache_stats().disk_hits, 1);

  // A damaged library is rebuilt rather than trusted.
  clear_memory_cache();
  std::ofstream(libraries[0], std::ios::trunc) << "not a library";
  check(kernel({}, config)[0]);
  EXPECT_EQ(cache_stats().compiled, 1);
  EXPECT_EQ(cache_stats().disk_hits, 0);
}

TEST(KernelApiCpu, DifferentSourcesAndDtypesAreDifferentEntries) {
  const std::filesystem::path folder = fresh_folder("entries");
  const ScopedEnv env("NPUSIM_CACHE_DIR", folder.string());
  clear_memory_cache();
  const Kernel kernel({.name = "entries",
                       .inputs = {"x"},
                       .outputs = {"out"},
                       .body = "out[thread_position_in_grid.x] = x[thread_position_in_grid.x] + 1;\n"});
  const Tensor floats = float_tensor({2}, [](int64_t i) { return static_cast<float>(i); });
  const Tensor ints = make_tensor<int32_t>(DType::Int32, {2}, [](int64_t i) { return static_cast<int32_t>(i); });
  const LaunchConfig config = launch(Grid{2, 1, 1}, ThreadGroup{2, 1, 1}, {{"out", {{2}, DType::Float32}}});
  kernel({{"x", floats}}, config);
  kernel({{"x", ints}}, config);
  const Kernel other_body({.name = "entries",
                           .inputs = {"x"},
                           .outputs = {"out"},
                           .body = "out[thread_position_in_grid.x] = x[thread_position_in_grid.x] + 2;\n"});
  const Tensor out = other_body({{"x", floats}}, config)[0];
  EXPECT_EQ(out.data<float>()[1], 3.0f);
  EXPECT_EQ(cache_stats().compiled, 3);
}

TEST(KernelApiCpu, MissingCompilerIsAnError) {
  const std::filesystem::path folder = fresh_folder("no_compiler");
  const ScopedEnv cache("NPUSIM_CACHE_DIR", folder.string());
  const ScopedEnv compiler("NPUSIM_CXX", "/nonexistent/c++");
  const Kernel kernel({.name = "no_compiler", .inputs = {}, .outputs = {"out"}, .body = "out[0] = 1;\n"});
  expect_error(
      [&] {
        kernel({}, launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"out", {{1}, DType::Int32}}}));
      },
      {"kernel 'no_compiler' (cpu)", "cannot run the C++ compiler", "NPUSIM_CXX"});
}

TEST(KernelApiCpu, CudaIsReportedWhenUnavailable) {
  std::string reason;
  if (cuda_available(&reason)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(reason.empty());
  const Kernel kernel({.name = "on_cuda", .inputs = {}, .outputs = {"out"}, .body = "out[0] = 1;\n"});
  LaunchConfig config = launch(Grid{1, 1, 1}, ThreadGroup{1, 1, 1}, {{"out", {{1}, DType::Int32}}});
  config.device = Device::Cuda;
  expect_error([&] { kernel({}, config); }, {"kernel 'on_cuda' (cuda)"});
}

TEST(KernelApiCpu, ManyThreadsWithBarriers) {
  // 1024 threads per group, each its own OS thread, through several barriers: a block-wide prefix sum.
  const Kernel kernel({.name = "prefix_sum",
                       .inputs = {"x"},
                       .outputs = {"out"},
                       .body = R"(int32_t* values = reinterpret_cast<int32_t*>(shared_memory);
const uint32_t t = thread_position_in_threadgroup.x, n = threads_per_threadgroup.x;
const uint32_t i = thread_position_in_grid.x;
values[t] = x[i];
threadgroup_barrier();
for (uint32_t offset = 1; offset < n; offset *= 2) {
  const int32_t add = t >= offset ? values[t - offset] : 0;
  threadgroup_barrier();
  values[t] += add;
  threadgroup_barrier();
}
out[i] = values[t];
)"});
  const int64_t n = 2048;
  const Tensor x = make_tensor<int32_t>(DType::Int32, {n}, [](int64_t i) { return static_cast<int32_t>(i % 7); });
  LaunchConfig config = launch(Grid{n, 1, 1}, ThreadGroup{1024, 1, 1}, {{"out", {{n}, DType::Int32}}});
  config.shared_memory_bytes = 1024 * 4;
  const Tensor out = kernel({{"x", x}}, config)[0];
  int32_t running = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 1024 == 0) running = 0;
    running += static_cast<int32_t>(i % 7);
    ASSERT_EQ(out.data<int32_t>()[i], running) << i;
  }
}

TEST(KernelApiCpu, EarlyReturnDoesNotBlockTheBarrier) {
  // Threads that return before a barrier stop counting for it, as exited CUDA threads do.
  const Kernel kernel({.name = "early_return",
                       .inputs = {},
                       .outputs = {"out"},
                       .body = R"(const uint32_t t = thread_position_in_threadgroup.x;
if (t % 2 == 1) { out[thread_position_in_grid.x] = -1; return; }
shared_memory[t] = 1;
threadgroup_barrier();
int total = 0;
for (uint32_t k = 0; k < threads_per_threadgroup.x; k += 2) total += shared_memory[k];
out[thread_position_in_grid.x] = total;
)"});
  LaunchConfig config = launch(Grid{32, 1, 1}, ThreadGroup{16, 1, 1}, {{"out", {{32}, DType::Int32}}});
  config.shared_memory_bytes = 16;
  const Tensor out = kernel({}, config)[0];
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(out.data<int32_t>()[i], i % 2 ? -1 : 8) << i;
}

// ---- JSON spec and CLI ----

constexpr const char* kScaleSpec = R"({
  "name": "spec_scale", "inputs": ["x", "factor"], "outputs": ["y"],
  "source": ["const uint32_t i = thread_position_in_grid.x;", "y[i] = x[i] * factor + BIAS;"],
  "arguments": {"x": {"dtype": "float32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
                "factor": {"scalar": 3, "dtype": "float32"}},
  "output_specs": {"y": {"shape": [6], "dtype": "float32"}},
  "grid": [6], "threadgroup": [4], "init_value": -1, "template": {"BIAS": 10}
})";

TEST(KernelApiCpu, JsonSpec) {
  const KernelSpec spec = parse_kernel_spec(kScaleSpec, "scale.json", ".");
  EXPECT_EQ(spec.source.body, "const uint32_t i = thread_position_in_grid.x;\ny[i] = x[i] * factor + BIAS;\n");
  EXPECT_EQ(spec.config.grid.x, 6);
  EXPECT_EQ(spec.config.threadgroup.x, 4);
  EXPECT_EQ(spec.config.init_value, -1.0);
  const Tensor y = Kernel(spec.source)(spec.arguments, spec.config)[0];
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(y.data<float>()[i], (i + 1) * 3.0f + 10.0f) << i;

  const KernelSpec blocks = parse_kernel_spec(
      R"({"name": "b", "outputs": ["y"], "source": "y[0] = 1;", "blocks": [3, 2], "threadgroup": [4, 5]})", "b.json",
      ".");
  EXPECT_EQ(blocks.config.grid.x, 12);
  EXPECT_EQ(blocks.config.grid.y, 10);
  EXPECT_EQ(blocks.config.grid.z, 1);

  auto bad = [](const std::string& text, const std::string& part) {
    expect_error([&] { parse_kernel_spec(text, "bad.json", "."); }, {"bad.json", part});
  };
  bad("{", "not valid JSON");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "grid": [1], "threadgroup": [1], "gird": 1})",
      "unknown key 'gird'");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "threadgroup": [1]})", "missing 'grid'");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "grid": [1, 2, 3, 4], "threadgroup": [1]})", "1 to 3 integers");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "grid": [1], "blocks": [1], "threadgroup": [1]})", "not both");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "grid": [1], "threadgroup": [1],
          "arguments": {"x": {"dtype": "float32", "shape": [3], "data": [1, 2]}}})",
      "2 values for shape [3]");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "grid": [1], "threadgroup": [1], "device": "tpu"})",
      "unknown device 'tpu'");
  bad(R"({"name": "k", "outputs": ["y"], "source": "", "grid": [1], "threadgroup": [1], "template": {"T": "float99"}})",
      "template parameter 'T'");
}

TEST(KernelApiCpu, CommandLine) {
  const std::filesystem::path folder = fresh_folder("cli");
  const std::filesystem::path spec = folder / "scale.json";
  std::ofstream(spec) << kScaleSpec;
  auto run = [&](const std::string& arguments) {
    std::string output;
    FILE* pipe = popen((std::string(NPUSIM_CLI) + " kernel " + arguments + " 2>&1").c_str(), "r");
    std::array<char, 4096> buffer{};
    while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
    const int status = pclose(pipe);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
  };
  const auto [code, output] = run("run " + spec.string() + " --save " + (folder / "out").string());
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("y: float32 [6]\n  13 16 19 22 25 28\n"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::exists(folder / "out" / "y.npy"));

  const auto [source_code, source] = run("run " + spec.string() + " --print-source");
  EXPECT_EQ(source_code, 0);
  EXPECT_NE(source.find("y[i] = x[i] * factor + BIAS;"), std::string::npos) << source;
  EXPECT_NE(source.find("constexpr int BIAS = 10;"), std::string::npos) << source;

  std::ofstream(folder / "broken.json") << R"({"name": "broken", "outputs": ["y"], "source": "y[0] = nothing;",
    "output_specs": {"y": {"shape": [1], "dtype": "float32"}}, "grid": [1], "threadgroup": [1]})";
  const auto [error_code, error] = run("run " + (folder / "broken.json").string());
  EXPECT_EQ(error_code, 1);
  EXPECT_NE(error.find("error: kernel 'broken' (cpu): the generated source does not compile"), std::string::npos)
      << error;
  EXPECT_NE(error.find("body line 1"), std::string::npos) << error;

  EXPECT_EQ(run("frobnicate").first, 2);
}

// ---- custom ops inside a model ----

namespace {

// out = alpha * x + y, elementwise, as a kernel registered under op_type "custom.axpy.default".
void register_axpy_once() {
  static const bool registered = [] {
    CustomOp op;
    op.name = "user_axpy";
    op.spellings = {"custom.axpy.default"};
    op.attrs = {{"alpha", AttrType::Float, AttrValue{1.0}}};
    op.kernel = {.name = "axpy",
                 .inputs = {"x", "y", "alpha"},
                 .outputs = {"out"},
                 .body = "const uint32_t i = thread_position_in_grid.x;\nout[i] = alpha * x[i] + y[i];\n"};
    op.scalar_inputs = {"alpha"};
    op.infer = [](const Attrs&, std::span<const TensorMeta> inputs) {
      if (inputs[0].shape != inputs[1].shape) fail("axpy needs inputs of one shape");
      return std::vector<TensorMeta>{inputs[0]};
    };
    op.launch = [](const Attrs& attrs, std::span<const TensorMeta> inputs, std::span<const TensorMeta>) {
      CustomOpLaunch call;
      call.config.grid = Grid{std::max<int64_t>(1, shape_numel(inputs[0].shape)), 1, 1};
      call.config.threadgroup = ThreadGroup{64, 1, 1};
      call.scalars["alpha"] = Scalar(DType::Float32, attrs.get_float("alpha"));
      return call;
    };
    register_custom_op(std::move(op));
    return true;
  }();
  (void)registered;
}

std::string meta(const std::string& name, const std::string& shape, const std::string& extra = "") {
  return R"({"name": ")" + name + R"(", "shape": )" + shape + R"(, "dtype": "float32")" + extra + "}";
}

// x -> relu -> axpy(relu, x, alpha=2.5) -> out
std::string model_ir(const std::string& out_shape = "[2, 3]") {
  const std::string x_in = meta("x", "[2, 3]", R"(, "producer_node": "x", "producer_output_idx": 0)");
  const std::string relu_in = meta("relu", "[2, 3]", R"(, "producer_node": "relu", "producer_output_idx": 0)");
  return R"({"model_name": "custom", "graph_inputs": [)" + meta("x", "[2, 3]") + R"(], "graph_outputs": [)" +
         meta("axpy", out_shape) + R"(], "weights": [], "weight_name_mapping": {}, "nodes": [
    {"name": "relu", "op_type": "aten.relu.default", "inputs": [)" +
         x_in + R"(], "outputs": [)" + meta("relu", "[2, 3]") + R"(], "attrs": {}},
    {"name": "axpy", "op_type": "custom.axpy.default", "inputs": [)" +
         relu_in + ", " + x_in + R"(], "outputs": [)" + meta("axpy", out_shape) + R"(], "attrs": {"alpha": 2.5}}]})";
}

}  // namespace

TEST(KernelApiCustomOp, RunsInsideACompiledModel) {
  register_axpy_once();
  const OpDef* def = OpRegistry::instance().find("user_axpy");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(OpRegistry::instance().find_spelling("custom.axpy.default").first, def);

  Graph graph = parse_torch_ir(model_ir(), "custom.json");
  ASSERT_EQ(graph.nodes.size(), 2u);
  EXPECT_EQ(graph.nodes[1].op, "user_axpy");
  EXPECT_EQ(graph.nodes[1].def, def);
  EXPECT_TRUE(graph.unsupported_ops().empty());

  const Program program = compiler::compile_graph(std::move(graph), {});
  const auto prepared = make_backend("cpu")->prepare(program, {});
  Tensor x(DType::Float32, {2, 3});
  const float values[6] = {-2.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
  std::memcpy(x.mutable_bytes(), values, sizeof values);
  const NamedTensors outputs = prepared->run({{"x", x}});
  ASSERT_EQ(outputs.size(), 1u);
  ASSERT_EQ(outputs[0].second.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(outputs[0].second.data<float>()[i], 2.5f * std::max(values[i], 0.0f) + values[i]) << i;
}

TEST(KernelApiCustomOp, ShapeFunctionChecksTheIr) {
  register_axpy_once();
  expect_error([&] { parse_torch_ir(model_ir("[6]"), "custom.json"); },
               {"custom.json", "node 'axpy'", "shape [6] in the IR but the op computes [2, 3]"});
}

TEST(KernelApiCustomOp, RegistrationErrors) {
  register_axpy_once();
  auto op = [](std::string name, std::vector<std::string> spellings) {
    CustomOp custom;
    custom.name = std::move(name);
    custom.spellings = std::move(spellings);
    custom.kernel = {.name = "k", .inputs = {"x"}, .outputs = {"y"}, .body = "y[0] = x[0];\n"};
    custom.infer = [](const Attrs&, std::span<const TensorMeta> inputs) { return std::vector<TensorMeta>{inputs[0]}; };
    custom.launch = [](const Attrs&, std::span<const TensorMeta>, std::span<const TensorMeta>) {
      return CustomOpLaunch{};
    };
    return custom;
  };
  expect_error([&] { register_custom_op(op("user_axpy", {"custom.other.default"})); },
               {"'user_axpy'", "already registered"});
  expect_error([&] { register_custom_op(op("relu", {})); }, {"'relu'", "already registered"});
  expect_error([&] { register_custom_op(op("my_relu", {"aten.relu.default"})); },
               {"'aten.relu.default'", "already belongs"});
  expect_error([&] { register_custom_op(op("my_axpy", {"custom.axpy.default"})); }, {"'custom.axpy.default'"});
  CustomOp no_shape = op("no_shape", {});
  no_shape.infer = nullptr;
  expect_error([&] { register_custom_op(no_shape); }, {"'no_shape'", "shape function"});
  CustomOp bad_scalar = op("bad_scalar", {});
  bad_scalar.scalar_inputs = {"alpha"};
  expect_error([&] { register_custom_op(bad_scalar); }, {"scalar input 'alpha' is not an input"});
}

}  // namespace npusim::kernels::test
