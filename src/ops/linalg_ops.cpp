// Matrix products: linear, matmul (full torch.matmul semantics), mm, bmm, addmm, baddbmm, and t.
#include <cstring>

#include "ops/gemm.h"
#include "ops/op_util.h"

namespace npusim {

namespace {

using namespace ops;

void expect_matmul_dtype(DType dtype, const char* op) {
  if (dtype == DType::Bool) fail(std::string(op) + " is not defined for bool tensors");
}

DType promote_all(std::span<const TensorMeta> inputs) {
  DType dtype = inputs[0].dtype;
  for (const TensorMeta& meta : inputs.subspan(1)) dtype = promote_types(dtype, meta.dtype);
  return dtype;
}

// A batched product [...a_batch, n, k] x [...b_batch, k, m] -> [...out_batch, n, m]; `out_shape` drops the
// dims that torch.matmul adds for 1-D operands.
struct MatmulPlan {
  Shape a_shape;  // operands with 1-D ones promoted to matrices
  Shape b_shape;
  Shape out_batch;
  int64_t n = 0, k = 0, m = 0;
  Shape out_shape;
};

MatmulPlan plan_matmul(const Shape& a, const Shape& b, const char* op) {
  if (a.empty() || b.empty())
    fail(std::string(op) + ": both operands need at least one dimension, got " + shape_string(a) + " and " +
         shape_string(b));
  MatmulPlan plan;
  plan.a_shape = a.size() == 1 ? Shape{1, a[0]} : a;
  plan.b_shape = b.size() == 1 ? Shape{b[0], 1} : b;
  plan.n = plan.a_shape[plan.a_shape.size() - 2];
  plan.k = plan.a_shape.back();
  plan.m = plan.b_shape.back();
  const int64_t b_rows = plan.b_shape[plan.b_shape.size() - 2];
  if (plan.k != b_rows)
    fail(std::string(op) + ": " + shape_string(a) + " and " + shape_string(b) + " cannot be multiplied (" +
         std::to_string(plan.k) + " columns against " + std::to_string(b_rows) + " rows)");
  const Shape a_batch(plan.a_shape.begin(), plan.a_shape.end() - 2);
  const Shape b_batch(plan.b_shape.begin(), plan.b_shape.end() - 2);
  plan.out_batch = broadcast_shapes(a_batch, b_batch);
  plan.out_shape = plan.out_batch;
  if (a.size() > 1) plan.out_shape.push_back(plan.n);
  if (b.size() > 1) plan.out_shape.push_back(plan.m);
  return plan;
}

// out[batch] = alpha * a[batch] · b[batch] + beta * out[batch] in fp32.
void matmul_f32(const MatmulPlan& plan, const float* a, const float* b, float* out, float alpha, float beta) {
  const int64_t out_matrices = shape_numel(plan.out_batch);
  const int64_t a_matrices = shape_numel(Shape(plan.a_shape.begin(), plan.a_shape.end() - 2));
  const int64_t b_matrices = shape_numel(Shape(plan.b_shape.begin(), plan.b_shape.end() - 2));
  GemmArgs args{
      .m = plan.n, .n = plan.m, .k = plan.k, .lda = plan.k, .ldb = plan.m, .ldc = plan.m, .alpha = alpha, .beta = beta};
  if (b_matrices == 1 && a_matrices == out_matrices) {
    // One shared right operand: the batch folds into the rows of a single product.
    args.m = plan.n * out_matrices;
    args.a = a;
    args.b = b;
    args.c = out;
    gemm_f32(args);
    return;
  }
  const std::vector<int64_t> a_offsets = batch_offsets(plan.a_shape, plan.out_batch);
  const std::vector<int64_t> b_offsets = batch_offsets(plan.b_shape, plan.out_batch);
  for (int64_t i = 0; i < out_matrices; ++i) {
    args.a = a + a_offsets[static_cast<size_t>(i)];
    args.b = b + b_offsets[static_cast<size_t>(i)];
    args.c = out + i * plan.n * plan.m;
    gemm_f32(args);
  }
}

// The integer version: exact int64 sums, alpha and beta applied as integers like PyTorch.
void matmul_i64(const MatmulPlan& plan, const int64_t* a, const int64_t* b, int64_t* out, int64_t alpha, int64_t beta) {
  const std::vector<int64_t> a_offsets = batch_offsets(plan.a_shape, plan.out_batch);
  const std::vector<int64_t> b_offsets = batch_offsets(plan.b_shape, plan.out_batch);
  for (size_t batch = 0; batch < a_offsets.size(); ++batch) {
    const int64_t* a_matrix = a + a_offsets[batch];
    const int64_t* b_matrix = b + b_offsets[batch];
    int64_t* out_matrix = out + static_cast<int64_t>(batch) * plan.n * plan.m;
    for (int64_t i = 0; i < plan.n; ++i)
      for (int64_t j = 0; j < plan.m; ++j) {
        int64_t sum = 0;
        for (int64_t p = 0; p < plan.k; ++p) sum += a_matrix[i * plan.k + p] * b_matrix[p * plan.m + j];
        int64_t& result = out_matrix[i * plan.m + j];
        result = alpha * sum + (beta == 0 ? 0 : beta * result);
      }
  }
}

// Copies `source` broadcast to `target`'s shape; both in the same reference dtype.
void broadcast_into(const Tensor& source, Tensor& target) {
  const Shape& shape = target.shape();
  const std::vector<int64_t> strides = broadcast_strides(source.shape(), shape);
  const size_t element = dtype_size(target.dtype());
  const std::byte* src = source.bytes();
  std::byte* dst = target.mutable_bytes();
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t flat = 0; flat < target.numel(); ++flat) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    std::memcpy(dst + flat * element, src + offset * element, element);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

// out = beta * bias + alpha * (a · b) in the output's reference dtype; `bias` may be undefined (beta ignored).
Tensor run_matmul(const MatmulPlan& plan, const Tensor& a_input, const Tensor& b_input, const Tensor* bias,
                  const TensorMeta& out_meta, double alpha, double beta) {
  Tensor out = make_output(out_meta);
  const DType domain = out.dtype();
  const Tensor a = a_input.to(domain);
  const Tensor b = b_input.to(domain);
  const bool use_bias = bias && beta != 0.0;
  if (use_bias) broadcast_into(bias->to(domain), out);
  if (domain == DType::Float32) {
    matmul_f32(plan, a.data<float>(), b.data<float>(), out.mutable_data<float>(), static_cast<float>(alpha),
               use_bias ? static_cast<float>(beta) : 0.0f);
  } else {
    matmul_i64(plan, a.data<int64_t>(), b.data<int64_t>(), out.mutable_data<int64_t>(), static_cast<int64_t>(alpha),
               use_bias ? static_cast<int64_t>(beta) : 0);
  }
  return out;
}

// ---- matmul, mm, bmm ----

std::vector<TensorMeta> infer_matmul(const Attrs&, std::span<const TensorMeta> inputs) {
  const DType dtype = promote_all(inputs);
  expect_matmul_dtype(dtype, "matmul");
  return {{plan_matmul(inputs[0].shape, inputs[1].shape, "matmul").out_shape, dtype}};
}

std::vector<TensorMeta> infer_mm(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  expect_rank(inputs[0], 2, "mm: first operand");
  expect_rank(inputs[1], 2, "mm: second operand");
  return infer_matmul(attrs, inputs);
}

std::vector<TensorMeta> infer_bmm(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  expect_rank(inputs[0], 3, "bmm: first operand");
  expect_rank(inputs[1], 3, "bmm: second operand");
  if (inputs[0].shape[0] != inputs[1].shape[0])
    fail("bmm: batch sizes differ: " + shape_string(inputs[0].shape) + " and " + shape_string(inputs[1].shape));
  return infer_matmul(attrs, inputs);
}

std::vector<Tensor> reference_matmul(const Attrs&, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
  const MatmulPlan plan = plan_matmul(inputs[0].shape(), inputs[1].shape(), "matmul");
  Tensor out = run_matmul(plan, inputs[0], inputs[1], nullptr, outputs[0], 1.0, 0.0);
  return {out.reshaped(outputs[0].shape)};
}

// ---- linear: x [..., K] · weight[N, K]^T + bias ----

std::vector<TensorMeta> infer_linear(const Attrs&, std::span<const TensorMeta> inputs) {
  const Shape& x = inputs[0].shape;
  const Shape& weight = inputs[1].shape;
  if (x.empty()) fail("linear: input must have at least one dimension");
  expect_rank(inputs[1], 2, "linear: weight");
  if (x.back() != weight[1])
    fail("linear: input " + shape_string(x) + " has " + std::to_string(x.back()) + " features but weight " +
         shape_string(weight) + " expects " + std::to_string(weight[1]));
  if (inputs.size() == 3 && inputs[2].shape != Shape{weight[0]} && shape_numel(inputs[2].shape) != 1)
    fail("linear: bias " + shape_string(inputs[2].shape) + " does not match " + std::to_string(weight[0]) +
         " output features");
  const DType dtype = promote_all(inputs);
  expect_matmul_dtype(dtype, "linear");
  Shape out(x.begin(), x.end() - 1);
  out.push_back(weight[0]);
  return {{out, dtype}};
}

std::vector<Tensor> reference_linear(const Attrs&, std::span<const Tensor> inputs,
                                     std::span<const TensorMeta> outputs) {
  const int64_t out_features = inputs[1].dim(0);
  const int64_t features = inputs[1].dim(1);
  Tensor out = make_output(outputs[0]);
  if (out.numel() == 0) return {out};
  const int64_t rows = out.numel() / out_features;
  const bool has_bias = inputs.size() == 3;
  if (has_bias) {
    Tensor matrix = out.reshaped({rows, out_features});
    broadcast_into(inputs[2].to(out.dtype()).reshaped({inputs[2].numel()}), matrix);
  }
  if (out.dtype() == DType::Float32) {
    const Tensor x = inputs[0].to(DType::Float32);
    const Tensor weight = inputs[1].to(DType::Float32);
    gemm_f32({.m = rows,
              .n = out_features,
              .k = features,
              .a = x.data<float>(),
              .lda = features,
              .b = weight.data<float>(),
              .ldb = features,
              .b_transposed = true,
              .c = out.mutable_data<float>(),
              .ldc = out_features,
              .beta = has_bias ? 1.0f : 0.0f});
    return {out};
  }
  // Integer linear: x · weight^T as a matmul against the transposed weight.
  const Tensor weight = inputs[1].to(DType::Int64);
  Tensor transposed(DType::Int64, {features, out_features});
  for (int64_t j = 0; j < out_features; ++j)
    for (int64_t p = 0; p < features; ++p)
      transposed.mutable_data<int64_t>()[p * out_features + j] = weight.data<int64_t>()[j * features + p];
  const MatmulPlan plan = plan_matmul({rows, features}, {features, out_features}, "linear");
  const Tensor x = inputs[0].reshaped({rows, features});
  Tensor result = run_matmul(plan, x, transposed, has_bias ? &inputs[2] : nullptr,
                             {{rows, out_features}, outputs[0].dtype}, 1.0, 1.0);
  return {result.reshaped(outputs[0].shape)};
}

// ---- addmm / baddbmm: beta * self + alpha * (a · b) ----

std::vector<TensorMeta> infer_addmm_like(std::span<const TensorMeta> inputs, int rank, const char* op) {
  expect_rank(inputs[1], rank, (std::string(op) + ": first matrix operand").c_str());
  expect_rank(inputs[2], rank, (std::string(op) + ": second matrix operand").c_str());
  if (rank == 3 && inputs[1].shape[0] != inputs[2].shape[0])
    fail(std::string(op) + ": batch sizes differ: " + shape_string(inputs[1].shape) + " and " +
         shape_string(inputs[2].shape));
  const MatmulPlan plan = plan_matmul(inputs[1].shape, inputs[2].shape, op);
  if (broadcast_shapes(inputs[0].shape, plan.out_shape) != plan.out_shape)
    fail(std::string(op) + ": self " + shape_string(inputs[0].shape) + " does not broadcast to the product shape " +
         shape_string(plan.out_shape));
  const DType dtype = promote_all(inputs);
  expect_matmul_dtype(dtype, op);
  return {{plan.out_shape, dtype}};
}

std::vector<Tensor> reference_addmm(const Attrs& attrs, std::span<const Tensor> inputs,
                                    std::span<const TensorMeta> outputs) {
  const MatmulPlan plan = plan_matmul(inputs[1].shape(), inputs[2].shape(), "addmm");
  return {run_matmul(plan, inputs[1], inputs[2], &inputs[0], outputs[0], attrs.get_float("alpha", 1.0),
                     attrs.get_float("beta", 1.0))};
}

// ---- t: transpose of a matrix; 0-D and 1-D tensors pass through ----

std::vector<TensorMeta> infer_t(const Attrs&, std::span<const TensorMeta> inputs) {
  const Shape& shape = inputs[0].shape;
  if (shape.size() > 2) fail("t: expects a tensor with at most 2 dimensions, got " + shape_string(shape));
  return {{shape.size() == 2 ? Shape{shape[1], shape[0]} : shape, inputs[0].dtype}};
}

std::vector<Tensor> reference_t(const Attrs&, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
  const Tensor& input = inputs[0];
  if (input.rank() < 2) return {input.clone()};
  const int64_t rows = input.dim(0), cols = input.dim(1);
  Tensor out(input.dtype(), outputs[0].shape);
  const size_t element = dtype_size(input.dtype());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      std::memcpy(out.mutable_bytes() + (j * rows + i) * element, input.bytes() + (i * cols + j) * element, element);
  return {out};
}

AtenSpelling spelling(std::string op_type) { return AtenSpelling{std::move(op_type), {}, {}}; }

const std::vector<AttrSpec> kAlphaBeta = {{"beta", AttrType::Scalar, AttrValue{int64_t{1}}},
                                          {"alpha", AttrType::Scalar, AttrValue{int64_t{1}}}};

}  // namespace

void register_linalg_ops(OpRegistry& r) {
  r.add(OpDef{"linear", {spelling("aten.linear.default")}, {}, 2, 3, infer_linear, reference_linear});
  r.add(OpDef{"matmul", {spelling("aten.matmul.default")}, {}, 2, 2, infer_matmul, reference_matmul});
  r.add(OpDef{"mm", {spelling("aten.mm.default")}, {}, 2, 2, infer_mm, reference_matmul});
  r.add(OpDef{"bmm", {spelling("aten.bmm.default")}, {}, 2, 2, infer_bmm, reference_matmul});
  r.add(OpDef{"addmm",
              {spelling("aten.addmm.default")},
              kAlphaBeta,
              3,
              3,
              [](const Attrs&, std::span<const TensorMeta> inputs) { return infer_addmm_like(inputs, 2, "addmm"); },
              reference_addmm});
  r.add(OpDef{"baddbmm",
              {spelling("aten.baddbmm.default")},
              kAlphaBeta,
              3,
              3,
              [](const Attrs&, std::span<const TensorMeta> inputs) { return infer_addmm_like(inputs, 3, "baddbmm"); },
              reference_addmm});
  r.add(OpDef{"t", {spelling("aten.t.default")}, {}, 1, 1, infer_t, reference_t});
}

}  // namespace npusim
