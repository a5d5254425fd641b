#include "kernel_api/source_gen.h"

#include <algorithm>
#include <regex>
#include <sstream>

namespace npusim::kernels::detail {

namespace {

#define NPUSIM_STRINGIFY(...) #__VA_ARGS__
#define NPUSIM_EXPAND_AND_STRINGIFY(...) NPUSIM_STRINGIFY(__VA_ARGS__)
constexpr const char* kCpuAbiText = NPUSIM_EXPAND_AND_STRINGIFY(NPUSIM_CPU_ABI_STRUCTS);

// Appends text and counts lines, so the generated source knows where the user's header and body start.
class SourceWriter {
 public:
  void add(const std::string& text) {
    text_ += text;
    line_ += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }
  // Copies user code verbatim, ending it with a newline; returns its line count.
  int add_user_code(const std::string& code) {
    const int first = line_;
    add(code);
    if (code.empty() || code.back() != '\n') add("\n");
    return line_ - first;
  }
  int next_line() const { return line_; }  // the line the next text starts on
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
  int line_ = 1;
};

constexpr const char* kCpuPreamble = R"(#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define NPUSIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct uint3 {
  uint32_t x, y, z;
};

struct npusim_dims {
  int64_t values[8];
  int64_t operator[](int64_t i) const { return values[i]; }
};

inline uint32_t npusim_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}
inline float npusim_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// IEEE half, round to nearest even.
inline uint16_t npusim_float_to_half(float value) {
  uint32_t bits = npusim_bits(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint32_t half_bits;
  if (bits >= (143u << 23)) {  // overflow, infinity or NaN
    half_bits = bits > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (bits < (113u << 23)) {  // subnormal half: let the float adder round
    const uint32_t magic = 126u << 23;
    half_bits = npusim_bits(npusim_float(bits) + npusim_float(magic)) - magic;
  } else {
    const uint32_t odd = (bits >> 13) & 1u;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    half_bits = bits >> 13;
  }
  return static_cast<uint16_t>(half_bits | (sign >> 16));
}
inline float npusim_half_to_float(uint16_t half_bits) {
  const uint32_t sign = static_cast<uint32_t>(half_bits & 0x8000u) << 16;
  const uint32_t exponent = (half_bits >> 10) & 0x1fu, mantissa = half_bits & 0x3ffu;
  if (exponent == 0x1fu) return npusim_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return npusim_float(sign | npusim_bits(magnitude));
  }
  return npusim_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
inline uint16_t npusim_float_to_bfloat16(float value) {
  const uint32_t bits = npusim_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// 16-bit floats compute in float: they convert to float and back implicitly.
#define NPUSIM_FLOAT16_TYPE(name, to_bits, from_bits)                         \
  struct name {                                                               \
    uint16_t bits;                                                            \
    name() = default;                                                         \
    name(float value) : bits(to_bits(value)) {}                               \
    operator float() const { return from_bits(bits); }                        \
    name& operator+=(float value) { return *this = name(float(*this) + value); } \
    name& operator-=(float value) { return *this = name(float(*this) - value); } \
    name& operator*=(float value) { return *this = name(float(*this) * value); } \
    name& operator/=(float value) { return *this = name(float(*this) / value); } \
  };
inline float npusim_bfloat16_to_float(uint16_t bits) { return npusim_float(static_cast<uint32_t>(bits) << 16); }
NPUSIM_FLOAT16_TYPE(half, npusim_float_to_half, npusim_half_to_float)
NPUSIM_FLOAT16_TYPE(bfloat16, npusim_float_to_bfloat16, npusim_bfloat16_to_float)
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "16-bit float types");

template <class T>
struct atomic {
  T value;
};
// Compiler atomics rather than <atomic>, which takes a second to include. Floats add by compare-and-swap.
#define NPUSIM_INTEGER_ATOMIC_OPS(T)                                                                        \
  inline void atomic_add(atomic<T>* slot, T value) { __atomic_fetch_add(&slot->value, value, __ATOMIC_RELAXED); } \
  inline T atomic_load(atomic<T>* slot) { return __atomic_load_n(&slot->value, __ATOMIC_SEQ_CST); }              \
  inline void atomic_store(atomic<T>* slot, T value) { __atomic_store_n(&slot->value, value, __ATOMIC_SEQ_CST); }
#define NPUSIM_FLOAT_ATOMIC_OPS(T, Bits)                                                                      \
  inline void atomic_add(atomic<T>* slot, T value) {                                                          \
    Bits* bits = reinterpret_cast<Bits*>(&slot->value);                                                       \
    Bits expected = __atomic_load_n(bits, __ATOMIC_RELAXED);                                                  \
    for (;;) {                                                                                                \
      T current;                                                                                              \
      std::memcpy(&current, &expected, sizeof current);                                                       \
      const T sum = current + value;                                                                          \
      Bits desired;                                                                                           \
      std::memcpy(&desired, &sum, sizeof desired);                                                            \
      if (__atomic_compare_exchange_n(bits, &expected, desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return; \
    }                                                                                                         \
  }                                                                                                           \
  inline T atomic_load(atomic<T>* slot) {                                                                     \
    const Bits bits = __atomic_load_n(reinterpret_cast<Bits*>(&slot->value), __ATOMIC_SEQ_CST);              \
    T value;                                                                                                  \
    std::memcpy(&value, &bits, sizeof value);                                                                 \
    return value;                                                                                             \
  }                                                                                                           \
  inline void atomic_store(atomic<T>* slot, T value) {                                                        \
    Bits bits;                                                                                                \
    std::memcpy(&bits, &value, sizeof bits);                                                                  \
    __atomic_store_n(reinterpret_cast<Bits*>(&slot->value), bits, __ATOMIC_SEQ_CST);                          \
  }
NPUSIM_FLOAT_ATOMIC_OPS(float, uint32_t)
NPUSIM_FLOAT_ATOMIC_OPS(double, uint64_t)
NPUSIM_INTEGER_ATOMIC_OPS(int32_t)
NPUSIM_INTEGER_ATOMIC_OPS(int64_t)

template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <class A, class B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}
using std::abs, std::acos, std::asin, std::atan, std::atan2, std::cbrt, std::ceil, std::copysign, std::cos,
    std::cosh, std::erf, std::exp, std::exp2, std::expm1, std::fabs, std::floor, std::fma, std::fmax, std::fmin,
    std::fmod, std::hypot, std::isfinite, std::isinf, std::isnan, std::log, std::log10, std::log1p, std::log2,
    std::pow, std::round, std::sin, std::sinh, std::sqrt, std::tan, std::tanh, std::trunc;
inline float rsqrtf(float value) { return 1.0f / std::sqrt(value); }
inline double rsqrt(double value) { return 1.0 / std::sqrt(value); }

thread_local const npusim_cpu_launch* npusim_launch_now = nullptr;
thread_local const npusim_cpu_call* npusim_call_now = nullptr;

inline void threadgroup_barrier() { npusim_launch_now->barrier(npusim_call_now->team); }
inline void npusim_assert_failed(int line, uint3 thread) {
  npusim_launch_now->assert_failed(npusim_launch_now->assert_state, line, thread.x, thread.y, thread.z);
}
#define kernel_assert(...)                                         \
  do {                                                             \
    if (!(__VA_ARGS__)) {                                          \
      npusim_assert_failed(__LINE__, thread_position_in_grid);     \
      return;                                                      \
    }                                                              \
  } while (0)

}  // namespace
)";

constexpr const char* kCudaTypes = R"(typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;

struct npusim_dims {
  long long values[8];
  __device__ long long operator[](long long i) const { return values[i]; }
};

template <class T>
struct atomic {
  T value;
};
__device__ inline void atomic_add(atomic<float>* slot, float value) { atomicAdd(&slot->value, value); }
__device__ inline void atomic_add(atomic<double>* slot, double value) { atomicAdd(&slot->value, value); }
__device__ inline void atomic_add(atomic<int32_t>* slot, int32_t value) { atomicAdd(&slot->value, value); }
__device__ inline void atomic_add(atomic<int64_t>* slot, int64_t value) {
  atomicAdd(reinterpret_cast<unsigned long long*>(&slot->value), static_cast<unsigned long long>(value));
}
template <class T>
__device__ inline T atomic_load(atomic<T>* slot) {
  return *reinterpret_cast<volatile T*>(&slot->value);
}
__device__ inline void atomic_store(atomic<float>* slot, float value) { atomicExch(&slot->value, value); }
__device__ inline void atomic_store(atomic<int32_t>* slot, int32_t value) { atomicExch(&slot->value, value); }
__device__ inline void atomic_store(atomic<double>* slot, double value) {
  atomicExch(reinterpret_cast<unsigned long long*>(&slot->value),
             static_cast<unsigned long long>(__double_as_longlong(value)));
}
__device__ inline void atomic_store(atomic<int64_t>* slot, int64_t value) {
  atomicExch(reinterpret_cast<unsigned long long*>(&slot->value), static_cast<unsigned long long>(value));
}

__device__ __forceinline__ void threadgroup_barrier() { __syncthreads(); }

struct npusim_assert_record {
  unsigned failed;
  int line;
  unsigned x, y, z;
};
extern "C" {
__device__ npusim_assert_record npusim_assert_state;
}
__device__ inline void npusim_assert_failed(int line, uint3 thread) {
  if (atomicCAS(&npusim_assert_state.failed, 0u, 1u) == 0u) {
    npusim_assert_state.line = line;
    npusim_assert_state.x = thread.x;
    npusim_assert_state.y = thread.y;
    npusim_assert_state.z = thread.z;
    __threadfence();
  }
}
#define kernel_assert(...)                                     \
  do {                                                         \
    if (!(__VA_ARGS__)) {                                      \
      npusim_assert_failed(__LINE__, thread_position_in_grid); \
      return;                                                  \
    }                                                          \
  } while (0)
)";

std::string template_declarations(const Plan& plan) {
  std::string text;
  for (const auto& [name, value] : plan.templates) {
    if (const auto* dtype = std::get_if<DType>(&value)) {
      text += "using " + name + " = " + type_name(*dtype) + ";\n";
    } else if (const auto* flag = std::get_if<bool>(&value)) {
      text += std::string("constexpr bool ") + name + " = " + (*flag ? "true" : "false") + ";\n";
    } else {
      const int64_t number = std::get<int64_t>(value);
      const bool fits_int = number >= INT32_MIN && number <= INT32_MAX;
      text += std::string("constexpr ") + (fits_int ? "int " : "long long ") + name + " = " +
              (number == INT64_MIN ? "(-9223372036854775807LL - 1)" : std::to_string(number) + (fits_int ? "" : "LL")) +
              ";\n";
    }
  }
  return text;
}

// The parameter list of the kernel function, one slot per parameter.
std::string parameter_list(const Plan& plan, const std::string& indent) {
  std::string text;
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const Slot& slot = plan.slots[s];
    const Param& param = plan.params[slot.param];
    const std::string type = type_name(param.dtype);
    std::string declaration;
    switch (slot.kind) {
      case SlotKind::Data:
        if (param.scalar)
          declaration = "const " + type + " " + param.name;
        else if (!param.output)
          declaration = "const " + type + "* " + param.name;
        else if (plan.source->atomic_outputs)
          declaration = "atomic<" + type + ">* " + param.name;
        else
          declaration = type + "* " + param.name;
        break;
      case SlotKind::Shape:
        declaration = "const npusim_dims " + param.name + "_shape";
        break;
      case SlotKind::Strides:
        declaration = "const npusim_dims " + param.name + "_strides";
        break;
      case SlotKind::Ndim:
        declaration = "const int " + param.name + "_ndim";
        break;
    }
    text += indent + declaration + ",\n";
  }
  return text;
}

// How the CPU entry point reads slot s from launch->params.
std::string cpu_slot_load(const Plan& plan, size_t s) {
  const Slot& slot = plan.slots[s];
  const Param& param = plan.params[slot.param];
  const std::string type = type_name(param.dtype);
  const std::string source = "npusim_launch->params[" + std::to_string(s) + "]";
  switch (slot.kind) {
    case SlotKind::Data:
      if (param.scalar) return "*static_cast<const " + type + "*>(" + source + ")";
      if (!param.output) return "*static_cast<const " + type + "* const*>(" + source + ")";
      if (plan.source->atomic_outputs) return "*static_cast<atomic<" + type + ">* const*>(" + source + ")";
      return "*static_cast<" + type + "* const*>(" + source + ")";
    case SlotKind::Shape:
    case SlotKind::Strides:
      return "*static_cast<const npusim_dims*>(" + source + ")";
    case SlotKind::Ndim:
      return "*static_cast<const int32_t*>(" + source + ")";
  }
  return "";
}

std::string declared_names(const Plan& plan) {
  std::string text;
  for (const Slot& slot : plan.slots) {
    const Param& param = plan.params[slot.param];
    const char* suffix = slot.kind == SlotKind::Data      ? ""
                         : slot.kind == SlotKind::Shape   ? "_shape"
                         : slot.kind == SlotKind::Strides ? "_strides"
                                                          : "_ndim";
    text += (text.empty() ? "" : ", ") + param.name + suffix;
  }
  for (const auto& [name, value] : plan.templates) text += ", " + name;
  return text;
}

}  // namespace

std::string GeneratedSource::describe_line(int line) const {
  if (line >= body_first_line && line < body_first_line + body_lines)
    return "body line " + std::to_string(line - body_first_line + 1);
  if (header_lines > 0 && line >= header_first_line && line < header_first_line + header_lines)
    return "header line " + std::to_string(line - header_first_line + 1);
  return "generated line " + std::to_string(line);
}

std::string GeneratedSource::line_text(int line) const {
  std::istringstream stream(text);
  std::string current;
  for (int number = 1; std::getline(stream, current); ++number)
    if (number == line) return current;
  return "";
}

bool needs_fp16_types(const Plan& plan) {
  const std::string code = plan.source->header + "\n" + plan.source->body;
  return plan.uses_dtype(DType::Float16) || plan.uses_dtype(DType::BFloat16) || mentions(code, "half") ||
         mentions(code, "bfloat16") || mentions(code, "__half") || mentions(code, "__nv_bfloat16");
}

GeneratedSource generate_cpu_source(const Plan& plan) {
  const KernelSource& source = *plan.source;
  GeneratedSource generated;
  SourceWriter out;
  out.add("// npusim kernel '" + source.name + "' for the CPU\n");
  out.add(std::string(kCpuAbiText) + "\n");
  out.add(kCpuPreamble);
  out.add("\n" + template_declarations(plan));
  if (!source.header.empty()) {
    generated.header_first_line = out.next_line();
    generated.header_lines = out.add_user_code(source.header);
  }
  out.add(
      "\nstatic void npusim_body(\n" + parameter_list(plan, "    ") +
      "    const uint3 thread_position_in_grid, const uint3 thread_position_in_threadgroup,\n"
      "    const uint3 threadgroup_position_in_grid, const uint3 threads_per_threadgroup,\n"
      "    const uint3 threads_per_grid, const uint3 threadgroups_per_grid, unsigned char* const shared_memory) {\n");
  generated.body_first_line = out.next_line();
  generated.body_lines = out.add_user_code(source.body);
  out.add("}\n\n");

  const int64_t bound =
      source.max_threads_per_threadgroup > 0 ? std::min<int64_t>(source.max_threads_per_threadgroup, 1024) : 1024;
  out.add("NPUSIM_EXPORT int npusim_cpu_abi_version() { return " + std::to_string(kCpuAbiVersion) + "; }\n");
  out.add("NPUSIM_EXPORT unsigned npusim_max_threads_per_threadgroup() { return " + std::to_string(bound) + "; }\n\n");
  out.add(
      "NPUSIM_EXPORT void npusim_run(const npusim_cpu_launch* npusim_launch, const npusim_cpu_call* npusim_call) {\n");
  out.add("  npusim_launch_now = npusim_launch;\n  npusim_call_now = npusim_call;\n");
  std::string arguments;
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const std::string local = "npusim_slot" + std::to_string(s);
    out.add("  const auto " + local + " = " + cpu_slot_load(plan, s) + ";\n");
    arguments += local + ", ";
  }
  out.add(R"(  const uint3 npusim_grid = {npusim_launch->grid[0], npusim_launch->grid[1], npusim_launch->grid[2]};
  const uint3 npusim_size = {npusim_launch->group[0], npusim_launch->group[1], npusim_launch->group[2]};
  const uint3 npusim_groups = {npusim_launch->groups[0], npusim_launch->groups[1], npusim_launch->groups[2]};
  const uint3 npusim_group = {npusim_call->group[0], npusim_call->group[1], npusim_call->group[2]};
  const unsigned npusim_end = npusim_call->first_thread + npusim_call->thread_count;
  for (unsigned npusim_t = npusim_call->first_thread; npusim_t < npusim_end; ++npusim_t) {
    const uint3 npusim_local = {npusim_t % npusim_size.x, npusim_t / npusim_size.x % npusim_size.y,
                                npusim_t / (npusim_size.x * npusim_size.y)};
    const uint3 npusim_global = {npusim_group.x * npusim_size.x + npusim_local.x,
                                 npusim_group.y * npusim_size.y + npusim_local.y,
                                 npusim_group.z * npusim_size.z + npusim_local.z};
    if (npusim_global.x >= npusim_grid.x || npusim_global.y >= npusim_grid.y || npusim_global.z >= npusim_grid.z)
      continue;
    npusim_body()" +
          arguments + R"(npusim_global, npusim_local, npusim_group, npusim_size, npusim_grid,
                npusim_groups, npusim_call->shared_memory);
  }
}
)");
  generated.text = out.take();
  return generated;
}

GeneratedSource generate_cuda_source(const Plan& plan, bool fp16_headers) {
  const KernelSource& source = *plan.source;
  GeneratedSource generated;
  SourceWriter out;
  out.add("// npusim kernel '" + source.name + "' for CUDA\n");
  if (fp16_headers) out.add("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\ntypedef __nv_bfloat16 bfloat16;\n");
  out.add(kCudaTypes);
  out.add("\n" + template_declarations(plan));
  if (!source.header.empty()) {
    generated.header_first_line = out.next_line();
    generated.header_lines = out.add_user_code(source.header);
  }
  const std::string bounds = source.max_threads_per_threadgroup > 0
                                 ? "__launch_bounds__(" + std::to_string(source.max_threads_per_threadgroup) + ") "
                                 : "";
  out.add("\nextern \"C\" __global__ void " + bounds + "npusim_kernel(\n" + parameter_list(plan, "    ") +
          "    const uint3 npusim_grid) {\n");
  out.add(R"(  const uint3 thread_position_in_threadgroup = threadIdx;
  const uint3 threadgroup_position_in_grid = blockIdx;
  const uint3 threads_per_threadgroup = blockDim;
  const uint3 threadgroups_per_grid = gridDim;
  const uint3 threads_per_grid = npusim_grid;
  const uint3 thread_position_in_grid = make_uint3(blockIdx.x * blockDim.x + threadIdx.x,
                                                   blockIdx.y * blockDim.y + threadIdx.y,
                                                   blockIdx.z * blockDim.z + threadIdx.z);
  extern __shared__ __align__(16) unsigned char shared_memory[];
  if (thread_position_in_grid.x >= npusim_grid.x || thread_position_in_grid.y >= npusim_grid.y ||
      thread_position_in_grid.z >= npusim_grid.z)
    return;
)");
  generated.body_first_line = out.next_line();
  generated.body_lines = out.add_user_code(source.body);
  out.add("}\n");
  generated.text = out.take();
  return generated;
}

std::string explain_compile_errors(const Plan& plan, const GeneratedSource& source, const std::string& log) {
  // gcc/clang: "file.cpp:12:5: error: message"; NVRTC: "kernel.cu(12): error: message".
  static const std::regex gcc_error(R"(^[^:\n]*:(\d+):\d+: (?:fatal )?error: (.*)$)");
  static const std::regex nvrtc_error(R"(^[^(\n]*\((\d+)\): (?:catastrophic )?error: (.*)$)");
  std::string explained;
  bool undeclared = false;
  int count = 0;
  std::istringstream stream(log);
  for (std::string line; std::getline(stream, line);) {
    std::smatch match;
    if (!std::regex_match(line, match, gcc_error) && !std::regex_match(line, match, nvrtc_error)) continue;
    if (++count > 10) {
      explained += "  ...\n";
      break;
    }
    const int number = std::stoi(match[1].str());
    const std::string message = match[2].str();
    undeclared = undeclared || message.find("not declared") != std::string::npos ||
                 message.find("is undefined") != std::string::npos;
    explained +=
        "  " + source.describe_line(number) + ": error: " + message + "\n      " + source.line_text(number) + "\n";
  }
  std::string text = plan.label() + ": the generated source does not compile:\n" + explained;
  if (undeclared) text += "  names the body can use besides the built-ins: " + declared_names(plan) + "\n";
  text += "compiler output:\n" + log;
  return text;
}

}  // namespace npusim::kernels::detail
