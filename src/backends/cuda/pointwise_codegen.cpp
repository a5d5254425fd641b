#include "backends/cuda/pointwise_codegen.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>

#include "backends/cuda/cuda_util.h"

namespace npusim::cuda {

namespace {

using cpu::Elem;
using cpu::UnaryKind;

constexpr const char* kConversions = R"(__device__ __forceinline__ float npusim_h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short npusim_f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float npusim_bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short npusim_f2bf(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float npusim_relu6(float x) {
  x = x < 0.0f ? 0.0f : x;
  return 6.0f < x ? 6.0f : x;
}
__device__ __forceinline__ float npusim_clamp(float x, float low, float high) {
  if (x != x) return x;
  x = low != low ? low : (x < low ? low : x);
  return high != high ? high : (x > high ? high : x);
}
)";

// A float as an exact CUDA literal.
std::string literal(float value) {
  if (std::isnan(value)) return "__int_as_float(0x7fc00000)";
  if (std::isinf(value)) return value > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char text[64];
  std::snprintf(text, sizeof text, "%af", static_cast<double>(value));
  return std::string("(") + text + ")";
}

std::string unary_expression(const cpu::UnaryStep& s, const std::string& x) {
  const std::string p0 = literal(s.p0), p1 = literal(s.p1), p2 = literal(s.p2);
  switch (s.kind) {
    case UnaryKind::Identity:
      return x;
    case UnaryKind::Neg:
      return "(-" + x + ")";
    case UnaryKind::Abs:
      return "fabsf(" + x + ")";
    case UnaryKind::Sign:
      return "(float)((0.0f < " + x + ") - (" + x + " < 0.0f))";
    case UnaryKind::Floor:
      return "floorf(" + x + ")";
    case UnaryKind::Ceil:
      return "ceilf(" + x + ")";
    case UnaryKind::Trunc:
      return "truncf(" + x + ")";
    case UnaryKind::Round:
      return "rintf(" + x + ")";
    case UnaryKind::Exp:
      return "expf(" + x + ")";
    case UnaryKind::Log:
      return "logf(" + x + ")";
    case UnaryKind::Log2:
      return "log2f(" + x + ")";
    case UnaryKind::Log10:
      return "log10f(" + x + ")";
    case UnaryKind::Log1p:
      return "log1pf(" + x + ")";
    case UnaryKind::Expm1:
      return "expm1f(" + x + ")";
    case UnaryKind::Sqrt:
      return "sqrtf(" + x + ")";
    case UnaryKind::Rsqrt:
      return "(1.0f / sqrtf(" + x + "))";
    case UnaryKind::Reciprocal:
      return "(1.0f / " + x + ")";
    case UnaryKind::Sin:
      return "sinf(" + x + ")";
    case UnaryKind::Cos:
      return "cosf(" + x + ")";
    case UnaryKind::Tan:
      return "tanf(" + x + ")";
    case UnaryKind::Atan:
      return "atanf(" + x + ")";
    case UnaryKind::Tanh:
      return "tanhf(" + x + ")";
    case UnaryKind::Sigmoid:
      return "(1.0f / (1.0f + expf(-" + x + ")))";
    case UnaryKind::Erf:
      return "erff(" + x + ")";
    case UnaryKind::Relu:
      return "(" + x + " < 0.0f ? 0.0f : " + x + ")";
    case UnaryKind::Clamp:
      return "npusim_clamp(" + x + ", " + p0 + ", " + p1 + ")";
    case UnaryKind::GeluErf:
      return "(0.5f * " + x + " * (1.0f + erff(" + x + " * 0.70710678118654752f)))";
    case UnaryKind::GeluTanh:
      return "(0.5f * " + x + " * (1.0f + tanhf(0.79788456080286536f * (" + x + " + 0.044715f * " + x + " * " + x +
             " * " + x + "))))";
    case UnaryKind::Silu:
      return "(" + x + " * (1.0f / (1.0f + expf(-" + x + "))))";
    case UnaryKind::Hardswish:
      return "(" + x + " * npusim_relu6(" + x + " + 3.0f) / 6.0f)";
    case UnaryKind::Hardsigmoid:
      return "(npusim_relu6(" + x + " + 3.0f) / 6.0f)";
    case UnaryKind::LeakyRelu:
      return "(" + x + " > 0.0f ? " + x + " : " + x + " * " + p0 + ")";
    case UnaryKind::Elu:
      return "(" + x + " > 0.0f ? " + x + " * " + p1 + " : expm1f(" + x + " * " + p2 + ") * " + p0 + " * " + p1 + ")";
    case UnaryKind::Softplus:
      return "(" + x + " * " + p0 + " > " + p1 + " ? " + x + " : log1pf(expf(" + x + " * " + p0 + ")) / " + p0 + ")";
    case UnaryKind::Mish:
      return "(" + x + " * tanhf(log1pf(expf(" + x + "))))";
    case UnaryKind::LogicalNot:
      return "(" + x + " == 0.0f ? 1.0f : 0.0f)";
    case UnaryKind::AddScalar:
      return "(" + x + " + " + p0 + ")";
    case UnaryKind::MulScalar:
      return "(" + x + " * " + p0 + ")";
    case UnaryKind::DivScalar:
      return "(" + x + " / " + p0 + ")";
    case UnaryKind::PowScalar:
      if (s.p0 == 2.0f) return "(" + x + " * " + x + ")";
      if (s.p0 == 1.0f) return x;
      if (s.p0 == 0.5f) return "sqrtf(" + x + ")";
      // Small whole and half exponents as multiplies and square roots (powf costs a log and an exp).
      if (s.p0 == 3.0f) return "(" + x + " * " + x + " * " + x + ")";
      if (s.p0 == 4.0f) return "((" + x + " * " + x + ") * (" + x + " * " + x + "))";
      if (s.p0 == -1.0f) return "(1.0f / " + x + ")";
      if (s.p0 == -2.0f) return "(1.0f / (" + x + " * " + x + "))";
      if (s.p0 == -0.5f) return "(1.0f / sqrtf(" + x + "))";
      return "powf(" + x + ", " + p0 + ")";
  }
  fail("pointwise kernel: unknown unary step");
}

std::string step_expression(const PointwiseStep& step, const std::string& a, const std::string& b,
                            const std::string& c) {
  if (step.constant) return literal(*step.constant);
  if (step.unary) return unary_expression(*step.unary, a);
  const std::string alpha = literal(step.alpha);
  const std::string scaled = step.alpha == 1.0f ? b : "(" + alpha + " * " + b + ")";
  switch (step.binary) {
    case PointwiseBinary::Add:
      return "(" + a + " + " + scaled + ")";
    case PointwiseBinary::Sub:
      return "(" + a + " - " + scaled + ")";
    case PointwiseBinary::Mul:
      return "(" + a + " * " + b + ")";
    case PointwiseBinary::Div:
      return "(" + a + " / " + b + ")";
    case PointwiseBinary::Select:
      return "(" + a + " != 0.0f ? " + b + " : " + c + ")";
  }
  fail("pointwise kernel: unknown binary step");
}

size_t elem_bytes(Elem elem) { return cpu::elem_size(elem); }

// The shape with dims of size 1 dropped and neighbours every operand walks contiguously merged, with each input's
// strides.
struct Layout {
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides;  // per input
  std::vector<bool> contiguous;               // per input: reads element i at output element i
};

Layout simplify(const PointwiseKernel& kernel) {
  Layout layout;
  const size_t inputs = kernel.inputs.size();
  layout.strides.resize(inputs);
  int64_t running = 1;
  std::vector<int64_t> out_strides(kernel.shape.size());
  for (size_t d = kernel.shape.size(); d-- > 0;) {
    out_strides[d] = running;
    running *= kernel.shape[d];
  }
  std::vector<int64_t> merged_out;
  for (size_t d = 0; d < kernel.shape.size(); ++d) {
    const int64_t size = kernel.shape[d];
    if (size == 1) continue;
    bool merge = !layout.sizes.empty() && merged_out.back() == out_strides[d] * size;
    for (size_t k = 0; merge && k < inputs; ++k) merge = layout.strides[k].back() == kernel.inputs[k].strides[d] * size;
    if (merge) {
      layout.sizes.back() *= size;
      merged_out.back() = out_strides[d];
      for (size_t k = 0; k < inputs; ++k) layout.strides[k].back() = kernel.inputs[k].strides[d];
      continue;
    }
    layout.sizes.push_back(size);
    merged_out.push_back(out_strides[d]);
    for (size_t k = 0; k < inputs; ++k) layout.strides[k].push_back(kernel.inputs[k].strides[d]);
  }
  for (size_t k = 0; k < inputs; ++k) layout.contiguous.push_back(layout.strides[k] == merged_out);
  return layout;
}

int64_t element_count(const PointwiseKernel& kernel) { return shape_numel(kernel.shape); }

}  // namespace

const char* generated_prelude() { return kConversions; }

const char* storage_type(cpu::Elem elem) {
  if (elem == Elem::Bool) return "unsigned char";
  return elem == Elem::F32 ? "float" : "unsigned short";
}

std::string load_as_float(cpu::Elem elem, const std::string& raw) {
  if (elem == Elem::Bool) return "(float)" + raw;
  if (elem == Elem::F16) return "npusim_h2f(" + raw + ")";
  if (elem == Elem::BF16) return "npusim_bf2f(" + raw + ")";
  return raw;
}

std::string store_from_float(cpu::Elem elem, const std::string& value) {
  if (elem == Elem::F16) return "npusim_f2h(" + value + ")";
  if (elem == Elem::BF16) return "npusim_f2bf(" + value + ")";
  return value;
}

int vector_lanes(const PointwiseKernel& kernel, const std::vector<const void*>& addresses) {
  const Layout layout = simplify(kernel);
  size_t widest = elem_bytes(kernel.out_elem);
  for (const PointwiseInput& input : kernel.inputs) {
    if (!cpu::is_float_elem(input.elem)) return 1;  // masks are read one element at a time
    widest = std::max(widest, elem_bytes(input.elem));
  }
  const int lanes = widest == 2 ? 8 : 4;
  if (element_count(kernel) < lanes || addresses.size() != kernel.inputs.size() + 1) return 1;
  auto aligned = [&](const void* address, Elem elem) {
    return address_alignment(address) >= static_cast<uint32_t>(lanes) * elem_bytes(elem);
  };
  if (!aligned(addresses[0], kernel.out_elem)) return 1;
  // A strided input: the lanes of a vector must lie in one innermost row, which the input reads contiguously
  // (aligned like the output) or broadcasts.
  const int64_t inner = layout.sizes.empty() ? 1 : layout.sizes.back();
  for (size_t k = 0; k < kernel.inputs.size(); ++k) {
    if (layout.contiguous[k]) {
      if (!aligned(addresses[k + 1], kernel.inputs[k].elem)) return 1;
      continue;
    }
    const std::vector<int64_t>& strides = layout.strides[k];
    if (inner % lanes != 0) return 1;
    if (strides.back() == 0) continue;
    if (strides.back() != 1 || !aligned(addresses[k + 1], kernel.inputs[k].elem)) return 1;
    for (size_t d = 0; d + 1 < strides.size(); ++d)
      if (strides[d] % lanes != 0) return 1;
  }
  return lanes;
}

int64_t pointwise_blocks(const PointwiseKernel& kernel) {
  const int64_t per_block = static_cast<int64_t>(kPointwiseThreads) * kernel.lanes;
  return (element_count(kernel) + per_block - 1) / per_block;
}

std::string pointwise_source(const PointwiseKernel& kernel) {
  const Layout layout = simplify(kernel);
  const size_t inputs = kernel.inputs.size();
  const int64_t count = element_count(kernel);
  const int lanes = kernel.lanes;
  std::ostringstream s;
  s << generated_prelude();
  s << "extern \"C\" __global__ void __launch_bounds__(" << kPointwiseThreads << ") " << kPointwiseKernelName << "("
    << storage_type(kernel.out_elem) << "* out";
  for (size_t k = 0; k < inputs; ++k) s << ", const " << storage_type(kernel.inputs[k].elem) << "* in" << k;
  s << ") {\n";
  s << "  const long long first = ((long long)blockIdx.x * " << kPointwiseThreads << " + threadIdx.x) * " << lanes
    << ";\n";
  s << "  if (first >= " << count << "LL) return;\n";

  const auto value_name = [&](int value, const std::string& lane) {
    std::string name = "v";
    return name.append(std::to_string(value)).append(lane);
  };
  const auto lane_suffix = [](int lane) { return std::string("_").append(std::to_string(lane)); };
  const auto emit_steps = [&](const std::string& lane, const std::string& indent) {
    for (size_t step = 0; step < kernel.steps.size(); ++step) {
      const PointwiseStep& p = kernel.steps[step];
      s << indent << "const float " << value_name(static_cast<int>(inputs + step), lane) << " = "
        << step_expression(p, value_name(p.a, lane), p.b >= 0 ? value_name(p.b, lane) : "",
                           p.c >= 0 ? value_name(p.c, lane) : "")
        << ";\n";
    }
  };
  const int output_value = static_cast<int>(inputs + kernel.steps.size()) - 1;

  // Offsets of the strided inputs for the element at `index`, decomposed over the layout's sizes (constants), in
  // 32-bit arithmetic where every index fits: division by a constant is then a multiply-high.
  int64_t largest = count;
  for (size_t k = 0; k < inputs; ++k) {
    int64_t reach = 0;
    for (size_t d = 0; d < layout.sizes.size(); ++d) reach += (layout.sizes[d] - 1) * layout.strides[k][d];
    largest = std::max(largest, reach + 1);
  }
  const bool narrow = largest <= std::numeric_limits<int32_t>::max();
  const std::string type = narrow ? "unsigned" : "long long", suffix = narrow ? "u" : "LL";
  const auto emit_offsets = [&](const std::string& index, const std::string& indent) {
    std::vector<std::string> offsets(inputs, index);
    if (std::all_of(layout.contiguous.begin(), layout.contiguous.end(), [](bool c) { return c; })) return offsets;
    s << indent << type << " rest = (" << type << ")" << index << ";\n";
    for (size_t k = 0; k < inputs; ++k)
      if (!layout.contiguous[k]) {
        offsets[k] = std::string("o").append(std::to_string(k));
        s << indent << type << " " << offsets[k] << " = 0;\n";
      }
    for (size_t d = layout.sizes.size(); d-- > 0;) {
      const std::string size = std::to_string(layout.sizes[d]) + suffix;
      s << indent << "{\n" << indent << "  const " << type << " c = " << (d == 0 ? "rest" : "rest % " + size) << ";\n";
      if (d > 0) s << indent << "  rest /= " << size << ";\n";
      for (size_t k = 0; k < inputs; ++k)
        if (!layout.contiguous[k] && layout.strides[k][d] != 0)
          s << indent << "  " << offsets[k] << " += c * " << layout.strides[k][d] << suffix << ";\n";
      s << indent << "}\n";
    }
    return offsets;
  };

  if (lanes > 1) {
    // Vector body: the output and each input read contiguously are moved 16 (or 8) bytes at a time; an input that
    // broadcasts along the innermost dim is read once for all lanes.
    s << "  if (first + " << lanes << " <= " << count << "LL) {\n";
    const std::vector<std::string> offsets = emit_offsets("first", "    ");
    const auto vector_type = [&](Elem elem) { return elem_bytes(elem) * lanes == 16 ? "uint4" : "uint2"; };
    for (size_t k = 0; k < inputs; ++k) {
      const Elem elem = kernel.inputs[k].elem;
      const std::string name = std::to_string(k);
      if (!layout.contiguous[k] && layout.strides[k].back() == 0) {
        s << "    const float b" << name << " = " << load_as_float(elem, "in" + name + "[" + offsets[k] + "]") << ";\n";
        for (int lane = 0; lane < lanes; ++lane)
          s << "    const float " << value_name(static_cast<int>(k), lane_suffix(lane)) << " = b" << name << ";\n";
        continue;
      }
      s << "    const " << vector_type(elem) << " r" << name << " = *reinterpret_cast<const " << vector_type(elem)
        << "*>(in" << name << " + " << offsets[k] << ");\n";
      for (int lane = 0; lane < lanes; ++lane) {
        std::string word;
        if (elem == Elem::F32) {
          word = "__uint_as_float(r" + name + "." + "xyzw"[lane] + ")";
        } else {
          word = std::string("(unsigned short)(r") + name + "." + "xyzw"[lane / 2] + (lane % 2 ? " >> 16)" : ")");
        }
        s << "    const float " << value_name(static_cast<int>(k), lane_suffix(lane)) << " = "
          << (elem == Elem::F32 ? word : load_as_float(elem, word)) << ";\n";
      }
    }
    for (int lane = 0; lane < lanes; ++lane) emit_steps(lane_suffix(lane), "    ");
    const Elem out = kernel.out_elem;
    s << "    " << vector_type(out) << " o;\n";
    const int words = static_cast<int>(elem_bytes(out) * lanes / 4);
    for (int w = 0; w < words; ++w) {
      s << "    o."
        << "xyzw"[w] << " = ";
      if (out == Elem::F32) {
        s << "__float_as_uint(" << value_name(output_value, lane_suffix(w)) << ");\n";
      } else {
        s << "(unsigned)" << store_from_float(out, value_name(output_value, lane_suffix(2 * w))) << " | ((unsigned)"
          << store_from_float(out, value_name(output_value, lane_suffix(2 * w + 1))) << " << 16);\n";
      }
    }
    s << "    *reinterpret_cast<" << vector_type(out) << "*>(out + first) = o;\n";
    s << "    return;\n  }\n";
  }

  // Element by element: the tail of the vector body, or every element.
  s << "  for (int lane = 0; lane < " << lanes << " && first + lane < " << count << "LL; ++lane) {\n";
  s << "    const long long i = first + lane;\n";
  const std::vector<std::string> offsets = emit_offsets("i", "    ");
  for (size_t k = 0; k < inputs; ++k)
    s << "    const float " << value_name(static_cast<int>(k), "") << " = "
      << load_as_float(kernel.inputs[k].elem, "in" + std::to_string(k) + "[" + offsets[k] + "]") << ";\n";
  emit_steps("", "    ");
  s << "    out[i] = " << store_from_float(kernel.out_elem, value_name(output_value, "")) << ";\n";
  s << "  }\n}\n";
  return s.str();
}

}  // namespace npusim::cuda
