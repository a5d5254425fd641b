#pragma once
// The elementwise engine: operands (buffers walked through broadcast strides, or scalars) are loaded in chunks into
// fp32 or int64 arrays, an operation maps the chunk, and the result is stored in the output's element type. A
// chunk is read completely before it is written, so an output may share its buffer with a same-shaped input.
#include <algorithm>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/strided_loop.h"
#include "ops/op_util.h"

namespace npusim::cpu {

constexpr int64_t kChunk = 256;

// One operand: a buffer broadcast to the output shape, or a number.
struct OperandSpec {
  const Buffer* buffer = nullptr;
  double scalar = 0.0;  // used when buffer is null
  int64_t int_scalar = 0;
};

template <typename C>
struct ElementwisePlan {
  StridedLoop loop;
  int operands = 0;
  std::array<const std::byte*, kMaxLoopOperands> data{};  // null for scalars
  std::array<Elem, kMaxLoopOperands> elems{};
  std::array<C, kMaxLoopOperands> scalars{};
  std::byte* out = nullptr;
  Elem out_elem = Elem::F32;
};

// Nothing when the loop cannot be represented (too many dims or operands).
template <typename C>
std::optional<ElementwisePlan<C>> plan_elementwise(const Buffer& out, const std::vector<OperandSpec>& operands) {
  std::vector<std::vector<int64_t>> strides;
  ElementwisePlan<C> plan;
  plan.operands = static_cast<int>(operands.size());
  if (plan.operands > kMaxLoopOperands) return std::nullopt;
  for (size_t k = 0; k < operands.size(); ++k) {
    const OperandSpec& spec = operands[k];
    if (spec.buffer) {
      strides.push_back(ops::broadcast_strides(spec.buffer->meta.shape, out.meta.shape));
      plan.data[k] = spec.buffer->data;
      plan.elems[k] = spec.buffer->elem;
    } else {
      strides.emplace_back(out.meta.shape.size(), 0);
      if constexpr (std::is_same_v<C, float>)
        plan.scalars[k] = static_cast<float>(spec.scalar);
      else
        plan.scalars[k] = spec.int_scalar;
    }
  }
  std::optional<StridedLoop> loop = make_loop(out.meta.shape, strides);
  if (!loop) return std::nullopt;
  plan.loop = *loop;
  plan.out = out.data;
  plan.out_elem = out.elem;
  return plan;
}

// A chunk of operand k at element `offset`, advancing by `stride`: a pointer into the buffer when it already holds
// the compute type contiguously, else converted into `buffer`.
template <typename C>
const C* load_chunk(const std::byte* data, Elem elem, int64_t offset, int64_t stride, int64_t count, C* buffer) {
  constexpr Elem native = std::is_same_v<C, float> ? Elem::F32 : Elem::I64;
  if (stride == 1) {
    if (elem == native) return reinterpret_cast<const C*>(data) + offset;
    if constexpr (std::is_same_v<C, float>)
      to_float(data + static_cast<size_t>(offset) * elem_size(elem), elem, buffer, count);
    else
      to_int(data + static_cast<size_t>(offset) * elem_size(elem), elem, buffer, count);
    return buffer;
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = offset + i * stride;
    if constexpr (std::is_same_v<C, float>)
      buffer[i] = load_float(data, elem, at);
    else
      buffer[i] = load_int(data, elem, at);
    if (stride == 0) {
      std::fill(buffer + 1, buffer + count, buffer[0]);
      break;
    }
  }
  return buffer;
}

template <typename C>
void store_chunk(const C* values, std::byte* out, Elem elem, int64_t position, int64_t count) {
  std::byte* at = out + static_cast<size_t>(position) * elem_size(elem);
  if constexpr (std::is_same_v<C, float>)
    from_float(values, at, elem, count);
  else
    from_int(values, at, elem, count);
}

// Runs op(inputs, output, count) over the output elements [begin, end).
template <typename C, typename Op>
void run_elementwise_range(const ElementwisePlan<C>& plan, const Op& op, int64_t begin, int64_t end) {
  constexpr Elem native = std::is_same_v<C, float> ? Elem::F32 : Elem::I64;
  alignas(64) C buffers[kMaxLoopOperands][kChunk];
  alignas(64) C result[kChunk];
  for (int k = 0; k < plan.operands; ++k)
    if (!plan.data[k]) std::fill(buffers[k], buffers[k] + kChunk, plan.scalars[k]);
  walk(plan.loop, begin, end, [&](int64_t position, int64_t count, const int64_t* offsets) {
    for (int64_t done = 0; done < count; done += kChunk) {
      const int64_t n = std::min(kChunk, count - done);
      const C* inputs[kMaxLoopOperands];
      for (int k = 0; k < plan.operands; ++k) {
        if (!plan.data[k]) {
          inputs[k] = buffers[k];
          continue;
        }
        const int64_t stride = plan.loop.inner_stride(k);
        inputs[k] = load_chunk<C>(plan.data[k], plan.elems[k], offsets[k] + done * stride, stride, n, buffers[k]);
      }
      const bool direct = plan.out_elem == native;
      C* out = direct ? reinterpret_cast<C*>(plan.out) + position + done : result;
      op(inputs, out, n);
      if (!direct) store_chunk<C>(result, plan.out, plan.out_elem, position + done, n);
    }
  });
}

constexpr int64_t kParallelElements = int64_t{1} << 15;
constexpr int64_t kParallelGrain = int64_t{1} << 12;

// A kernel running `op` over the whole output, split across the pool when large.
template <typename C, typename Op>
Kernel elementwise_kernel(ElementwisePlan<C> plan, Op op, ThreadPool& pool) {
  auto shared = std::make_shared<const std::pair<ElementwisePlan<C>, Op>>(std::move(plan), std::move(op));
  ThreadPool* threads = &pool;
  Kernel kernel;
  kernel.run = [shared, threads] {
    const auto& [p, f] = *shared;
    const int64_t total = p.loop.numel;
    if (total < kParallelElements) {
      run_elementwise_range(p, f, 0, total);
      return;
    }
    threads->parallel_for(total, kParallelGrain,
                          [&](int64_t begin, int64_t end, int) { run_elementwise_range(p, f, begin, end); });
  };
  return kernel;
}

// ---- float operations shared with the fused kernels ----

enum class UnaryKind {
  Identity,
  Neg,
  Abs,
  Sign,
  Floor,
  Ceil,
  Trunc,
  Round,
  Exp,
  Log,
  Log2,
  Log10,
  Log1p,
  Expm1,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Sin,
  Cos,
  Tan,
  Atan,
  Tanh,
  Sigmoid,
  Erf,
  Relu,
  Clamp,  // p0 = low (or -inf), p1 = high (or +inf); NaN bounds propagate
  GeluErf,
  GeluTanh,
  Silu,
  Hardswish,
  Hardsigmoid,
  LeakyRelu,  // p0 = slope
  Elu,        // p0 = alpha, p1 = scale, p2 = input scale
  Softplus,   // p0 = beta, p1 = threshold
  Mish,
  LogicalNot,
  AddScalar,  // x + p0
  MulScalar,  // x * p0
  DivScalar,  // x / p0
  PowScalar,  // pow(x, p0)
};

struct UnaryStep {
  UnaryKind kind = UnaryKind::Identity;
  float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f;
};

// out[i] = step(in[i]) for i < n; `out` may be `in`.
void apply_unary(const UnaryStep& step, const float* in, float* out, int64_t n);

// The float step of a registered unary op with its attributes, or nothing when it has none here.
std::optional<UnaryStep> unary_step(const std::string& op, const Attrs& attrs);
// The float step of clamp's number bounds (either may be absent: an infinite bound), or nothing without either.
std::optional<UnaryStep> clamp_step(const Attrs& attrs);
// The float steps of an elementwise_chain's `ops` and `scalars` in order, or nothing when a step has none here.
std::optional<std::vector<UnaryStep>> chain_steps(const Attrs& attrs);

}  // namespace npusim::cpu
