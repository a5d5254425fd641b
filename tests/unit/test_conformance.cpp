// Backend conformance on the CPU, after ggml's test-backend-ops: every case is a one-node graph run on the CPU
// backend with fp32, fp16 and bf16 storage (activation memory poisoned with NaN first) and compared element by
// element with the registry's reference implementation (the harness: conformance_harness.h). Inputs are rounded to
// the storage precision first, so the only differences left are the kernel's own rounding. Whole models close the
// suite: ResNet-18 and qwen_tiny prefill, compiled, against the reference executor on the uncompiled graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "compiler/pass.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "runtime/compare.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "unit/conformance_harness.h"

namespace npusim::test {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Cases

std::vector<Case> elementwise_cases() {
  std::vector<Case> cases;
  for (const char* op :
       {"exp",       "log",         "log2",       "log10", "log1p",    "expm1",   "sqrt",       "rsqrt", "reciprocal",
        "sin",       "cos",         "tan",        "atan",  "tanh",     "sigmoid", "erf",        "neg",   "abs",
        "sign",      "floor",       "ceil",       "trunc", "round",    "relu",    "hardtanh",   "gelu",  "silu",
        "hardswish", "hardsigmoid", "leaky_relu", "elu",   "softplus", "mish",    "logical_not"}) {
    cases.push_back(make(op, {f({2, 33})}));
    cases.push_back(make(op, {f({0, 5})}, {}, "empty"));
  }
  cases.push_back(make("log", {positive({65})}, {}, "positive"));
  cases.push_back(make("sqrt", {positive({1})}, {}, "positive"));
  cases.push_back(make("gelu", {f({7, 9})}, attrs({{"approximate", S("tanh")}}), "tanh"));
  cases.push_back(make("hardtanh", {f({33})}, attrs({{"min_val", F(-0.5)}, {"max_val", F(0.25)}})));
  cases.push_back(make("leaky_relu", {f({33})}, attrs({{"negative_slope", F(0.2)}})));
  cases.push_back(make("elu", {f({33})}, attrs({{"alpha", F(0.5)}, {"scale", F(1.5)}, {"input_scale", F(2.0)}})));
  cases.push_back(make("softplus", {f({33})}, attrs({{"beta", F(2.0)}, {"threshold", F(1.0)}})));
  cases.push_back(fallback(make("round", {f({33})}, attrs({{"decimals", I(1)}}), "decimals")));
  for (const char* op : {"neg", "abs", "relu", "sign", "floor", "logical_not"})
    cases.push_back(make(op, {ints({7}, -5, 5)}, {}, "int64"));
  cases.push_back(make("exp", {ints({7}, -3, 3)}, {}, "int64 to float"));
  cases.push_back(make("bitwise_not", {ints({7}, -5, 5)}, {}, "int64"));
  cases.push_back(make("bitwise_not", {bools({9})}, {}, "bool"));
  cases.push_back(make("relu", {f({65, 1025})}, {}, "parallel"));

  for (const char* op : {"add", "sub", "mul", "div", "remainder", "fmod", "maximum", "minimum", "eq", "ne", "lt", "le",
                         "gt", "ge", "logical_and", "logical_or", "logical_xor"}) {
    cases.push_back(make(op, {f({2, 1, 33}), f({7, 1})}, {}, "broadcast"));
    cases.push_back(make(op, {f({65}), f({65})}));
    cases.push_back(make(op, {f({0, 3}), f({3})}, {}, "empty"));
  }
  cases.push_back(make("add", {f({7, 33}), f({33})}, attrs({{"alpha", F(2.5)}}), "alpha"));
  cases.push_back(make("add", {f({7, 33})}, attrs({{"other", F(1.5)}}), "scalar"));
  cases.push_back(make("sub", {f({7, 33}), f({7, 1})}, attrs({{"alpha", I(3)}}), "alpha"));
  cases.push_back(make("rsub", {f({7, 33})}, attrs({{"other", F(1.0)}}), "scalar"));
  cases.push_back(make("rsub", {f({7, 33}), f({33})}, attrs({{"alpha", F(0.5)}}), "tensors"));
  cases.push_back(make("mul", {f({7, 33})}, attrs({{"other", I(3)}}), "int scalar"));
  cases.push_back(make("mul", {f({1}), f({5, 7, 1})}, {}, "broadcast both"));
  cases.push_back(make("div", {f({7, 33}), f({33})}, attrs({{"rounding_mode", S("trunc")}}), "trunc"));
  cases.push_back(make("div", {f({7, 33}), f({33})}, attrs({{"rounding_mode", S("floor")}}), "floor"));
  cases.push_back(make("div", {ints({9}, -9, 9), ints({9}, 1, 4)}, {}, "int64 true division"));
  cases.push_back(fallback(
      make("div", {ints({9}, -9, 9), ints({9}, 1, 4)}, attrs({{"rounding_mode", S("floor")}}), "int64 floor")));
  cases.push_back(make("pow", {f({33})}, attrs({{"exponent", F(2.0)}}), "square"));
  cases.push_back(make("pow", {positive({33})}, attrs({{"exponent", F(0.5)}}), "root"));
  cases.push_back(make("pow", {f({33})}, attrs({{"exponent", I(3)}}), "cube"));
  cases.push_back(make("pow", {positive({7, 5}), f({5})}, {}, "tensors"));
  cases.push_back(make("pow", {f({9})}, attrs({{"base", F(2.0)}}), "scalar base"));
  for (const char* op : {"add", "sub", "mul", "maximum", "minimum", "eq", "lt", "ge", "bitwise_and", "bitwise_or",
                         "bitwise_xor", "logical_and"})
    cases.push_back(make(op, {ints({3, 5}, -4, 4), ints({5}, -4, 4)}, {}, "int64"));
  cases.push_back(make("add", {ints({3, 5}, -4, 4), ints({5}, -4, 4)}, attrs({{"alpha", I(-2)}}), "int64 alpha"));
  cases.push_back(make("add", {ints({3, 5}, -4, 4), f({5})}, {}, "int64 + float"));
  cases.push_back(make("mul", {ints({3, 5}, -4, 4)}, attrs({{"other", F(0.5)}}), "int64 * float scalar"));
  cases.push_back(make("bitwise_and", {bools({3, 5}), bools({5})}, {}, "bool"));
  cases.push_back(make("logical_or", {bools({9}), f({9})}, {}, "bool and float"));
  cases.push_back(make("lt", {f({9})}, attrs({{"other", F(0.0)}}), "scalar"));
  cases.push_back(make("add", {f({65, 1025}), f({1025})}, {}, "parallel"));
  cases.push_back(make("mul", {f({2, 3, 4, 5, 6, 7, 2, 3}), f({3, 1, 5, 1, 7, 1, 3})}, {}, "rank 8"));
  cases.push_back(fallback(make("pow", {ints({7}, 0, 4)}, attrs({{"exponent", I(2)}}), "int64")));

  cases.push_back(make("where", {bools({7, 1}), f({33}), f({7, 33})}));
  cases.push_back(make("where", {bools({7, 33}), f({7, 33})}, attrs({{"other", F(-1.0)}}), "scalar other"));
  cases.push_back(make("where", {bools({9}), ints({9}, -3, 3), ints({9}, 5, 9)}, {}, "int64"));
  cases.push_back(make("masked_fill", {f({7, 33}), bools({33})}, attrs({{"value", F(-3.5)}})));
  cases.push_back(make("masked_fill", {ints({7, 3}, 0, 9), bools({7, 1})}, attrs({{"value", I(-1)}}), "int64"));
  cases.push_back(make("masked_fill", {f({7, 3}), bools({7, 3}), f({})}, {}, "tensor value"));
  cases.push_back(make("clamp", {f({65})}, attrs({{"min", F(-0.5)}, {"max", F(0.5)}})));
  cases.push_back(make("clamp", {f({65})}, attrs({{"min", F(0.1)}}), "min only"));
  cases.push_back(make("clamp", {ints({9}, -9, 9)}, attrs({{"max", I(2)}}), "int64"));
  cases.push_back(fallback(make("clamp", {f({9}), f({9})}, {}, "tensor bound")));
  cases.push_back(make("to", {f({7, 5})}, attrs({{"dtype", S("torch.int64")}}), "float to int64"));
  cases.push_back(make("to", {f({7, 5})}, attrs({{"dtype", S("torch.bool")}}), "float to bool"));
  cases.push_back(make("to", {ints({7, 5}, -9, 9)}, attrs({{"dtype", S("torch.float32")}}), "int64 to float"));
  cases.push_back(make("to", {f({7, 5})}, attrs({{"dtype", S("torch.bfloat16")}}), "float to bfloat16"));
  cases.push_back(make("to", {bools({7})}, attrs({{"dtype", S("torch.int64")}}), "bool to int64"));

  cases.push_back(make("add_relu", {f({7, 33}), f({33})}));
  cases.push_back(make("silu_mul", {f({7, 33}), f({7, 33})}));
  cases.push_back(make("elementwise_chain", {f({7, 33})},
                       attrs({{"ops", S("mul,add,tanh,pow,sub,div,sigmoid,leaky_relu,gelu")},
                              {"scalars", FL({0.5, 1.0, 0.0, 2.0, 0.25, 3.0, 0.0, 0.1, 0.0})}})));
  cases.push_back(make("rope", {f({1, 2, 7, 8}), f({1, 1, 7, 8}), f({1, 1, 7, 8})}));
  cases.push_back(make("rope", {f({2, 3, 5, 6}), f({5, 6}), f({5, 6})}, {}, "broadcast"));
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
  cases.push_back(make("transpose", {f({65, 1025})}, attrs({{"dim0", I(0)}, {"dim1", I(1)}}), "parallel"));
  // Batches of transposes (NCHW <-> NHWC) whose sides are not multiples of 8 blocks.
  cases.push_back(make("permute", {f({3, 13, 5, 7})}, attrs({{"dims", L({0, 2, 3, 1})}}), "to channels last"));
  cases.push_back(make("permute", {f({2, 9, 11, 17})}, attrs({{"dims", L({0, 3, 1, 2})}}), "to channels first"));
  cases.push_back(make("permute", {f({4, 96, 56, 8})}, attrs({{"dims", L({0, 2, 3, 1})}}), "channels last, parallel"));
  cases.push_back(make("t", {f({7, 33})}));
  cases.push_back(make("expand", {f({3, 1})}, attrs({{"size", L({2, 3, 7})}})));
  cases.push_back(make("expand", {bools({1, 5})}, attrs({{"size", L({4, -1})}}), "bool"));
  cases.push_back(make("repeat", {f({2, 3})}, attrs({{"repeats", L({2, 1, 3})}})));
  cases.push_back(
      make("slice", {f({7, 33})}, attrs({{"dim", I(1)}, {"start", I(-20)}, {"end", I(31)}, {"step", I(3)}})));
  cases.push_back(make("slice", {f({7, 33})},
                       attrs({{"dim", I(0)}, {"start", I(2)}, {"end", I(std::numeric_limits<int64_t>::max())}}),
                       "open end"));
  cases.push_back(make("slice", {f({7, 33})}, attrs({{"dim", I(1)}, {"start", I(5)}, {"end", I(5)}}), "empty"));
  cases.push_back(make("select", {f({7, 33})}, attrs({{"dim", I(0)}, {"index", I(-2)}})));
  cases.push_back(make("narrow", {f({7, 33})}, attrs({{"dim", I(1)}, {"start", I(3)}, {"length", I(9)}})));
  cases.push_back(make("flip", {f({3, 5, 7})}, attrs({{"dims", L({0, -1})}})));
  cases.push_back(make("split", {f({7, 33})}, attrs({{"split_size", I(10)}, {"dim", I(1)}})));
  cases.push_back(make("split", {f({7, 33})}, attrs({{"split_sizes", L({2, 0, 5})}, {"dim", I(0)}}), "sizes"));
  cases.push_back(make("chunk", {f({7, 33})}, attrs({{"chunks", I(3)}, {"dim", I(0)}})));
  cases.push_back(make("unbind", {f({3, 5})}, attrs({{"dim", I(1)}})));
  cases.push_back(make("cat", {f({2, 3, 5}), f({2, 1, 5}), f({2, 7, 5})}, attrs({{"dim", I(1)}})));
  cases.push_back(make("cat", {f({3, 5}), f({0}), f({3, 2})}, attrs({{"dim", I(-1)}}), "skipped empty"));
  cases.push_back(make("cat", {ints({3}, 0, 9), f({2})}, {}, "promoted"));
  cases.push_back(make("stack", {f({3, 5}), f({3, 5})}, attrs({{"dim", I(1)}})));
  cases.push_back(make("index_select", {f({7, 5}), ints({4}, -7, 7)}, attrs({{"dim", I(0)}})));
  cases.push_back(make("index_select", {f({3, 7, 5}), ints({9}, 0, 7)}, attrs({{"dim", I(1)}}), "middle"));
  cases.push_back(make("index_copy", {f({2, 9, 5}), ints({3}, 0, 9), f({2, 3, 5})}, attrs({{"dim", I(1)}})));
  return cases;
}

std::vector<Case> linalg_cases() {
  std::vector<Case> cases;
  cases.push_back(make("linear", {f({1, 7, 65}), w({33, 65}), w({33})}));
  cases.push_back(make("linear", {f({7, 65}), w({33, 65})}, {}, "no bias"));
  cases.push_back(make("linear", {f({1, 65}), w({1000, 65}), w({1000})}, {}, "one row"));
  cases.push_back(make("linear", {f({7, 1}), f({5, 1})}, {}, "activation weight"));
  cases.push_back(make("linear", {f({0, 5}), w({3, 5})}, {}, "empty"));
  cases.push_back(make("matmul", {f({2, 7, 33}), w({33, 5})}));
  cases.push_back(make("matmul", {f({2, 1, 7, 9}), f({3, 9, 4})}, {}, "broadcast"));
  cases.push_back(make("matmul", {f({9}), f({9, 4})}, {}, "vector"));
  cases.push_back(make("matmul", {f({3, 4, 9}), f({9})}, {}, "matrix vector"));
  cases.push_back(make("matmul", {f({8, 65, 65}), f({8, 65, 65})}, {}, "batched"));
  cases.push_back(make("mm", {f({7, 33}), f({33, 65})}));
  cases.push_back(make("bmm", {f({3, 7, 9}), f({3, 9, 1})}));
  cases.push_back(make("addmm", {f({5}), f({7, 9}), f({9, 5})}, attrs({{"alpha", F(0.5)}, {"beta", F(2.0)}})));
  cases.push_back(make("addmm", {f({7, 5}), f({7, 9}), f({9, 5})}, attrs({{"beta", I(0)}}), "beta 0"));
  cases.push_back(make("baddbmm", {f({3, 1, 5}), f({3, 7, 9}), f({3, 9, 5})}));
  cases.push_back(fallback(make("matmul", {ints({3, 4}, -3, 3), ints({4, 2}, -3, 3)}, {}, "int64")));
  return cases;
}

std::vector<Case> conv_cases() {
  std::vector<Case> cases;
  cases.push_back(
      make("conv2d", {f({1, 3, 9, 9}), w({4, 3, 3, 3}), w({4})}, attrs({{"stride", L({2})}, {"padding", L({1})}})));
  cases.push_back(make("conv2d", {f({2, 4, 7, 8}), w({6, 2, 3, 2})},
                       attrs({{"groups", I(2)}, {"dilation", L({2, 1})}, {"padding", L({2, 0})}}), "grouped"));
  cases.push_back(make("conv2d", {f({1, 5, 6, 7}), w({3, 5, 1, 1}), w({3})}, {}, "pointwise"));
  cases.push_back(
      make("conv2d", {f({3, 7, 7}), w({2, 3, 3, 3})}, attrs({{"padding_mode", S("same")}}), "unbatched same"));
  cases.push_back(make("conv2d", {f({1, 4, 5, 5}), w({4, 1, 3, 3}), w({4})},
                       attrs({{"groups", I(4)}, {"padding", L({1})}}), "depthwise"));
  cases.push_back(make("conv1d", {f({2, 3, 33}), w({4, 3, 5}), w({4})}, attrs({{"stride", L({3})}})));
  cases.push_back(make("convolution", {f({1, 2, 6, 6}), w({3, 2, 2, 2})}, attrs({{"stride", L({1, 2})}})));
  cases.push_back(
      make("conv2d", {f({1, 16, 33, 33}), w({32, 16, 3, 3}), w({32})}, attrs({{"padding", L({1})}}), "parallel"));
  cases.push_back(
      make("fused_conv2d", {f({1, 3, 9, 9}), w({4, 3, 3, 3}), w({4}), f({1, 4, 9, 9})},
           attrs({{"padding", L({1})}, {"has_bias", B(true)}, {"has_residual", B(true)}, {"activation", S("relu")}})));
  cases.push_back(
      make("fused_conv2d", {f({2, 3, 8, 8}), w({4, 3, 3, 3})},
           attrs({{"stride", L({2})}, {"activation", S("hardtanh")}, {"min_val", F(0.0)}, {"max_val", F(0.5)}}),
           "hardtanh"));
  cases.push_back(make("fused_conv2d", {f({1, 3, 5, 5}), w({2, 3, 1, 1}), f({1, 2, 5, 5})},
                       attrs({{"has_residual", B(true)}, {"activation", S("silu")}}), "pointwise residual"));
  return cases;
}

std::vector<Case> nn_cases() {
  std::vector<Case> cases;
  cases.push_back(make("softmax", {f({7, 33})}, attrs({{"dim", I(-1)}})));
  cases.push_back(make("softmax", {f({3, 7, 5})}, attrs({{"dim", I(1)}}), "middle dim"));
  cases.push_back(make("softmax", {f({130, 513})}, attrs({{"dim", I(1)}}), "parallel"));
  cases.push_back(make("log_softmax", {f({7, 33})}, attrs({{"dim", I(0)}})));
  cases.push_back(make("masked_softmax", {f({2, 3, 7, 9}), f({1, 1, 7, 9})}));
  cases.push_back(make("masked_softmax", {f({2, 7, 9}), bools({9})}, {}, "bool mask"));
  cases.push_back(make("rms_norm", {f({2, 7, 33}), w({33})}, attrs({{"normalized_shape", L({33})}, {"eps", F(1e-6)}})));
  cases.push_back(make("rms_norm", {f({7, 3, 5})}, attrs({{"normalized_shape", L({3, 5})}}), "no weight"));
  cases.push_back(make("layer_norm", {f({2, 7, 33}), w({33}), w({33})}, attrs({{"normalized_shape", L({33})}})));
  cases.push_back(make("layer_norm", {f({7, 5})}, attrs({{"normalized_shape", L({5})}, {"eps", F(1e-3)}}), "plain"));
  cases.push_back(make("native_layer_norm", {f({3, 9}), w({9}), w({9})}, attrs({{"normalized_shape", L({9})}})));
  cases.push_back(make("batch_norm", {f({2, 3, 5, 5}), w({3}), w({3}), w({3}), positive({3})}));
  cases.push_back(make("batch_norm", {f({2, 3, 7}), w({3}), positive({3})}, {}, "statistics only"));
  cases.push_back(make("native_batch_norm", {f({1, 3, 4, 4}), w({3}), w({3}), w({3}), positive({3})}));
  cases.push_back(make("fused_batch_norm", {f({2, 3, 5, 5}), w({3}), w({3}), w({3}), positive({3})},
                       attrs({{"activation", S("relu")}})));
  cases.push_back(make("fused_batch_norm", {f({1, 5, 301}), w({5}), positive({5})},
                       attrs({{"activation", S("hardtanh")}, {"min_val", F(0.0)}, {"max_val", F(0.5)}}),
                       "statistics only, hardtanh"));
  cases.push_back(make("fused_batch_norm", {f({1, 4, 3, 3}), w({4}), w({4}), w({4}), positive({4})},
                       attrs({{"activation", S("silu")}}), "silu"));
  cases.push_back(make("embedding", {w({33, 9}), ints({2, 7}, 0, 33)}));
  cases.push_back(
      make("max_pool2d", {f({1, 3, 9, 9})}, attrs({{"kernel_size", L({3})}, {"stride", L({2})}, {"padding", L({1})}})));
  cases.push_back(make("max_pool2d", {f({2, 7, 8})},
                       attrs({{"kernel_size", L({2, 3})}, {"ceil_mode", B(true)}, {"dilation", L({2})}}),
                       "ceil dilation"));
  cases.push_back(
      make("max_pool2d_with_indices", {f({1, 2, 7, 7})}, attrs({{"kernel_size", L({3})}, {"stride", L({2})}})));
  cases.push_back(
      make("avg_pool2d", {f({1, 3, 9, 9})},
           attrs({{"kernel_size", L({3})}, {"stride", L({2})}, {"padding", L({1})}, {"count_include_pad", B(false)}})));
  cases.push_back(
      make("avg_pool2d", {f({1, 3, 9, 9})}, attrs({{"kernel_size", L({2})}, {"divisor_override", I(3)}}), "divisor"));
  cases.push_back(make("adaptive_avg_pool2d", {f({1, 3, 7, 9})}, attrs({{"output_size", L({3, 4})}})));
  cases.push_back(make("adaptive_avg_pool2d", {f({1, 512, 7, 7})}, attrs({{"output_size", L({1})}}), "global"));
  cases.push_back(make("adaptive_avg_pool1d", {f({2, 3, 10})}, attrs({{"output_size", L({4})}})));
  cases.push_back(make("scaled_dot_product_attention", {f({1, 2, 7, 8}), f({1, 2, 9, 8}), f({1, 2, 9, 5})}));
  cases.push_back(make("scaled_dot_product_attention", {f({2, 7, 8}), f({2, 7, 8}), f({2, 7, 8})},
                       attrs({{"is_causal", B(true)}, {"scale", F(0.3)}}), "causal"));
  cases.push_back(make("scaled_dot_product_attention",
                       {f({1, 4, 5, 8}), f({1, 2, 6, 8}), f({1, 2, 6, 8}), bools({5, 6})},
                       attrs({{"enable_gqa", B(true)}}), "gqa bool mask"));
  cases.push_back(make("scaled_dot_product_attention",
                       {f({1, 2, 5, 8}), f({1, 2, 6, 8}), f({1, 2, 6, 8}), f({1, 1, 5, 6})}, {}, "float mask"));
  cases.push_back(make("attention", {f({1, 4, 7, 8}), f({1, 2, 9, 8}), f({1, 2, 9, 8}), f({1, 1, 7, 9})},
                       attrs({{"has_mask", B(true)}})));
  cases.push_back(make("attention", {f({1, 4, 1, 8}), f({1, 2, 9, 8}), f({1, 2, 9, 8}), ints({1}, 4, 5)},
                       attrs({{"has_cache_position", B(true)}, {"scale", F(0.25)}}), "cache position"));
  cases.push_back(make("attention", {f({2, 3, 5, 4}), f({2, 3, 5, 4}), f({2, 3, 5, 6})},
                       attrs({{"is_causal", B(true)}, {"zero_masked_rows", B(true)}}), "causal"));
  cases.push_back(make("rotary_embedding", {w({4}), ints({2, 7}, 0, 4096)}, attrs({{"attention_scaling", F(0.75)}})));
  for (const char* op : {"sum", "mean", "amax", "amin"}) {
    cases.push_back(make(op, {f({3, 7, 33})}, attrs({{"dim", L({-1})}, {"keepdim", B(true)}})));
    cases.push_back(make(op, {f({3, 7, 5})}, attrs({{"dim", L({1})}}), "middle"));
    cases.push_back(make(op, {f({3, 7, 5})}, {}, "all"));
  }
  cases.push_back(make("mean", {f({3, 1, 7, 5})}, attrs({{"dim", L({1, 2})}}), "with size-1 dim"));
  cases.push_back(fallback(make("sum", {f({3, 7, 5})}, attrs({{"dim", L({0, 2})}}), "split dims")));
  cases.push_back(fallback(make("sum", {ints({3, 7}, -5, 5)}, attrs({{"dim", L({1})}}), "int64")));
  cases.push_back(fallback(make("cumsum", {f({3, 7})}, attrs({{"dim", I(1)}}))));
  cases.push_back(fallback(make("argmax", {f({3, 7})}, attrs({{"dim", I(1)}}))));
  cases.push_back(fallback(make("var", {f({3, 7})}, attrs({{"dim", L({1})}}))));
  cases.push_back(fallback(make("group_norm", {f({2, 4, 3}), w({4}), w({4})}, attrs({{"num_groups", I(2)}}))));
  return cases;
}

// ---------------------------------------------------------------------------------------------------------------
// Running the cases on the CPU backend

void run_on_cpu(const std::vector<Case>& cases) {
  cpu::CpuBackend backend({.threads = 0, .poison_memory = true});
  for (const Case& c : cases) run_case(c, backend);
}

TEST(Conformance, ElementwiseOps) { run_on_cpu(elementwise_cases()); }

TEST(Conformance, ShapeOps) { run_on_cpu(shape_cases()); }

TEST(Conformance, LinalgOps) { run_on_cpu(linalg_cases()); }

TEST(Conformance, ConvOps) { run_on_cpu(conv_cases()); }

TEST(Conformance, NnAndReductionOps) { run_on_cpu(nn_cases()); }

// Every op with a CPU kernel appears in at least one case above.
TEST(Conformance, EveryKernelHasACase) {
  const std::set<std::string> covered =
      ops_with_a_kernel_case({elementwise_cases(), shape_cases(), linalg_cases(), conv_cases(), nn_cases()});
  for (const std::string& op : cpu::CpuBackend().capabilities().ops)
    EXPECT_TRUE(covered.count(op) || op == "getitem" || op == "assert_metadata") << op << " has no conformance case";
}

// ---------------------------------------------------------------------------------------------------------------
// Whole models: compiled and planned, on the CPU backend, against the reference executor on the graph as read.

Program compile(Graph graph, DType storage) {
  compiler::PassContext context;
  compiler::run_passes(graph, {}, context);
  return program_for(std::move(graph), storage);
}

void expect_pearson(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const Comparison c = compare_tensors(actual, expected);
  EXPECT_GT(c.pearson, 0.999) << what << ": " << c.summary();
  EXPECT_TRUE(c.all_argmax_match()) << what << ": " << c.summary();
}

TEST(Conformance, ResNet18MatchesTheReference) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  const auto weights = random_weights(graph);
  const std::map<std::string, Tensor> inputs{{"x", random_input(graph.value(graph.inputs[0]), 5)}};
  const Tensor expected = ReferenceExecutor(graph, weights).run(inputs)[0].second;
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    const Program program = compile(graph, storage);
    cpu::CpuBackend backend;
    const auto prepared = backend.prepare(program, compiled_weights(program.graph, weights));
    EXPECT_TRUE(prepared->fallback_nodes().empty());
    EXPECT_LE(prepared->planned_bytes(), prepared->allocated_bytes());
    const Tensor actual = prepared->run(inputs)[0].second;
    if (storage == DType::Float32) {
      const Comparison c = compare_tensors(actual, expected);
      EXPECT_LE(c.max_abs_diff, 1e-4 * std::max(1.0, c.max_abs_reference)) << c.summary();
    } else {
      expect_pearson(actual, expected, "resnet18 bf16");
    }
  }
}

std::map<std::string, Tensor> tiny_prefill_inputs(const SafetensorsFile& reference) {
  const Tensor ids = reference.get("input_ids");
  const int64_t length = ids.shape().back();
  Tensor mask(DType::Int64, {1, length}), positions(DType::Int64, {1, length}), cache(DType::Int64, {length});
  for (int64_t i = 0; i < length; ++i) {
    mask.mutable_data<int64_t>()[i] = 1;
    positions.mutable_data<int64_t>()[i] = i;
    cache.mutable_data<int64_t>()[i] = i;
  }
  return {{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", positions}, {"cache_position", cache}};
}

TEST(Conformance, QwenTinyPrefillMatchesTheReference) {
  const Graph graph = read_torch_ir(kFixtures + "/qwen_tiny/prefill_ir.json");
  WeightStore store;
  store.add_file(kFixtures + "/qwen_tiny/model.safetensors");
  store.set_config(ModelConfig::load(kFixtures + "/qwen_tiny/config.json"));
  const SafetensorsFile reference = SafetensorsFile::open(kFixtures + "/qwen_tiny/reference.safetensors");
  const auto inputs = tiny_prefill_inputs(reference);
  const Tensor expected = ReferenceExecutor(graph, store.bind(graph).tensors).run(inputs)[0].second;
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    const Program program = compile(graph, storage);
    cpu::CpuBackend backend;
    const auto prepared = backend.prepare(program, store.bind(program.graph).tensors);
    const Tensor actual = prepared->run(inputs)[0].second;
    if (storage == DType::Float32) {
      const Comparison c = compare_tensors(actual, expected);
      EXPECT_LE(c.max_abs_diff, 1e-4 * std::max(1.0, c.max_abs_reference)) << c.summary();
      EXPECT_TRUE(c.all_argmax_match()) << c.summary();
    } else {
      expect_pearson(actual, expected, "qwen_tiny bf16");
    }
  }
}

}  // namespace
}  // namespace npusim::test
