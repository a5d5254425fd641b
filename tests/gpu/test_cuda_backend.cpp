// The CUDA backend on a GPU: every op with a CUDA kernel against the registry's reference (fp32, fp16 and bf16
// storage, activation memory poisoned first, each program run twice so the second run replays the captured CUDA
// graph), GEMMs on cuBLASLt with their fused epilogues, ops without a kernel through the host fallback, and whole
// models: ResNet-18/50 against the CPU backend, qwen_tiny prefill and decode logits against the Hugging Face
// reference, and greedy decoding with the KV cache kept on the device.
// The one-node harness is shared with the CPU's (tests/unit/conformance_harness.h).
// Needs a GPU: without one the binary says so and exits with status 1 (ctest -LE gpu skips it).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/generated_kernels.h"
#include "backends/cuda/kernel_op_names.h"
#include "compiler/compile.h"
#include "compiler/target.h"
#include "gpu/graph_blocks.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "llm/native_builder.h"
#include "runtime/compare.h"
#include "runtime/dag_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "unit/conformance_harness.h"

namespace npusim::test {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// One-node cases

std::vector<Case> elementwise_cases() {
  std::vector<Case> cases;
  for (const char* op : {"relu", "silu", "sigmoid", "tanh", "gelu", "neg", "exp"}) {
    cases.push_back(make(op, {f({3, 37})}));
    cases.push_back(make(op, {f({0, 5})}, {}, "empty"));
  }
  cases.push_back(make("gelu", {f({7, 9})}, attrs({{"approximate", S("tanh")}}), "tanh"));
  // Kernels generated and compiled with NVRTC at prepare: 3x37 and 1001 elements end in a tail that is not a whole
  // vector, 8x1024 is whole vectors only.
  for (const char* op :
       {"log",   "log2",     "log10",     "log1p",       "expm1",      "sqrt", "rsqrt",    "reciprocal", "sin",
        "cos",   "tan",      "atan",      "erf",         "abs",        "sign", "floor",    "ceil",       "trunc",
        "round", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu",  "softplus", "mish"}) {
    cases.push_back(make(op, {f({3, 37})}));
    cases.push_back(make(op, {f({0, 5})}, {}, "empty"));
  }
  cases.push_back(make("log", {positive({1001})}, {}, "positive"));
  cases.push_back(make("rsqrt", {positive({8, 1024})}, {}, "positive"));
  cases.push_back(make("hardtanh", {f({33})}, attrs({{"min_val", F(-0.5)}, {"max_val", F(0.25)}}), "bounds"));
  cases.push_back(make("leaky_relu", {f({33})}, attrs({{"negative_slope", F(0.2)}}), "slope"));
  cases.push_back(make("elu", {f({33})}, attrs({{"alpha", F(0.5)}, {"scale", F(1.5)}, {"input_scale", F(2.0)}}), "a"));
  cases.push_back(make("softplus", {f({33})}, attrs({{"beta", F(2.0)}, {"threshold", F(1.0)}}), "beta"));
  cases.push_back(fallback(make("round", {f({33})}, attrs({{"decimals", I(1)}}), "decimals")));
  cases.push_back(make("clamp", {f({65})}, attrs({{"min", F(-0.5)}, {"max", F(0.5)}})));
  cases.push_back(make("clamp", {f({1001})}, attrs({{"min", F(0.1)}}), "min only"));
  cases.push_back(make("clamp", {f({8, 1024})}, attrs({{"max", I(1)}}), "int max"));
  cases.push_back(fallback(make("clamp", {ints({9}, -9, 9)}, attrs({{"max", I(2)}}), "int64")));
  cases.push_back(fallback(make("clamp", {f({9}), f({9})}, {}, "tensor bound")));
  cases.push_back(make("rsub", {f({7, 33}), f({33})}, attrs({{"alpha", F(2.0)}})));
  cases.push_back(make("rsub", {f({1001})}, attrs({{"other", F(1.5)}}), "scalar"));
  cases.push_back(make("masked_fill", {f({7, 33}), bools({7, 33})}, attrs({{"value", F(-1e4)}})));
  cases.push_back(make("masked_fill", {f({2, 3, 37}), bools({3, 1})}, attrs({{"value", I(0)}}), "broadcast mask"));
  cases.push_back(make("masked_fill", {f({5, 8}), bools({8}), f({})}, {}, "tensor value"));
  cases.push_back(fallback(make("masked_fill", {ints({5}, -3, 3), bools({5})}, attrs({{"value", I(7)}}), "int64")));
  cases.push_back(make("pow", {f({3, 37})}, attrs({{"exponent", F(3.0)}})));
  cases.push_back(make("pow", {positive({1001})}, attrs({{"exponent", F(0.5)}}), "square root"));
  cases.push_back(make("pow", {f({8, 1024})}, attrs({{"exponent", I(2)}}), "int exponent"));
  for (const double exponent : {4.0, -1.0, -2.0, -0.5, 1.5})
    cases.push_back(make("pow", {positive({3, 37})}, attrs({{"exponent", F(exponent)}}), std::to_string(exponent)));
  cases.push_back(fallback(make("pow", {positive({9}), f({9})}, {}, "tensor exponent")));
  const Attrs chain = attrs({{"ops", S("mul,add,tanh,pow,sub,div,sigmoid,leaky_relu,gelu")},
                             {"scalars", FL({0.5, 1.0, 0.0, 2.0, 0.25, 3.0, 0.0, 0.1, 0.0})}});
  for (const Shape& shape : std::vector<Shape>{{7, 33}, {1001}, {8, 1024}, {5}, {0, 3}})
    cases.push_back(make("elementwise_chain", {f(shape)}, chain, std::to_string(shape_numel(shape))));
  cases.push_back(make(
      "elementwise_chain", {positive({3, 37})},
      attrs({{"ops", S("log,sqrt,pow,exp,hardswish,abs,rsqrt")}, {"scalars", FL({0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0})}}),
      "positive"));
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                         "logical_and", "logical_or"}) {
    cases.push_back(make(op, {f({2, 1, 33}), f({7, 1})}, {}, "broadcast"));
    cases.push_back(make(op, {f({65}), f({65})}));
    cases.push_back(make(op, {f({0, 3}), f({3})}, {}, "empty"));
  }
  cases.push_back(make("add", {f({7, 33}), f({33})}, attrs({{"alpha", F(2.5)}}), "alpha"));
  cases.push_back(make("add", {f({7, 33})}, attrs({{"other", F(1.5)}}), "scalar"));
  cases.push_back(make("sub", {f({7, 33}), f({7, 1})}, attrs({{"alpha", I(3)}}), "alpha"));
  cases.push_back(make("mul", {f({7, 33})}, attrs({{"other", I(3)}}), "int scalar"));
  cases.push_back(make("mul", {f({1}), f({5, 7, 1})}, {}, "broadcast both"));
  cases.push_back(make("mul", {f({2, 3, 4, 5, 6, 7, 2, 3}), f({3, 1, 5, 1, 7, 1, 3})}, {}, "rank 8"));
  for (const char* op : {"add", "sub", "mul", "maximum", "minimum", "eq", "lt", "ge", "bitwise_and", "bitwise_or",
                         "bitwise_xor", "logical_and"})
    cases.push_back(make(op, {ints({3, 5}, -4, 4), ints({5}, -4, 4)}, {}, "int64"));
  cases.push_back(make("add", {ints({3, 5}, -4, 4), ints({5}, -4, 4)}, attrs({{"alpha", I(-2)}}), "int64 alpha"));
  cases.push_back(make("add", {ints({3, 5}, -4, 4), f({5})}, {}, "int64 + float"));
  cases.push_back(make("bitwise_and", {bools({3, 5}), bools({5})}, {}, "bool"));
  cases.push_back(make("lt", {f({9})}, attrs({{"other", F(0.0)}}), "scalar"));
  cases.push_back(make("add", {f({65, 1025}), f({1025})}, {}, "large"));
  cases.push_back(fallback(make("div", {f({7, 33}), f({33})}, attrs({{"rounding_mode", S("floor")}}), "floor")));
  cases.push_back(make("where", {bools({7, 1}), f({33}), f({7, 33})}));
  cases.push_back(make("where", {bools({7, 33}), f({7, 33})}, attrs({{"other", F(-1.0)}}), "scalar other"));
  cases.push_back(make("where", {bools({9}), ints({9}, -3, 3), ints({9}, 5, 9)}, {}, "int64"));
  cases.push_back(make("where", {bools({3, 1}), f({3, 1001}), f({1001})}, {}, "long rows"));
  cases.push_back(make("to", {f({7, 5})}, attrs({{"dtype", S("torch.int64")}}), "float to int64"));
  cases.push_back(make("to", {f({7, 5})}, attrs({{"dtype", S("torch.bool")}}), "float to bool"));
  cases.push_back(make("to", {ints({7, 5}, -9, 9)}, attrs({{"dtype", S("torch.float32")}}), "int64 to float"));
  cases.push_back(make("to", {f({7, 5})}, attrs({{"dtype", S("torch.bfloat16")}}), "float to bfloat16"));
  cases.push_back(make("to", {bools({7})}, attrs({{"dtype", S("torch.int64")}}), "bool to int64"));
  cases.push_back(make("add_relu", {f({7, 33}), f({33})}));
  cases.push_back(make("silu_mul", {f({7, 33}), f({7, 33})}));
  cases.push_back(make("rope", {f({1, 2, 7, 8}), f({1, 1, 7, 8}), f({1, 1, 7, 8})}));
  cases.push_back(make("rope", {f({2, 3, 5, 6}), f({5, 6}), f({5, 6})}, {}, "broadcast"));
  cases.push_back(fallback(make("cumsum", {f({3, 7})}, attrs({{"dim", I(1)}}))));
  return cases;
}

std::vector<Case> shape_cases() {
  std::vector<Case> cases;
  cases.push_back(make("reshape", {f({6, 5})}, attrs({{"shape", L({5, -1})}})));
  cases.push_back(make("flatten", {f({2, 3, 5})}, attrs({{"start_dim", I(1)}})));
  cases.push_back(make("unsqueeze", {f({3, 5})}, attrs({{"dim", I(-1)}})));
  cases.push_back(make("squeeze", {f({3, 1, 5})}, attrs({{"dim", L({1})}})));
  cases.push_back(make("unflatten", {f({3, 10})}, attrs({{"dim", I(1)}, {"sizes", L({2, 5})}})));
  cases.push_back(make("clone", {f({7})}));
  cases.push_back(make("alias", {ints({7}, 0, 9)}));
  cases.push_back(make("dropout", {f({7})}));
  cases.push_back(make("permute", {f({2, 3, 5})}, attrs({{"dims", L({2, 0, 1})}})));
  cases.push_back(make("permute", {ints({2, 3, 5}, 0, 100)}, attrs({{"dims", L({1, 2, 0})}}), "int64"));
  cases.push_back(make("transpose", {f({2, 7, 33})}, attrs({{"dim0", I(-1)}, {"dim1", I(0)}})));
  cases.push_back(make("transpose", {f({65, 1025})}, attrs({{"dim0", I(0)}, {"dim1", I(1)}}), "large"));
  cases.push_back(make("t", {f({7, 33})}));
  cases.push_back(make("expand", {f({3, 1})}, attrs({{"size", L({2, 3, 7})}})));
  cases.push_back(make("expand", {bools({1, 5})}, attrs({{"size", L({4, -1})}}), "bool"));
  cases.push_back(
      make("slice", {f({7, 33})}, attrs({{"dim", I(1)}, {"start", I(-20)}, {"end", I(31)}, {"step", I(3)}})));
  cases.push_back(make("slice", {f({7, 33})},
                       attrs({{"dim", I(0)}, {"start", I(2)}, {"end", I(std::numeric_limits<int64_t>::max())}}),
                       "open end"));
  cases.push_back(make("slice", {f({7, 33})}, attrs({{"dim", I(1)}, {"start", I(5)}, {"end", I(5)}}), "empty"));
  cases.push_back(make("select", {f({7, 33})}, attrs({{"dim", I(0)}, {"index", I(-2)}})));
  cases.push_back(make("narrow", {f({7, 33})}, attrs({{"dim", I(1)}, {"start", I(3)}, {"length", I(9)}})));
  cases.push_back(make("cat", {f({2, 3, 5}), f({2, 1, 5}), f({2, 7, 5})}, attrs({{"dim", I(1)}})));
  cases.push_back(make("cat", {f({3, 5}), f({0}), f({3, 2})}, attrs({{"dim", I(-1)}}), "skipped empty"));
  cases.push_back(make("cat", {ints({3}, 0, 9), f({2})}, {}, "promoted"));
  cases.push_back(make("index_copy", {f({2, 9, 5}), ints({3}, 0, 9), f({2, 3, 5})}, attrs({{"dim", I(1)}})));
  cases.push_back(make("index", {f({7, 5}), ints({4}, -7, 7)}, attrs({{"_tensor_list_sizes", L({1})}}), "one"));
  cases.push_back(make("index", {bools({1, 9}), ints({1, 1, 1, 1}, 0, 1), ints({1, 1, 1, 9}, 0, 9)},
                       attrs({{"_tensor_list_sizes", L({2})}}), "mask gather"));
  cases.push_back(make("index", {f({3, 4, 5}), ints({2, 1}, 0, 3), ints({3}, -4, 4)},
                       attrs({{"_tensor_list_sizes", L({2})}}), "broadcast"));
  cases.push_back(fallback(make(
      "index", {f({3, 4}), ints({2}, 0, 4)},
      attrs({{"_tensor_list_sizes", L({1})}, {"_tensor_list_none_masks", AttrValue{std::vector<bool>{true, false}}}}),
      "none slot")));
  cases.push_back(fallback(make("flip", {f({3, 5, 7})}, attrs({{"dims", L({0, -1})}}))));
  return cases;
}

std::vector<Case> nn_cases() {
  std::vector<Case> cases;
  cases.push_back(make("linear", {f({1, 7, 65}), w({33, 65}), w({33})}));
  cases.push_back(make("linear", {f({7, 65}), w({33, 65})}, {}, "no bias"));
  cases.push_back(make("linear", {f({1, 65}), w({1000, 65}), w({1000})}, {}, "one row"));
  cases.push_back(make("linear", {f({7, 1}), f({5, 1})}, {}, "activation weight"));
  cases.push_back(make("linear", {f({0, 5}), w({3, 5})}, {}, "empty"));
  cases.push_back(make("linear", {f({3, 257}), w({129, 257}), w({129})}, {}, "odd"));
  cases.push_back(make("linear", {f({1, 64}), w({37, 64}), w({37})}, {}, "gemv"));
  cases.push_back(make("linear", {f({1, 1, 2048}), w({300, 2048})}, {}, "gemv split rows"));
  cases.push_back(make("linear", {f({1, 72}), w({40000, 72}), w({40000})}, {}, "gemv many rows"));
  // Products of two activations on cuBLASLt; batch dims that broadcast partially run on the host.
  cases.push_back(make("mm", {f({7, 33}), f({33, 5})}));
  cases.push_back(make("bmm", {f({3, 7, 9}), f({3, 9, 4})}));
  cases.push_back(make("matmul", {f({2, 3, 5, 8}), f({2, 3, 8, 6})}, {}, "4-d"));
  cases.push_back(make("matmul", {f({4, 5, 8}), f({8, 3})}, {}, "shared right"));
  cases.push_back(make("matmul", {f({8}), f({2, 8, 3})}, {}, "vector left"));
  cases.push_back(make("matmul", {f({3, 8}), f({8})}, {}, "vector right"));
  cases.push_back(make("matmul", {f({5, 1, 8}), f({5, 8, 1})}, {}, "odd"));
  cases.push_back(fallback(make("matmul", {f({2, 1, 5, 8}), f({1, 3, 8, 4})}, {}, "broadcast batch")));
  cases.push_back(make("addmm", {w({5}), f({7, 33}), f({33, 5})}));
  cases.push_back(make("addmm", {f({7, 5}), f({7, 33}), f({33, 5})}, {}, "full bias"));
  cases.push_back(fallback(make("addmm", {w({5}), f({7, 3}), f({3, 5})}, attrs({{"alpha", F(2.0)}}), "alpha")));
  // Normalizations and reductions.
  const Attrs last = attrs({{"normalized_shape", L({37})}});
  cases.push_back(make("layer_norm", {f({3, 37}), w({37}), w({37})}, last));
  cases.push_back(make("layer_norm", {f({3, 37})}, last, "no affine"));
  cases.push_back(make("layer_norm", {f({3, 37}), w({37})}, last, "weight only"));
  cases.push_back(
      make("layer_norm", {f({2, 5, 6}), w({5, 6}), w({5, 6})}, attrs({{"normalized_shape", L({5, 6})}}), "two dims"));
  cases.push_back(make("layer_norm", {f({2, 4097}), w({4097}), w({4097})},
                       attrs({{"normalized_shape", L({4097})}, {"eps", F(1e-3)}}), "long rows"));
  cases.push_back(make("layer_norm", {f({0, 8})}, attrs({{"normalized_shape", L({8})}}), "empty"));
  cases.push_back(make("native_layer_norm", {f({4, 9}), w({9}), w({9})}, attrs({{"normalized_shape", L({9})}})));
  cases.push_back(make("sum", {f({3, 37})}, attrs({{"dim", L({1})}, {"keepdim", B(true)}})));
  cases.push_back(make("sum", {f({2, 3, 5, 7})}, attrs({{"dim", L({2, 3})}}), "inner dims"));
  cases.push_back(make("sum", {f({0, 4})}, attrs({{"dim", L({0})}}), "nothing to sum"));
  cases.push_back(make("mean", {f({3, 1001})}, attrs({{"dim", L({-1})}})));
  cases.push_back(make("mean", {f({2, 3, 5})}, {}, "everything"));
  cases.push_back(make("mean", {f({5, 3, 7})}, attrs({{"dim", L({0, 2})}, {"keepdim", B(true)}}), "outer dims"));
  cases.push_back(make("mean", {f({3, 0})}, attrs({{"dim", L({1})}}), "empty rows"));
  cases.push_back(make("amax", {f({9, 33})}, attrs({{"dim", L({0})}})));
  cases.push_back(make("amin", {f({4, 6, 5})}, attrs({{"dim", L({0, 2})}})));
  cases.push_back(fallback(make("sum", {ints({3, 5}, -4, 4)}, attrs({{"dim", L({1})}}), "int64")));
  cases.push_back(
      make("conv2d", {f({1, 3, 9, 9}), w({4, 3, 3, 3}), w({4})}, attrs({{"stride", L({2})}, {"padding", L({1})}})));
  cases.push_back(make("conv2d", {f({2, 4, 7, 8}), w({6, 2, 3, 2})},
                       attrs({{"groups", I(2)}, {"dilation", L({2, 1})}, {"padding", L({2, 0})}}), "grouped"));
  cases.push_back(make("conv2d", {f({1, 5, 6, 7}), w({3, 5, 1, 1}), w({3})}, {}, "pointwise"));
  cases.push_back(fallback(
      make("conv2d", {f({3, 7, 7}), w({2, 3, 3, 3})}, attrs({{"padding_mode", S("same")}}), "unbatched same")));
  cases.push_back(make("conv2d", {f({1, 4, 5, 5}), w({4, 1, 3, 3}), w({4})},
                       attrs({{"groups", I(4)}, {"padding", L({1})}}), "depthwise"));
  cases.push_back(
      make("fused_conv2d", {f({1, 3, 9, 9}), w({4, 3, 3, 3}), w({4}), f({1, 4, 9, 9})},
           attrs({{"padding", L({1})}, {"has_bias", B(true)}, {"has_residual", B(true)}, {"activation", S("relu")}})));
  cases.push_back(
      make("fused_conv2d", {f({2, 3, 8, 8}), w({4, 3, 3, 3})},
           attrs({{"stride", L({2})}, {"activation", S("hardtanh")}, {"min_val", F(0.0)}, {"max_val", F(0.5)}}),
           "hardtanh"));
  cases.push_back(make("fused_conv2d", {f({1, 3, 5, 5}), w({2, 3, 1, 1}), f({1, 2, 5, 5})},
                       attrs({{"has_residual", B(true)}, {"activation", S("silu")}}), "pointwise residual"));
  cases.push_back(
      make("max_pool2d", {f({1, 3, 9, 9})}, attrs({{"kernel_size", L({3})}, {"stride", L({2})}, {"padding", L({1})}})));
  cases.push_back(make("max_pool2d", {f({2, 7, 8})},
                       attrs({{"kernel_size", L({2, 3})}, {"ceil_mode", B(true)}, {"dilation", L({2})}}),
                       "ceil dilation"));
  const Attrs k3s2p1 = attrs({{"kernel_size", L({3})}, {"stride", L({2})}, {"padding", L({1})}});
  cases.push_back(make("avg_pool2d", {f({1, 3, 9, 9})}, k3s2p1));
  cases.push_back(make("avg_pool2d", {f({2, 3, 9, 10})},
                       attrs({{"kernel_size", L({3})},
                              {"stride", L({2})},
                              {"padding", L({1})},
                              {"ceil_mode", B(true)},
                              {"count_include_pad", B(false)}}),
                       "ceil, pad excluded"));
  cases.push_back(make("avg_pool2d", {f({3, 7, 7})}, attrs({{"kernel_size", L({2, 3})}, {"divisor_override", I(4)}}),
                       "3-d, divisor"));
  cases.push_back(make("avg_pool2d", {f({2, 5, 7, 7})}, attrs({{"kernel_size", L({7})}}), "global"));
  cases.push_back(make("max_pool2d", {f({1, 70001, 3, 2})}, attrs({{"kernel_size", L({2})}, {"padding", L({1})}}),
                       "more planes than a grid's rows"));
  cases.push_back(make("adaptive_avg_pool2d", {f({1, 3, 7, 9})}, attrs({{"output_size", L({3, 4})}})));
  cases.push_back(make("adaptive_avg_pool2d", {f({1, 512, 7, 7})}, attrs({{"output_size", L({1})}}), "global"));
  cases.push_back(
      make("adaptive_avg_pool2d", {f({3, 70, 5, 3})}, attrs({{"output_size", L({1, 1})}}), "global, planes of 15"));
  cases.push_back(make("softmax", {f({7, 33})}, attrs({{"dim", I(-1)}})));
  cases.push_back(make("softmax", {f({130, 513})}, attrs({{"dim", I(1)}}), "wide"));
  cases.push_back(fallback(make("softmax", {f({3, 7, 5})}, attrs({{"dim", I(1)}}), "middle dim")));
  cases.push_back(make("log_softmax", {f({7, 33})}, attrs({{"dim", I(-1)}})));
  cases.push_back(make("log_softmax", {f({130, 513})}, attrs({{"dim", I(1)}}), "wide"));
  cases.push_back(make("rms_norm", {f({2, 7, 33}), w({33})}, attrs({{"normalized_shape", L({33})}, {"eps", F(1e-6)}})));
  cases.push_back(make("rms_norm", {f({7, 3, 5})}, attrs({{"normalized_shape", L({3, 5})}}), "no weight"));
  cases.push_back(make("embedding", {w({33, 9}), ints({2, 7}, 0, 33)}));
  cases.push_back(make("rotary_embedding", {w({4}), ints({2, 7}, 0, 4096)}, attrs({{"attention_scaling", F(0.75)}})));
  return cases;
}

// Attention in every kernel form: single block, split over the keys, tiled, decode on tensor cores, prefill on
// tensor cores.
std::vector<Case> attention_cases() {
  std::vector<Case> cases;
  cases.push_back(make("attention", {f({1, 4, 7, 8}), f({1, 2, 9, 8}), f({1, 2, 9, 8}), f({1, 1, 7, 9})},
                       attrs({{"has_mask", B(true)}})));
  cases.push_back(make("attention", {f({1, 4, 1, 8}), f({1, 2, 9, 8}), f({1, 2, 9, 8}), ints({1}, 4, 5)},
                       attrs({{"has_cache_position", B(true)}, {"scale", F(0.25)}}), "cache position"));
  cases.push_back(make("attention", {f({2, 3, 5, 4}), f({2, 3, 5, 4}), f({2, 3, 5, 6})},
                       attrs({{"is_causal", B(true)}, {"zero_masked_rows", B(true)}}), "causal"));
  cases.push_back(make("attention", {f({1, 4, 5, 8}), f({1, 2, 6, 8}), f({1, 2, 6, 8}), bools({5, 6})},
                       attrs({{"has_mask", B(true)}}), "bool mask"));
  cases.push_back(make("attention", {f({1, 12, 1, 128}), f({1, 2, 300, 128}), f({1, 2, 300, 128})}, {}, "split"));
  cases.push_back(make(
      "attention", {f({1, 4, 1, 16}), f({1, 2, 200, 16}), f({1, 2, 200, 12}), f({1, 1, 1, 200}), ints({1}, 150, 151)},
      attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}}), "split mask cache position"));
  cases.push_back(make("attention", {f({1, 2, 1, 8}), f({1, 2, 170, 8}), f({1, 2, 170, 8}), bools({170})},
                       attrs({{"has_mask", B(true)}}), "split bool mask"));
  // Rows of 20 and 12 features: whole 16-byte vectors in fp32 only (the other storages take the generic split).
  cases.push_back(make("attention", {f({2, 6, 1, 20}), f({2, 3, 389, 20}), f({2, 3, 389, 12})},
                       attrs({{"scale", F(0.3)}}), "split odd rows"));
  cases.push_back(
      make("attention", {f({1, 8, 1, 256}), f({1, 1, 129, 256}), f({1, 1, 129, 40})}, {}, "split wide keys"));
  cases.push_back(make("attention", {f({2, 8, 1, 16}), f({2, 2, 140, 16}), f({2, 4, 140, 24})}, {},
                       "split key and value heads differ"));
  cases.push_back(make("attention", {f({1, 4, 1, 16}), f({1, 2, 12000, 16}), f({1, 2, 12000, 16})}, {},
                       "split longer than shared memory"));
  // Ten query heads per key/value head (two blocks of them), a mask per head, 201 of 300 keys attended.
  cases.push_back(make(
      "attention", {f({1, 20, 1, 16}), f({1, 2, 300, 16}), f({1, 2, 300, 16}), f({1, 20, 1, 300}), ints({1}, 200, 201)},
      attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}}), "decode heads over two blocks"));
  cases.push_back(make("attention", {f({1, 6, 1, 32}), f({1, 2, 160, 32}), f({1, 2, 160, 32}), ints({1}, 20, 21)},
                       attrs({{"has_cache_position", B(true)}}), "decode one run"));
  // The decode form on tensor cores (fp16/bf16 keys and values 64 or 128 wide, a block per key/value head with all
  // its query heads): groups of 8, 7, 3 and 1 (16 take the tiled form), partial tiles, more runs than a warp has
  // lanes, a mask per head, batches; 256-wide rows take the CUDA-core form.
  cases.push_back(make(
      "attention", {f({2, 16, 1, 64}), f({2, 2, 700, 64}), f({2, 2, 700, 64}), f({2, 16, 1, 700}), ints({1}, 500, 501)},
      attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}}), "decode group of 8, mask per head"));
  cases.push_back(make("attention", {f({1, 4, 1, 256}), f({1, 1, 260, 256}), f({1, 1, 260, 256})},
                       attrs({{"scale", F(0.05)}}), "decode 256 wide"));
  cases.push_back(make("attention",
                       {f({1, 32, 1, 128}), f({1, 2, 1000, 128}), f({1, 2, 1000, 128}), f({1, 32, 1, 1000})},
                       attrs({{"has_mask", B(true)}}), "decode group of 16"));
  cases.push_back(
      make("attention", {f({1, 7, 1, 128}), f({1, 1, 90, 128}), f({1, 1, 90, 128})}, {}, "decode group of 7"));
  cases.push_back(make("attention", {f({2, 6, 1, 64}), f({2, 2, 129, 64}), f({2, 2, 129, 64}), bools({129})},
                       attrs({{"has_mask", B(true)}}), "decode group of 3, bool mask"));
  cases.push_back(
      make("attention", {f({1, 2, 1, 128}), f({1, 2, 17000, 128}), f({1, 2, 17000, 128})}, {}, "decode 34 runs"));
  // Every run attended (16 of 16), and 8 of 12 runs attended with a mask per head.
  cases.push_back(make("attention", {f({1, 6, 1, 128}), f({1, 2, 2048, 128}), f({1, 2, 2048, 128})},
                       attrs({{"scale", F(0.2)}}), "decode 16 runs"));
  cases.push_back(
      make("attention",
           {f({1, 8, 1, 64}), f({1, 1, 1500, 64}), f({1, 1, 1500, 64}), f({1, 8, 1, 1500}), ints({1}, 900, 901)},
           attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}}), "decode 8 of 12 runs attended"));
  // Several query rows per head, in blocks of four positions (33 leaves a partial block).
  cases.push_back(make("attention", {f({2, 4, 33, 16}), f({2, 2, 33, 16}), f({2, 2, 33, 16})},
                       attrs({{"is_causal", B(true)}}), "causal rows in blocks"));
  cases.push_back(
      make("attention",
           {f({1, 6, 19, 32}), f({1, 2, 300, 32}), f({1, 2, 300, 32}), f({1, 1, 19, 300}), ints({19}, 100, 120)},
           attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}}), "prefill chunk on a cache"));
  cases.push_back(make("attention", {f({2, 3, 40, 16}), f({2, 3, 200, 16}), f({2, 3, 200, 16})}, {}, "long rows"));
  // Several query rows per head on tensor cores (fp16 and bf16 storage): 16-row fragments and 64-key tiles left
  // partial, query heads of a group sharing a block, masks per head, attended keys bounded by the cache position.
  cases.push_back(make("attention", {f({1, 12, 77, 128}), f({1, 2, 150, 128}), f({1, 2, 150, 128})},
                       attrs({{"is_causal", B(true)}}), "tensor cores wide heads"));
  cases.push_back(make("attention",
                       {f({2, 4, 21, 80}), f({2, 2, 70, 80}), f({2, 2, 70, 80}), f({2, 4, 21, 70}), ints({21}, 40, 60)},
                       attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}, {"scale", F(0.2)}}),
                       "tensor cores mask per head"));
  // A bool mask against one attended key leaves some rows with nothing to attend: zeros, or NaN as the reference.
  for (const bool zero : {true, false})
    cases.push_back(make("attention",
                         {f({1, 2, 40, 32}), f({1, 1, 50, 32}), f({1, 1, 50, 32}), bools({40, 50}), ints({3}, 0, 1)},
                         attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}, {"zero_masked_rows", B(zero)}}),
                         zero ? "tensor cores masked rows zero" : "tensor cores masked rows NaN"));
  cases.push_back(
      make("attention", {f({1, 2, 0, 32}), f({1, 2, 5, 32}), f({1, 2, 5, 32})}, {}, "tensor cores no rows"));
  return cases;
}

// The cases on the CUDA backend; a case with a kernel must also replay its captured CUDA graph on the second run.
void run_on_gpu(const std::vector<Case>& cases) {
  cuda::CudaBackend backend({.poison_memory = true});
  for (const Case& c : cases)
    run_case(c, backend, [](const Case& c, const PreparedProgram& prepared, const std::string& what) {
      if (c.kernel)
        EXPECT_TRUE(cuda::replays_graph(prepared))
            << what << " does not replay a CUDA graph: " << cuda::graph_capture_failure(prepared);
    });
}

TEST(CudaConformance, ElementwiseOps) { run_on_gpu(elementwise_cases()); }

TEST(CudaConformance, ShapeOps) { run_on_gpu(shape_cases()); }

TEST(CudaConformance, NnOps) { run_on_gpu(nn_cases()); }

TEST(CudaConformance, Attention) { run_on_gpu(attention_cases()); }

// Every op with a CUDA kernel appears in at least one case above.
TEST(CudaConformance, EveryKernelHasACase) {
  const std::set<std::string> covered =
      ops_with_a_kernel_case({elementwise_cases(), shape_cases(), nn_cases(), attention_cases()});
  for (const std::string& op : cuda::CudaBackend().capabilities().ops)
    EXPECT_TRUE(covered.count(op)) << op << " has no conformance case";
}

// ---------------------------------------------------------------------------------------------------------------
// GEMMs on cuBLASLt: plans made at prepare (algorithms timed), bias, residual and ReLU in the GEMM's epilogue,
// batched convolutions as one strided-batched GEMM.

// Sets an environment variable for the scope, restoring what was there.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnvironment() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<Case> odd_linear_cases() {
  std::vector<Case> cases;
  for (const int64_t m : {3, 17, 130})
    for (const int64_t n : {1, 7, 1000})
      for (const int64_t k : {5, 33, 1537}) {
        const std::string size = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
        cases.push_back(make("linear", {f({m, k}), w({n, k}), w({n})}, {}, size + " bias"));
        cases.push_back(make("linear", {f({m, k}), w({n, k})}, {}, size));
      }
  return cases;
}

// Convolutions with every epilogue the GEMM may take or leave to the elementwise kernel, batch 1 and 3, odd channel
// and pixel counts, pointwise and 3x3 stride 2.
std::vector<Case> gemm_conv_cases() {
  std::vector<Case> cases;
  const Attrs bias_residual_relu = attrs({{"has_bias", B(true)}, {"has_residual", B(true)}, {"activation", S("relu")}});
  for (const int64_t batch : {1, 3}) {
    const std::string b = " batch " + std::to_string(batch);
    Attrs strided = bias_residual_relu;
    strided.set("stride", L({2}));
    strided.set("padding", L({1}));
    cases.push_back(make("fused_conv2d", {f({batch, 5, 9, 9}), w({7, 5, 3, 3}), w({7}), f({batch, 7, 5, 5})}, strided,
                         "3x3 stride 2 bias residual relu" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 5, 7, 9}), w({7, 5, 1, 1}), w({7}), f({batch, 7, 7, 9})},
                         bias_residual_relu, "pointwise bias residual relu" + b));
    cases.push_back(make("conv2d", {f({batch, 5, 9, 9}), w({7, 5, 3, 3}), w({7})},
                         attrs({{"stride", L({2})}, {"padding", L({1})}}), "3x3 stride 2 bias" + b));
    cases.push_back(make("conv2d", {f({batch, 5, 7, 9}), w({7, 5, 1, 1}), w({7})}, {}, "pointwise bias" + b));
    cases.push_back(make("conv2d", {f({batch, 5, 7, 9}), w({7, 5, 1, 1})}, {}, "pointwise plain" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 5, 9, 9}), w({7, 5, 3, 3}), w({7})},
                         attrs({{"stride", L({2})},
                                {"has_bias", B(true)},
                                {"activation", S("hardtanh")},
                                {"min_val", F(-0.5)},
                                {"max_val", F(1.5)}}),
                         "3x3 stride 2 bias clamp" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 5, 7, 9}), w({7, 5, 3, 3}), f({batch, 7, 7, 9})},
                         attrs({{"padding", L({1})}, {"has_residual", B(true)}, {"activation", S("relu")}}),
                         "3x3 residual relu" + b));
    cases.push_back(
        make("fused_conv2d", {f({batch, 33, 15, 15}), w({64, 33, 3, 3}), w({64}), f({batch, 64, 15, 15})},
             attrs({{"padding", L({1})}, {"has_bias", B(true)}, {"has_residual", B(true)}, {"activation", S("relu")}}),
             "64 channels bias residual relu" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 64, 8, 8}), w({128, 64, 1, 1}), w({128})},
                         attrs({{"has_bias", B(true)}, {"activation", S("relu")}}), "aligned pointwise bias relu" + b));
    // Outputs whose rows are whole 16-byte vectors in half precision (the elementwise epilogue's vector form).
    cases.push_back(make("fused_conv2d", {f({batch, 5, 8, 8}), w({7, 5, 1, 1}), w({7}), f({batch, 7, 8, 8})},
                         bias_residual_relu, "pointwise 8x8 bias residual relu" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 5, 4, 6}), w({7, 5, 3, 3}), w({7})},
                         attrs({{"padding", L({1})},
                                {"has_bias", B(true)},
                                {"activation", S("hardtanh")},
                                {"min_val", F(-0.5)},
                                {"max_val", F(1.5)}}),
                         "3x3 4x6 bias clamp" + b));
  }
  return cases;
}

TEST(CudaGemm, LinearAtOddSizesMatchesTheReference) { run_on_gpu(odd_linear_cases()); }

TEST(CudaGemm, ConvolutionsWithFusedEpiloguesMatchTheReference) { run_on_gpu(gemm_conv_cases()); }

// The same cases with the epilogues left to the elementwise kernels, and with im2col's columns cut into chunks of
// fewer samples than the batch (one or two samples of the 3x3 convolutions each).
TEST(CudaGemm, ConvolutionsWithSeparateEpiloguesAndChunkedColumnsMatchTheReference) {
  {
    ScopedEnvironment off("NPUSIM_CUDA_GEMM_EPILOGUE", "0");
    run_on_gpu(gemm_conv_cases());
  }
  ScopedEnvironment chunked("NPUSIM_CUDA_IM2COL_BYTES", "5000");
  run_on_gpu(gemm_conv_cases());
}

// One case's outputs on the GPU.
NamedTensors gpu_outputs(const Case& c, DType storage) {
  const Built b = build(c, storage);
  cuda::CudaBackend backend({.poison_memory = true});
  const auto prepared = backend.prepare(program_for(b.graph, storage), b.weights);
  EXPECT_TRUE(prepared->fallback_nodes().empty()) << case_name(c);
  prepared->run(b.inputs);
  return prepared->run(b.inputs);  // the replayed graph
}

// $NPUSIM_CUDA_GEMM_TUNE=0 takes the heuristic's first algorithm: both paths match the reference and each other.
TEST(CudaGemm, UntunedAndTunedAlgorithmsAgree) {
  const std::vector<Case> cases{
      make("linear", {f({130, 1537}), w({1000, 1537}), w({1000})}, {}, "bias"),
      make("linear", {f({17, 33}), w({7, 33})}, {}, "small"),
      make("fused_conv2d", {f({3, 33, 15, 15}), w({64, 33, 3, 3}), w({64}), f({3, 64, 15, 15})},
           attrs({{"padding", L({1})}, {"has_bias", B(true)}, {"has_residual", B(true)}, {"activation", S("relu")}}))};
  for (const Case& c : cases) {
    for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
      const std::string what = case_name(c) + " " + std::string(dtype_name(storage));
      SCOPED_TRACE(what);
      const Built b = build(c, storage);
      const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(b.inputs);
      NamedTensors untuned;
      {
        ScopedEnvironment first("NPUSIM_CUDA_GEMM_TUNE", "0");
        untuned = gpu_outputs(c, storage);
      }
      const NamedTensors tuned = gpu_outputs(c, storage);
      ASSERT_EQ(untuned.size(), expected.size());
      ASSERT_EQ(tuned.size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        expect_matches(untuned[i].second, expected[i].second, storage, what + " untuned");
        expect_matches(tuned[i].second, expected[i].second, storage, what + " tuned");
        expect_matches(tuned[i].second, untuned[i].second, storage, what + " tuned against untuned");
      }
    }
  }
}

// The ResNets' convolutions lose their epilogue launches (bias, residual and ReLU in the GEMM): fewer nodes in the
// captured graph than with the epilogues run separately ($NPUSIM_CUDA_GEMM_EPILOGUE=0), and the same logits.
TEST(CudaGemm, ResNetConvolutionEpiloguesFuseIntoTheGemms) {
  // ResNet-50's logits overflow fp16 with random weights, hence bf16 there.
  for (const auto& [arch, storage] : {std::pair{"resnet18", DType::Float16}, std::pair{"resnet50", DType::BFloat16}}) {
    SCOPED_TRACE(arch);
    const Graph graph = read_torch_ir(kFixtures + "/ir/" + arch + "_ir.json");
    const auto weights = random_weights(graph);
    const std::map<std::string, Tensor> inputs{{"x", random_input(graph.value(graph.inputs[0]), 5)}};
    compiler::CompileOptions options;
    options.compute_dtype = storage;
    const Program program = compiler::compile_graph(graph, options);
    auto run_twice = [&](size_t& nodes) {
      const auto prepared = cuda::CudaBackend().prepare(program, compiled_weights(program.graph, weights));
      EXPECT_TRUE(prepared->fallback_nodes().empty());
      prepared->run(inputs);
      const Tensor logits = prepared->run(inputs)[0].second;
      nodes = cuda::captured_graph_nodes(*prepared);
      return logits;
    };
    size_t fused_nodes = 0, separate_nodes = 0;
    const Tensor fused = run_twice(fused_nodes);
    Tensor separate;
    {
      ScopedEnvironment off("NPUSIM_CUDA_GEMM_EPILOGUE", "0");
      separate = run_twice(separate_nodes);
    }
    std::printf("%s %s: %zu graph nodes with the epilogues in the GEMMs, %zu with them separate\n", arch,
                std::string(dtype_name(storage)).c_str(), fused_nodes, separate_nodes);
    EXPECT_GT(fused_nodes, 0u);
    EXPECT_LT(fused_nodes, separate_nodes);
    const Comparison c = compare_tensors(fused, separate, 5);
    EXPECT_GT(c.pearson, 0.999) << c.summary();
    EXPECT_TRUE(c.all_argmax_match()) << c.summary();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Convolutions on cuDNN ($NPUSIM_CUDA_CONV=cudnn) and on im2col + cuBLASLt ($NPUSIM_CUDA_CONV=lt), each forced; without
// cuDNN the forced cases run on the other paths and still match.

// The GEMM cases and the shapes only cuDNN or the direct kernel take: a 7x7 stride 2 stem, two groups, depthwise.
std::vector<Case> cudnn_conv_cases() {
  std::vector<Case> cases = gemm_conv_cases();
  for (const int64_t batch : {1, 3}) {
    const std::string b = " batch " + std::to_string(batch);
    cases.push_back(
        make("fused_conv2d", {f({batch, 3, 23, 21}), w({8, 3, 7, 7}), w({8})},
             attrs({{"stride", L({2})}, {"padding", L({3})}, {"has_bias", B(true)}, {"activation", S("relu")}}),
             "7x7 stride 2 pad 3 bias relu" + b));
    cases.push_back(make("conv2d", {f({batch, 3, 23, 21}), w({5, 3, 7, 7})},
                         attrs({{"stride", L({2})}, {"padding", L({3})}}), "7x7 stride 2 pad 3 plain" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 6, 9, 7}), w({10, 3, 3, 3}), w({10}), f({batch, 10, 9, 7})},
                         attrs({{"padding", L({1})},
                                {"groups", I(2)},
                                {"has_bias", B(true)},
                                {"has_residual", B(true)},
                                {"activation", S("relu")}}),
                         "groups 2 bias residual relu" + b));
    cases.push_back(make("conv2d", {f({batch, 7, 11, 9}), w({7, 1, 3, 3}), w({7})},
                         attrs({{"groups", I(7)}, {"padding", L({1})}}), "depthwise bias" + b));
    cases.push_back(make("fused_conv2d", {f({batch, 7, 11, 9}), w({7, 1, 3, 3})},
                         attrs({{"groups", I(7)},
                                {"stride", L({2})},
                                {"padding", L({1})},
                                {"activation", S("hardtanh")},
                                {"min_val", F(0.0)},
                                {"max_val", F(0.5)}}),
                         "depthwise stride 2 clamp" + b));
  }
  return cases;
}

TEST(CudaConv, ConvolutionsForcedThroughCudnnMatchTheReference) {
  const std::vector<Case> cases = cudnn_conv_cases();
  const size_t before = cuda::cudnn_convolutions_chosen();
  {
    ScopedEnvironment forced("NPUSIM_CUDA_CONV", "cudnn");
    run_on_gpu(cases);
  }
  const size_t chosen = cuda::cudnn_convolutions_chosen() - before;
  if (!cuda::cudnn_available()) {
    EXPECT_EQ(chosen, 0u);
    GTEST_SKIP() << "libcudnn.so.9 is not loadable here: the cases ran on the other paths";
  }
  EXPECT_EQ(chosen, 3 * cases.size()) << "every case in every storage on cuDNN";
}

TEST(CudaConv, ConvolutionsForcedThroughLtMatchTheReference) {
  const size_t before = cuda::cudnn_convolutions_chosen();
  ScopedEnvironment forced("NPUSIM_CUDA_CONV", "lt");
  run_on_gpu(cudnn_conv_cases());
  EXPECT_EQ(cuda::cudnn_convolutions_chosen(), before);
}

// ResNet-18 with every convolution on cuDNN, against the CPU backend (fp32 to 1e-4 with the top 5 in order, fp16 by
// correlation and the top class).
// ResNet logits on the CUDA backend against the CPU backend's. Random weights leave classes close together: the
// top-5 order is checked at full precision, and against PyTorch's well-separated classes in
// ResNetAgainstPyTorchOnCuda.
void expect_resnet_logits_match(const Tensor& actual, const Tensor& expected, DType storage) {
  const Comparison c = compare_tensors(actual, expected, 5);
  if (storage == DType::Float32) {
    EXPECT_LE(c.max_abs_diff, 1e-4 * std::max(1.0, c.max_abs_reference)) << c.summary();
    EXPECT_TRUE(c.all_topk_match()) << c.summary();
  } else {
    EXPECT_GT(c.pearson, 0.999) << c.summary();
  }
  EXPECT_TRUE(c.all_argmax_match()) << c.summary();
}

TEST(CudaConv, ResNet18OnCudnnMatchesTheCpuBackend) {
  if (!cuda::cudnn_available()) GTEST_SKIP() << "libcudnn.so.9 is not loadable here";
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  const auto weights = random_weights(graph);
  const std::map<std::string, Tensor> inputs{{"x", random_input(graph.value(graph.inputs[0]), 5)}};
  compiler::CompileOptions fp32_options;
  const Program fp32 = compiler::compile_graph(graph, fp32_options);
  const Tensor expected = cpu::CpuBackend().prepare(fp32, compiled_weights(fp32.graph, weights))->run(inputs)[0].second;
  ScopedEnvironment forced("NPUSIM_CUDA_CONV", "cudnn");
  for (const DType storage : {DType::Float32, DType::Float16}) {
    SCOPED_TRACE(std::string(dtype_name(storage)));
    compiler::CompileOptions options;
    options.compute_dtype = storage;
    const Program program = compiler::compile_graph(graph, options);
    const size_t convolutions =
        static_cast<size_t>(std::count_if(program.graph.nodes.begin(), program.graph.nodes.end(), [](const Node& node) {
          return node.op == "conv2d" || node.op == "fused_conv2d";
        }));
    const size_t before = cuda::cudnn_convolutions_chosen();
    const auto prepared = cuda::CudaBackend().prepare(program, compiled_weights(program.graph, weights));
    EXPECT_EQ(cuda::cudnn_convolutions_chosen() - before, convolutions);
    EXPECT_GE(convolutions, 20u);
    EXPECT_TRUE(prepared->fallback_nodes().empty());
    for (int run = 0; run < 2; ++run) {
      expect_resnet_logits_match(prepared->run(inputs)[0].second, expected, storage);
    }
    EXPECT_TRUE(cuda::replays_graph(*prepared)) << cuda::graph_capture_failure(*prepared);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Decode GEMV fusion: one-row linears reading the same row run as one batched GEMV (a residual add folded into
// its linear), a gate/up pair with its silu_mul as one gated GEMV.

struct DecodeBlock {
  Built built;
  size_t unfused_kernels = 0;
};

// With `norms`, each group of linears reads its row through an rms_norm that becomes the GEMV's prologue, and one
// more normalized row is also an output of the graph (so its rms_norm must still run).
DecodeBlock decode_block(DType storage, int64_t k, bool norms) {
  DecodeBlock block;
  Built& b = block.built;
  b.graph.source = "decode block";
  BlockBuilder g{b, storage};
  auto value = [&](const std::string& name, Shape shape, bool weight) {
    return g.input(name, Operand{shape, DType::Float32, weight});
  };
  auto node = [&](const std::string& op, const std::string& name, std::vector<ValueId> inputs, Attrs a = {}) {
    ++block.unfused_kernels;
    return g.node(op, name, std::move(inputs), std::move(a));
  };
  const ValueId x = value("x", {1, 1, k}, false), residual = value("residual", {1, 1, 40}, false);
  auto row = [&](const std::string& name) {
    if (!norms) return x;
    return node("rms_norm", name, {x, value(name + ".weight", {k}, true)},
                attrs({{"normalized_shape", L({k})}, {"eps", F(1e-5)}}));
  };
  const ValueId attention_row = row("input_norm");
  const ValueId q = node("linear", "q", {attention_row, value("wq", {40, k}, true), value("bq", {40}, true)});
  const ValueId kv = node("linear", "k", {attention_row, value("wk", {24, k}, true), value("bk", {24}, true)});
  const ValueId o = node("linear", "o", {attention_row, value("wo", {40, k}, true)});
  const ValueId sum = node("add", "sum", {residual, o});
  const ValueId mlp_row = row("post_norm");
  const ValueId gate = node("linear", "gate", {mlp_row, value("wg", {56, k}, true)});
  const ValueId up = node("linear", "up", {mlp_row, value("wu", {56, k}, true)});
  const ValueId gated = node("silu_mul", "gated", {gate, up});
  b.graph.outputs = {q, kv, sum, gated};
  if (norms) {
    const ValueId head = node("linear", "head", {row("final_norm"), value("wh", {72, k}, true)});
    const ValueId shown = row("shown_norm");
    const ValueId head2 = node("linear", "head2", {shown, value("wh2", {8, k}, true)});
    b.graph.outputs.insert(b.graph.outputs.end(), {head, shown, head2});
  }
  compiler::renumber_producers(b.graph);
  return block;
}

TEST(CudaFusion, DecodeGemvsFuseIntoFewLaunchesAndMatchTheReference) {
  for (const bool norms : {false, true}) {
    for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
      for (const int64_t k : {int64_t{8}, int64_t{264}, int64_t{4104}}) {
        const std::string what =
            std::string(dtype_name(storage)) + " k=" + std::to_string(k) + (norms ? " with norms" : "");
        SCOPED_TRACE(what);
        DecodeBlock block = decode_block(storage, k, norms);
        const Built& b = block.built;
        const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(b.inputs);
        // Fused: q/k/o+add, gate/up/silu_mul, and with norms the head with its norm, and the shown norm and head2.
        const size_t fused_launches = norms ? 5u : 2u;
        for (const bool fuse : {true, false}) {
          cuda::CudaBackend backend({.poison_memory = true, .fuse_kernels = fuse});
          const auto prepared = backend.prepare(program_for(b.graph, storage), b.weights);
          EXPECT_TRUE(prepared->fallback_nodes().empty());
          EXPECT_EQ(prepared->last_timings().size(), fuse ? fused_launches : block.unfused_kernels);
          for (int run = 0; run < 2; ++run) {
            const NamedTensors actual = prepared->run(b.inputs);
            ASSERT_EQ(actual.size(), expected.size());
            for (size_t i = 0; i < actual.size(); ++i)
              expect_matches(actual[i].second, expected[i].second, storage,
                             what + (fuse ? " fused" : " unfused") + " output " + actual[i].first);
          }
        }
      }
    }
  }
}

// A decoder layer's rotary embeddings and KV-cache writes: rope(q), rope(k) into the key cache, v into the value
// cache, all in place on state, as one launch.
Built rope_cache_block(DType storage) {
  Built b;
  b.graph.source = "rope cache block";
  BlockBuilder g{b, storage};
  const ValueId q = g.input("q", f({1, 4, 1, 10})), k = g.input("k", f({1, 2, 1, 10})),
                v = g.input("v", f({1, 2, 1, 6}));
  const ValueId cos = g.input("cos", f({1, 1, 1, 10})), sin = g.input("sin", f({1, 1, 1, 10}));
  const ValueId position = g.input("position", ints({1}, 0, 13));
  const ValueId cache_k = g.input("cache_k", f({1, 2, 13, 10})), cache_v = g.input("cache_v", f({1, 2, 13, 6}));
  const ValueId q_rotated = g.node("rope", "q_rotated", {q, cos, sin});
  const ValueId k_rotated = g.node("rope", "k_rotated", {k, cos, sin});
  const ValueId new_k = g.node("index_copy", "new_k", {cache_k, position, k_rotated}, attrs({{"dim", I(2)}}));
  const ValueId new_v = g.node("index_copy", "new_v", {cache_v, position, v}, attrs({{"dim", I(-2)}}));
  b.graph.outputs = {q_rotated, new_k, new_v};
  compiler::renumber_producers(b.graph);
  return b;
}

TEST(CudaFusion, RopeAndCacheWritesRunAsOneLaunchAndMatchTheReference) {
  const std::vector<std::pair<std::string, std::string>> pairs{{"cache_k", "new_k"}, {"cache_v", "new_v"}};
  for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
    for (const bool fuse : {true, false}) {
      const std::string what = std::string(dtype_name(storage)) + (fuse ? " fused" : " unfused");
      SCOPED_TRACE(what);
      Built b = rope_cache_block(storage);
      cuda::CudaBackend backend({.poison_memory = true, .fuse_kernels = fuse});
      const auto prepared = backend.prepare_with_state(program_for(b.graph, storage), b.weights, pairs);
      EXPECT_EQ(prepared->last_timings().size(), fuse ? 1u : 4u);
      std::map<std::string, Tensor> cache{{"cache_k", Tensor(DType::Float32, {1, 2, 13, 10})},
                                          {"cache_v", Tensor(DType::Float32, {1, 2, 13, 6})}};
      for (const int64_t at : {int64_t{3}, int64_t{12}, int64_t{-13}}) {  // -13 wraps to slot 0
        std::map<std::string, Tensor> inputs = b.inputs;
        inputs.erase("cache_k");
        inputs.erase("cache_v");
        inputs["position"].mutable_data<int64_t>()[0] = at;
        std::map<std::string, Tensor> reference_inputs = inputs;
        reference_inputs.insert(cache.begin(), cache.end());
        const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(reference_inputs);
        const NamedTensors actual = prepared->run(inputs);
        ASSERT_EQ(actual.size(), 1u);  // the caches are state, read below
        expect_matches(actual[0].second, expected[0].second, storage, what + " q_rotated");
        expect_matches(prepared->read_state("cache_k"), expected[1].second, storage, what + " key cache");
        expect_matches(prepared->read_state("cache_v"), expected[2].second, storage, what + " value cache");
        cache["cache_k"] = expected[1].second;
        cache["cache_v"] = expected[2].second;
      }
      std::map<std::string, Tensor> bad = b.inputs;
      bad.erase("cache_k");
      bad.erase("cache_v");
      bad["position"].mutable_data<int64_t>()[0] = 13;
      try {
        prepared->run(bad);
        ADD_FAILURE() << "a position past the cache must fail";
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find("out of range"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find("'new_"), std::string::npos) << error.what();
      }
    }
  }
}

// A prefill chunk's attention as the native builder writes it: projections [1, T, heads * D] split into heads and
// transposed, rope on q and k, k and v written into state caches at the chunk's positions, attention against the
// caches under a causal mask, its output transposed back, merged, projected and added to the residual.
Built prefill_attention_block(DType storage, int64_t tokens, int64_t start, int64_t context) {
  constexpr int64_t kQHeads = 4, kKvHeads = 2, kWidth = 32;
  Built b;
  b.graph.source = "prefill attention block";
  BlockBuilder g{b, storage};
  const ValueId cos = g.input("cos", f({1, 1, tokens, kWidth})), sin = g.input("sin", f({1, 1, tokens, kWidth}));
  const auto heads = [&](const std::string& name, int64_t count) {
    const ValueId flat = g.input(name, f({1, tokens, count * kWidth}));
    const ValueId split = g.node("reshape", name + ".heads", {flat}, attrs({{"shape", L({1, tokens, count, kWidth})}}));
    return g.node("transpose", name + ".t", {split}, attrs({{"dim0", I(1)}, {"dim1", I(2)}}));
  };
  const ValueId q = g.node("rope", "q.rope", {heads("q", kQHeads), cos, sin});
  const ValueId k = g.node("rope", "k.rope", {heads("k", kKvHeads), cos, sin});
  const ValueId v = heads("v", kKvHeads);
  const ValueId positions = g.input("cache_position", ints({tokens}, 0, 1));
  const ValueId mask = g.input("mask", f({1, 1, tokens, context}));
  const ValueId cache_k = g.input("cache_k", f({1, kKvHeads, context, kWidth}));
  const ValueId cache_v = g.input("cache_v", f({1, kKvHeads, context, kWidth}));
  const ValueId new_k = g.node("index_copy", "new_k", {cache_k, positions, k}, attrs({{"dim", I(2)}}));
  const ValueId new_v = g.node("index_copy", "new_v", {cache_v, positions, v}, attrs({{"dim", I(2)}}));
  const ValueId attended = g.node("attention", "sdpa", {q, new_k, new_v, mask, positions},
                                  attrs({{"has_mask", B(true)}, {"has_cache_position", B(true)}, {"scale", F(0.2)}}));
  const ValueId back = g.node("transpose", "sdpa.t", {attended}, attrs({{"dim0", I(1)}, {"dim1", I(2)}}));
  const ValueId merged = g.node("reshape", "merged", {back}, attrs({{"shape", L({1, tokens, kQHeads * kWidth})}}));
  const ValueId projected =
      g.node("linear", "o", {merged, g.input("o.weight", w({kQHeads * kWidth, kQHeads * kWidth}))});
  const ValueId residual = g.input("residual", f({1, tokens, kQHeads * kWidth}));
  const ValueId sum = g.node("add", "residual_add", {residual, projected});
  b.graph.outputs = {sum, new_k, new_v};
  compiler::renumber_producers(b.graph);
  for (int64_t i = 0; i < tokens; ++i) b.inputs["cache_position"].mutable_data<int64_t>()[i] = start + i;
  b.inputs["mask"] = causal_chunk_mask(start, tokens, context);
  return b;
}

TEST(CudaFusion, PrefillTransposesFoldIntoRopeCacheWritesAndAttention) {
  const std::vector<std::pair<std::string, std::string>> pairs{{"cache_k", "new_k"}, {"cache_v", "new_v"}};
  constexpr int64_t kTokens = 37, kStart = 5, kContext = 90;
  for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
    std::optional<Tensor> fused_key_cache;
    for (const bool fuse : {true, false}) {
      const std::string what = std::string(dtype_name(storage)) + (fuse ? " fused" : " unfused");
      SCOPED_TRACE(what);
      Built b = prefill_attention_block(storage, kTokens, kStart, kContext);
      cuda::CudaBackend backend({.poison_memory = true, .fuse_kernels = fuse});
      const auto prepared = backend.prepare_with_state(program_for(b.graph, storage), b.weights, pairs);
      EXPECT_TRUE(prepared->fallback_nodes().empty());
      // 15 nodes; fused, the q/k/v transposes fold into the ropes and the value cache write, the key cache write
      // into the k rope, the residual add into the projection's GEMM and (fp16/bf16, on tensor cores) the output
      // transpose into the attention.
      std::map<std::string, int> launches;
      for (const KernelTiming& timing : prepared->last_timings()) ++launches[timing.op];
      if (fuse) {
        EXPECT_EQ(launches["transpose+rope"], 1) << what;
        EXPECT_EQ(launches["transpose+rope+index_copy"], 1) << what;
        EXPECT_EQ(launches["transpose+index_copy"], 1) << what;
        EXPECT_EQ(launches["linear+add"], 1) << what;
        EXPECT_EQ(launches["attention+transpose"], storage == DType::Float32 ? 0 : 1) << what;
        EXPECT_EQ(prepared->last_timings().size(), storage == DType::Float32 ? 10u : 9u) << what;
      } else {
        EXPECT_EQ(prepared->last_timings().size(), 15u) << what;
      }
      std::map<std::string, Tensor> reference_inputs = b.inputs;
      reference_inputs["cache_k"] = Tensor(DType::Float32, {1, 2, kContext, 32});
      reference_inputs["cache_v"] = Tensor(DType::Float32, {1, 2, kContext, 32});
      std::map<std::string, Tensor> inputs = b.inputs;
      inputs.erase("cache_k");
      inputs.erase("cache_v");
      const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(reference_inputs);
      for (int run = 0; run < 2; ++run) {
        const NamedTensors actual = prepared->run(inputs);
        ASSERT_EQ(actual.size(), 1u);  // the caches are state, read below
        // rope, attention and the projection each round to the storage: three ops' tolerance.
        expect_matches(actual[0].second, expected[0].second, storage, what + " projected", 3);
        // The folded transposes change the addressing, not the values: the caches match the unfused run's exactly.
        const Tensor key_cache = prepared->read_state("cache_k");
        if (fuse) {
          fused_key_cache = key_cache;
        } else {
          ASSERT_TRUE(fused_key_cache.has_value());
          for (int64_t i = 0; i < key_cache.numel(); ++i)
            ASSERT_EQ(key_cache.data<float>()[i], fused_key_cache->data<float>()[i]) << what << " element " << i;
        }
        expect_matches(prepared->read_state("cache_k"), expected[1].second, storage, what + " key cache");
        expect_matches(prepared->read_state("cache_v"), expected[2].second, storage, what + " value cache");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Pointwise runs: consecutive pointwise nodes as one kernel generated with NVRTC at prepare time.

TEST(CudaFusion, PointwiseRunsRunAsOneGeneratedKernelAndMatchTheReference) {
  for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
    for (const Shape& shape : std::vector<Shape>{{7, 1001}, {3, 4, 64}, {1, 1}}) {
      for (const bool bias_sum_is_output : {false, true}) {
        const std::string what = std::string(dtype_name(storage)) + " " + std::to_string(shape_numel(shape)) +
                                 (bias_sum_is_output ? " with the biased sum an output" : "");
        SCOPED_TRACE(what);
        GeluBlock block = gelu_block(storage, shape, bias_sum_is_output);
        const Built& b = block.built;
        const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(b.inputs);
        for (const bool fuse : {true, false}) {
          cuda::CudaBackend backend({.poison_memory = true, .fuse_kernels = fuse});
          const auto prepared = backend.prepare(program_for(b.graph, storage), b.weights);
          EXPECT_TRUE(prepared->fallback_nodes().empty());
          // Fused: one kernel, or the biased sum's add and then the rest.
          const size_t launches = bias_sum_is_output ? 2u : 1u;
          EXPECT_EQ(prepared->last_timings().size(), fuse ? launches : block.nodes);
          for (int run = 0; run < 2; ++run) {
            const NamedTensors actual = prepared->run(b.inputs);
            ASSERT_EQ(actual.size(), expected.size());
            // Unfused, each of the ten ops rounds to the storage; fused, only the last.
            for (size_t i = 0; i < actual.size(); ++i)
              expect_matches(actual[i].second, expected[i].second, storage,
                             what + (fuse ? " fused" : " unfused") + " output " + actual[i].first, fuse ? 1 : 10);
          }
          EXPECT_TRUE(cuda::replays_graph(*prepared)) << cuda::graph_capture_failure(*prepared);
        }
      }
    }
  }
}

// Two inputs of the same shape, read 16 bytes at a time (with an element-wise tail where the count is not a whole
// number of vectors). Preparing the same program again compiles nothing.
TEST(CudaFusion, ContiguousPointwiseRunsReadWholeVectorsAndCompileOnce) {
  for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
    for (const int64_t count : {int64_t{8}, int64_t{1001}, int64_t{4096}, int64_t{5}}) {
      const std::string what = std::string(dtype_name(storage)) + " " + std::to_string(count);
      SCOPED_TRACE(what);
      Built b;
      b.graph.source = "contiguous run";
      BlockBuilder g{b, storage};
      const ValueId x = g.input("x", f({count})), y = g.input("y", f({count}));
      const ValueId sum = g.node("sub", "sum", {x, y}, attrs({{"alpha", F(0.5)}}));
      const ValueId act = g.node("silu", "act", {sum});
      const ValueId out = g.node("div", "out", {act, y});
      b.graph.outputs = {out};
      compiler::renumber_producers(b.graph);
      const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(b.inputs);
      cuda::CudaBackend backend({.poison_memory = true});
      const auto prepared = backend.prepare(program_for(b.graph, storage), b.weights);
      ASSERT_EQ(prepared->last_timings().size(), 1u);
      EXPECT_EQ(prepared->last_timings()[0].op, "sub+silu+div");
      for (int run = 0; run < 2; ++run)
        expect_matches(prepared->run(b.inputs)[0].second, expected[0].second, storage, what, 3);
      const size_t compiled = cuda::generated_kernels_compiled();
      const auto again = backend.prepare(program_for(b.graph, storage), b.weights);
      EXPECT_EQ(cuda::generated_kernels_compiled(), compiled);
      expect_matches(again->run(b.inputs)[0].second, expected[0].second, storage, what + " again", 3);
    }
  }
}

// The coverage table (docs/ops.md) reads the kernel list as data; it must name exactly the ops with a kernel.
TEST(CudaBackend, DeclaredKernelListMatchesTheKernelTable) {
  const std::vector<std::string> kernels = cuda::CudaBackend().capabilities().ops;
  const std::vector<std::string> declared(cuda::kKernelOpNames.begin(), cuda::kKernelOpNames.end());
  EXPECT_EQ(declared, kernels);
}

// A switch with a value it does not take fails at prepare, naming the variable, instead of running as if unset.
TEST(CudaBackend, BadEnvironmentSwitchesAreErrorsNamingTheVariable) {
  const Built b = build(make("relu", {f({3, 5})}), DType::Float32);
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, const char*>>{{"NPUSIM_CUDA_CONV", "fast"},
                                                        {"NPUSIM_CUDA_GRAPHS", "no"},
                                                        {"NPUSIM_CUDA_FUSE", "2"},
                                                        {"NPUSIM_CUDA_CACHE_PREFETCH", "yes"},
                                                        {"NPUSIM_CUDA_IM2COL_BYTES", "64M"},
                                                        {"NPUSIM_CUDA_IM2COL_BYTES", "0"}}) {
    const ScopedEnvironment bad(name, value);
    try {
      cuda::CudaBackend().prepare(program_for(b.graph, DType::Float32), b.weights);
      ADD_FAILURE() << name << "=" << value << " was taken";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(value), std::string::npos) << error.what();
    }
  }
  const ScopedEnvironment fine("NPUSIM_CUDA_IM2COL_BYTES", "1048576");
  EXPECT_NO_THROW(cuda::CudaBackend().prepare(program_for(b.graph, DType::Float32), b.weights));
}

TEST(CudaBackend, IndexOutOfRangeIsAnErrorNamingTheNode) {
  Built b = build(make("embedding", {w({5, 3}), ints({4}, 0, 5)}), DType::Float32);
  b.inputs["in1"].mutable_data<int64_t>()[2] = 7;
  cuda::CudaBackend backend;
  const auto prepared = backend.prepare(program_for(b.graph, DType::Float32), b.weights);
  try {
    prepared->run(b.inputs);
    FAIL() << "an index past the table must fail";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("node 'node'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("out of range"), std::string::npos) << error.what();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Whole models

Program compile_for(const Graph& graph, DType storage) {
  compiler::CompileOptions options;
  options.compute_dtype = storage;
  return compiler::compile_graph(graph, options);
}

class ResNetOnCuda : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(ResNetOnCuda, MatchesTheCpuBackend) {
  const auto [arch, storage] = GetParam();
  const Graph graph = read_torch_ir(kFixtures + "/ir/" + arch + "_ir.json");
  const auto weights = random_weights(graph);
  const std::map<std::string, Tensor> inputs{{"x", random_input(graph.value(graph.inputs[0]), 5)}};
  const Program fp32 = compile_for(graph, DType::Float32);
  const Tensor expected = cpu::CpuBackend().prepare(fp32, compiled_weights(fp32.graph, weights))->run(inputs)[0].second;
  const Program program = compile_for(graph, storage);
  const auto prepared = cuda::CudaBackend().prepare(program, compiled_weights(program.graph, weights));
  EXPECT_TRUE(prepared->fallback_nodes().empty());
  for (int run = 0; run < 3; ++run) {
    expect_resnet_logits_match(prepared->run(inputs)[0].second, expected, storage);
  }
  EXPECT_TRUE(cuda::replays_graph(*prepared)) << cuda::graph_capture_failure(*prepared);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ResNetOnCuda,
    ::testing::Values(std::make_tuple("resnet18", DType::Float32), std::make_tuple("resnet18", DType::BFloat16),
                      std::make_tuple("resnet18", DType::Float16), std::make_tuple("resnet50", DType::Float32),
                      std::make_tuple("resnet50", DType::BFloat16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param)) + "_" + std::string(dtype_name(std::get<1>(info.param)));
    });

// ResNets against PyTorch itself: tests/python/make_resnet_case.py writes torchvision weights (BatchNorm statistics
// that matter, the top classes pushed apart), an image and the logits, with the python of $NPUSIM_PYTHON (default
// python3), which needs torch and torchvision.
std::string run_command(const std::string& command, int* exit_code) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
}

class ResNetAgainstPyTorchOnCuda : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(ResNetAgainstPyTorchOnCuda, LogitsAndTop5Match) {
  const auto [arch, storage] = GetParam();
  const char* python_env = std::getenv("NPUSIM_PYTHON");
  const std::string python = python_env ? python_env : "python3";
  int exit_code = -1;
  run_command(python + " -c 'import torch, torchvision'", &exit_code);
  if (exit_code != 0) GTEST_SKIP() << python << " lacks torch or torchvision";
  const Graph graph = read_torch_ir(kFixtures + "/ir/" + arch + "_ir.json");
  const std::string dir = std::string(NPUSIM_WORK_DIR) + "/cuda_" + arch + "_" + std::string(dtype_name(storage));
  const std::string command = python + " " + NPUSIM_PYTHON_DIR + "/make_resnet_case.py --arch " + arch +
                              " --seed 7 --weight-dtype float32 --out " + dir + " --output-name " +
                              graph.value(graph.outputs[0]).name;
  const std::string output = run_command("mkdir -p " + dir + " && " + command, &exit_code);
  ASSERT_EQ(exit_code, 0) << command << "\n" << output;
  WeightStore store;
  store.add_file(dir + "/weights.safetensors");
  const Program program = compile_for(graph, storage);
  const auto prepared = cuda::CudaBackend().prepare(program, store.bind(program.graph).tensors);
  const SafetensorsFile inputs = SafetensorsFile::open(dir + "/inputs.safetensors");
  const SafetensorsFile reference = SafetensorsFile::open(dir + "/reference.safetensors");
  for (int run = 0; run < 2; ++run) {
    const NamedTensors outputs = prepared->run({{"x", inputs.get("x")}});
    const Comparison c = compare_tensors(outputs[0].second, reference.get(outputs[0].first), 5);
    EXPECT_GT(c.pearson, storage == DType::Float32 ? 0.99999 : 0.999) << c.summary();
    EXPECT_TRUE(c.all_topk_match()) << c.summary();
    EXPECT_TRUE(c.all_argmax_match()) << c.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ResNetAgainstPyTorchOnCuda,
    ::testing::Values(std::make_tuple("resnet18", DType::Float32), std::make_tuple("resnet18", DType::Float16),
                      std::make_tuple("resnet50", DType::Float32), std::make_tuple("resnet50", DType::Float16),
                      std::make_tuple("resnet50", DType::BFloat16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param)) + "_" + std::string(dtype_name(std::get<1>(info.param)));
    });

// A target that lists only some ops: the rest runs on the CPU fallback, with explicit transfers between the GPU
// and the host, and the result is the CPU backend's.
TEST(CudaBackend, PartitionsWithTheCpuFallbackMatchTheCpuBackend) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  const auto weights = random_weights(graph);
  const std::map<std::string, Tensor> inputs{{"x", random_input(graph.value(graph.inputs[0]), 5)}};
  const Program program = compile_for(graph, DType::Float32);
  const Tensor expected =
      cpu::CpuBackend().prepare(program, compiled_weights(program.graph, weights))->run(inputs)[0].second;
  const compiler::Target target = compiler::parse_target(
      R"({"name": "cuda-partial", "backend": "cuda", "ops": ["conv2d", "fused_conv2d", "linear"], "fallback": "cpu"})",
      "test target");
  const auto executor = prepare_partitioned(program, target, compiled_weights(program.graph, weights));
  EXPECT_GE(executor->plan().partitions.size(), 3u);
  EXPECT_FALSE(executor->plan().transfers.empty());
  for (int run = 0; run < 2; ++run) {
    const Comparison c = compare_tensors(executor->run(inputs)[0].second, expected, 5);
    EXPECT_LE(c.max_abs_diff, 1e-4 * std::max(1.0, c.max_abs_reference)) << c.summary();
    EXPECT_TRUE(c.all_topk_match()) << c.summary();
  }
}

const std::string kTiny = kFixtures + "/qwen_tiny";

WeightStore tiny_store() {
  WeightStore store;
  store.add_file(kTiny + "/model.safetensors");
  store.set_config(ModelConfig::load(kTiny + "/config.json"));
  return store;
}

Tensor int64_tensor(Shape shape, const std::vector<int64_t>& values) {
  Tensor t(DType::Int64, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.mutable_data<int64_t>()[i] = values[i];
  return t;
}

TEST(QwenTinyOnCuda, PrefillLogitsMatchTheReference) {
  const Graph graph = read_torch_ir(kTiny + "/prefill_ir.json");
  const SafetensorsFile reference = SafetensorsFile::open(kTiny + "/reference.safetensors");
  const Tensor ids = reference.get("input_ids");
  const int64_t length = ids.shape().back();
  std::vector<int64_t> positions(static_cast<size_t>(length)), ones(static_cast<size_t>(length), 1);
  for (int64_t i = 0; i < length; ++i) positions[static_cast<size_t>(i)] = i;
  const std::map<std::string, Tensor> inputs{{"input_ids", ids},
                                             {"attention_mask", int64_tensor({1, length}, ones)},
                                             {"position_ids", int64_tensor({1, length}, positions)},
                                             {"cache_position", int64_tensor({length}, positions)}};
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(storage)));
    const Program program = compile_for(graph, storage);
    WeightStore store = tiny_store();
    const auto prepared = cuda::CudaBackend().prepare(program, store.bind(program.graph).tensors);
    for (int run = 0; run < 2; ++run) {
      const Comparison c = compare_tensors(prepared->run(inputs)[0].second, reference.get("logits"));
      if (storage == DType::Float32)
        EXPECT_LT(c.max_abs_diff, 1e-4) << c.summary();
      else
        EXPECT_GT(c.pearson, 0.999) << c.summary();
      EXPECT_TRUE(c.all_argmax_match()) << c.summary();
    }
  }
}

TEST(QwenTinyOnCuda, DecodeLogitsAndCachesMatchTheReference) {
  const Graph graph = read_torch_ir(kTiny + "/decode_ir.json");
  const SafetensorsFile reference = SafetensorsFile::open(kTiny + "/decode_reference.safetensors");
  std::map<std::string, Tensor> inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = reference.get(graph.value(id).name);
  const Program program = compile_for(graph, DType::Float32);
  WeightStore store = tiny_store();
  const auto prepared = cuda::CudaBackend().prepare(program, store.bind(program.graph).tensors);
  EXPECT_TRUE(prepared->fallback_nodes().empty());
  for (int run = 0; run < 2; ++run) {
    const NamedTensors outputs = prepared->run(inputs);
    ASSERT_EQ(outputs.size(), graph.outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Comparison c = compare_tensors(outputs[i].second, reference.get("out_" + std::to_string(i)));
      EXPECT_LT(c.max_abs_diff, 1e-4) << "out_" << i << ": " << c.summary();
    }
  }
}

// Decode attention's cache rows are fetched into L2 on a second stream (one launch per attention node, forked
// inside the captured graph): the same logits and caches, bit for bit, as with $NPUSIM_CUDA_CACHE_PREFETCH=0.
TEST(QwenTinyOnCuda, CachePrefetchesRunBesideTheProjectionsAndChangeNoResult) {
  const Graph graph = read_torch_ir(kTiny + "/decode_ir.json");
  const SafetensorsFile reference = SafetensorsFile::open(kTiny + "/decode_reference.safetensors");
  std::map<std::string, Tensor> inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = reference.get(graph.value(id).name);
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(storage)));
    const Program program = compile_for(graph, storage);
    const size_t attention_nodes = static_cast<size_t>(std::count_if(
        program.graph.nodes.begin(), program.graph.nodes.end(), [](const Node& n) { return n.op == "attention"; }));
    ASSERT_GT(attention_nodes, 0u);
    WeightStore store = tiny_store();
    auto run_twice = [&](size_t& side) {
      const auto prepared = cuda::CudaBackend().prepare(program, store.bind(program.graph).tensors);
      prepared->run(inputs);
      NamedTensors outputs = prepared->run(inputs);
      EXPECT_TRUE(cuda::replays_graph(*prepared)) << cuda::graph_capture_failure(*prepared);
      side = cuda::side_launches(*prepared);
      return outputs;
    };
    size_t with_prefetch = 0, without_prefetch = 0;
    const NamedTensors prefetched = run_twice(with_prefetch);
    NamedTensors plain;
    {
      const ScopedEnvironment off("NPUSIM_CUDA_CACHE_PREFETCH", "0");
      plain = run_twice(without_prefetch);
    }
    EXPECT_EQ(with_prefetch, attention_nodes);
    EXPECT_EQ(without_prefetch, 0u);
    ASSERT_EQ(prefetched.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      const Tensor& a = prefetched[i].second;
      const Tensor& b = plain[i].second;
      ASSERT_EQ(a.nbytes(), b.nbytes()) << prefetched[i].first;
      EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), a.nbytes()), 0)
          << prefetched[i].first << " differs with the prefetches";
      const Comparison c = compare_tensors(prefetched[i].second, reference.get("out_" + std::to_string(i)));
      EXPECT_GT(c.pearson, 0.999) << prefetched[i].first << ": " << c.summary();
    }
  }
}

// The prompt fed one token at a time through the decode program, then greedy tokens: the KV cache stays on the
// device as state, and every step after the first replays the captured graph at a new position.
TEST(QwenTinyOnCuda, GreedyDecodingMatchesTheReferenceTokens) {
  std::ifstream file(kTiny + "/greedy.json");
  const nlohmann::json greedy = nlohmann::json::parse(file);
  const std::vector<int64_t> prompt = greedy["prompt"].get<std::vector<int64_t>>();
  const std::vector<int64_t> expected = greedy["greedy"].get<std::vector<int64_t>>();
  const Graph graph = read_torch_ir(kTiny + "/decode_ir.json");
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(storage)));
    const Program program = compile_for(graph, storage);
    std::vector<std::pair<std::string, std::string>> pairs;
    for (size_t i = 4; i < program.graph.inputs.size(); ++i)
      pairs.emplace_back(program.graph.value(program.graph.inputs[i]).name,
                         program.graph.value(program.graph.outputs[i - 3]).name);
    WeightStore store = tiny_store();
    const auto prepared = cuda::CudaBackend().prepare_with_state(program, store.bind(program.graph).tensors, pairs);
    const int64_t cache = program.graph.value(program.graph.inputs[1]).meta.shape.back();
    std::vector<int64_t> tokens = prompt;
    for (int64_t position = 0; position + 1 < static_cast<int64_t>(expected.size()); ++position) {
      Tensor mask(DType::Float32, {1, 1, 1, cache});
      for (int64_t j = 0; j < cache; ++j)
        mask.mutable_data<float>()[j] = j <= position ? 0.0f : -std::numeric_limits<float>::infinity();
      const NamedTensors outputs =
          prepared->run({{"input_ids", int64_tensor({1, 1}, {tokens[static_cast<size_t>(position)]})},
                         {"attention_mask", mask},
                         {"position_ids", int64_tensor({1, 1}, {position})},
                         {"cache_position", int64_tensor({1}, {position})}});
      ASSERT_EQ(outputs.size(), 1u);
      if (position + 1 < static_cast<int64_t>(prompt.size())) continue;
      const Tensor& logits = outputs[0].second;
      int64_t best = 0;
      for (int64_t v = 1; v < logits.numel(); ++v)
        if (logits.data<float>()[v] > logits.data<float>()[best]) best = v;
      tokens.push_back(best);
    }
    EXPECT_EQ(tokens, expected);
    EXPECT_TRUE(cuda::replays_graph(*prepared)) << cuda::graph_capture_failure(*prepared);
  }
}

}  // namespace
}  // namespace npusim::test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!testing::GTEST_FLAG(list_tests)) {
    try {
      std::printf("test_cuda_backend on %s\n", npusim::cuda::gpu_name().c_str());
    } catch (const npusim::Error& error) {
      std::fprintf(stderr, "test_cuda_backend: these tests need a CUDA GPU: %s\n", error.what());
      return 1;
    }
  }
  return RUN_ALL_TESTS();
}
