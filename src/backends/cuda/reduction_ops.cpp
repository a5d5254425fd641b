#include "backends/cuda/reduction_ops.h"

#include <algorithm>
#include <array>
#include <limits>
#include <sstream>

#include "backends/cuda/generated_kernels.h"
#include "backends/cuda/pointwise_codegen.h"
#include "core/nvrtc_compiler.h"
#include "ops/op_util.h"
#include "ops/pool_window.h"

namespace npusim::cuda {

namespace {

constexpr const char* kReductionKernelName = "npusim_reduce";
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

enum class Combine { Sum, Mean, Max, Min };

// Sizes and strides of one group of dims (kept or reduced), neighbours the input walks contiguously merged.
struct DimGroup {
  std::vector<int64_t> sizes, strides;
  int64_t count = 1;

  void add(int64_t size, int64_t stride) {
    count *= size;
    if (size == 1) return;
    if (!sizes.empty() && strides.back() == stride * size) {
      sizes.back() *= size;
      strides.back() = stride;
      return;
    }
    sizes.push_back(size);
    strides.push_back(stride);
  }
};

struct Reduction {
  DimGroup kept, reduced;
  Combine combine = Combine::Sum;
  cpu::Elem in_elem = cpu::Elem::F32, out_elem = cpu::Elem::F32;
};

// Adds to `offset` the input offset of element `index` of the group, decomposed over its sizes (constants).
void emit_offset(std::ostringstream& s, const DimGroup& group, const std::string& index, const std::string& offset,
                 const std::string& type, const std::string& indent) {
  if (group.sizes.empty()) return;
  s << indent << "{\n" << indent << "  " << type << " rest = " << index << ";\n";
  for (size_t d = group.sizes.size(); d-- > 0;) {
    const std::string size = std::to_string(group.sizes[d]);
    s << indent << "  " << offset << " += (" << (d == 0 ? "rest" : "rest % " + size) << ") * " << group.strides[d]
      << ";\n";
    if (d > 0) s << indent << "  rest /= " << size << ";\n";
  }
  s << indent << "}\n";
}

std::string reduction_source(const Reduction& r, int64_t input_elements) {
  const bool narrow = input_elements < std::numeric_limits<int32_t>::max();
  const std::string type = narrow ? "unsigned" : "long long";
  const char* initial = r.combine == Combine::Max   ? "__int_as_float(0xff800000)"
                        : r.combine == Combine::Min ? "__int_as_float(0x7f800000)"
                                                    : "0.0f";
  // NaN wins, as in PyTorch's amax and amin.
  const char* combine = r.combine == Combine::Max   ? "(b > a || b != b) ? b : a"
                        : r.combine == Combine::Min ? "(b < a || b != b) ? b : a"
                                                    : "a + b";
  std::ostringstream s;
  s << generated_prelude();
  s << "__device__ __forceinline__ float npusim_combine(float a, float b) { return " << combine << "; }\n";
  s << "extern \"C\" __global__ void __launch_bounds__(" << kThreads << ") " << kReductionKernelName << "("
    << storage_type(r.out_elem) << "* out, const " << storage_type(r.in_elem) << "* in) {\n";
  s << "  const " << type << " o = (" << type << ")blockIdx.x * " << kWarpsPerBlock << " + (threadIdx.x >> 5);\n";
  s << "  if (o >= " << r.kept.count << ") return;\n";
  s << "  const unsigned lane = threadIdx.x & 31;\n";
  s << "  " << type << " base = 0;\n";
  emit_offset(s, r.kept, "o", "base", type, "  ");
  s << "  float acc = " << initial << ";\n";
  s << "  for (" << type << " j = lane; j < " << r.reduced.count << "; j += 32) {\n";
  s << "    " << type << " offset = base;\n";
  emit_offset(s, r.reduced, "j", "offset", type, "    ");
  s << "    acc = npusim_combine(acc, " << load_as_float(r.in_elem, "in[offset]") << ");\n";
  s << "  }\n";
  s << "  for (int shift = 16; shift > 0; shift >>= 1) acc = npusim_combine(acc, __shfl_xor_sync(0xffffffffu, acc, "
       "shift));\n";
  if (r.combine == Combine::Mean) s << "  acc = acc / " << r.reduced.count << ".0f;\n";
  s << "  if (lane == 0) out[o] = " << store_from_float(r.out_elem, "acc") << ";\n";
  s << "}\n";
  return s.str();
}

// A launch of the generated kernel kReductionKernelName(out, in) in blocks of kThreads.
std::optional<Launch> launch_of(const OpContext& ctx, const std::string& source, int64_t blocks, const DeviceValue& out,
                                const DeviceValue& in) {
  if (blocks == 0) return generated_launch(ctx.node, nullptr, 0, kThreads, {});
  const cudaKernel_t kernel = generated_kernel(source, kReductionKernelName, describe_node(ctx.node));
  return generated_launch(ctx.node, kernel, blocks, kThreads, {out.data, in.data});
}

std::optional<Launch> reduction_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue& in = ctx.inputs[0];
  const DeviceValue& out = ctx.outputs[0];
  if (!cpu::is_float_elem(in.elem) || !cpu::is_float_elem(out.elem) || !nvrtc::available(nullptr)) return std::nullopt;
  const std::string& op = ctx.node.op;
  Reduction r;
  r.combine = op == "sum" ? Combine::Sum : op == "mean" ? Combine::Mean : op == "amax" ? Combine::Max : Combine::Min;
  r.in_elem = in.elem;
  r.out_elem = out.elem;
  const Shape& shape = in.meta.shape;
  const std::vector<bool> reduced = ops::reduced_dims(ctx.node.attrs, static_cast<int64_t>(shape.size()));
  const std::vector<int64_t> strides = contiguous_strides(shape);
  for (size_t d = 0; d < shape.size(); ++d) (reduced[d] ? r.reduced : r.kept).add(shape[d], strides[d]);
  if (r.kept.count != out.numel()) return std::nullopt;
  // amax and amin of nothing are errors the reference reports; no output: nothing to do.
  if (r.reduced.count == 0 && (r.combine == Combine::Max || r.combine == Combine::Min)) return std::nullopt;
  return launch_of(ctx, reduction_source(r, in.numel()), (out.numel() + kWarpsPerBlock - 1) / kWarpsPerBlock, out, in);
}

// avg_pool2d over the last two dims: a thread per output element sums its window (clipped to the input; the
// divisor counts the padded window, the clipped one, or divisor_override), as the reference does.
std::string avg_pool_source(cpu::Elem in_elem, cpu::Elem out_elem, int64_t outputs, const std::array<int64_t, 2>& in,
                            const std::array<int64_t, 2>& out, const std::array<int64_t, 2>& kernel,
                            const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& pad,
                            bool count_include_pad, int64_t divisor_override) {
  std::ostringstream s;
  s << generated_prelude();
  s << "extern \"C\" __global__ void __launch_bounds__(" << kThreads << ") " << kReductionKernelName << "("
    << storage_type(out_elem) << "* out, const " << storage_type(in_elem) << "* in) {\n";
  s << "  const long long o = (long long)blockIdx.x * " << kThreads << " + threadIdx.x;\n";
  s << "  if (o >= " << outputs << "LL) return;\n";
  s << "  const long long ox = o % " << out[1] << ", oy = (o / " << out[1] << ") % " << out[0] << ", plane = o / "
    << out[0] * out[1] << ";\n";
  s << "  long long y0 = oy * " << stride[0] << " - " << pad[0] << ", x0 = ox * " << stride[1] << " - " << pad[1]
    << ";\n";
  s << "  long long y1 = min(y0 + " << kernel[0] << ", " << in[0] + pad[0] << "LL), x1 = min(x0 + " << kernel[1] << ", "
    << in[1] + pad[1] << "LL);\n";
  s << "  const long long padded = (y1 - y0) * (x1 - x0);\n";
  s << "  y0 = max(y0, 0LL), x0 = max(x0, 0LL), y1 = min(y1, " << in[0] << "LL), x1 = min(x1, " << in[1] << "LL);\n";
  s << "  const " << storage_type(in_elem) << "* window = in + plane * " << in[0] * in[1] << ";\n";
  s << "  float sum = 0.0f;\n";
  s << "  for (long long y = y0; y < y1; ++y)\n";
  s << "    for (long long x = x0; x < x1; ++x) sum += "
    << load_as_float(in_elem, "window[y * " + std::to_string(in[1]) + " + x]") << ";\n";
  s << "  const long long divisor = "
    << (divisor_override != 0 ? std::to_string(divisor_override) + "LL"
        : count_include_pad   ? std::string("padded")
                              : std::string("(y1 - y0) * (x1 - x0)"))
    << ";\n";
  s << "  const float value = y0 < y1 && x0 < x1 ? sum / (float)divisor : 0.0f;\n";
  s << "  out[o] = " << store_from_float(out_elem, "value") << ";\n";
  s << "}\n";
  return s.str();
}

std::optional<Launch> avg_pool_op(const OpContext& ctx) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
  const DeviceValue& x = ctx.inputs[0];
  const DeviceValue& y = ctx.outputs[0];
  const Shape& xs = x.meta.shape;
  const Shape& ys = y.meta.shape;
  if (!cpu::is_float_elem(x.elem) || !cpu::is_float_elem(y.elem) || xs.size() < 3 || ys.size() != xs.size() ||
      !nvrtc::available(nullptr))
    return std::nullopt;
  const Attrs& attrs = ctx.node.attrs;
  const std::optional<ops::PoolWindow> window = ops::pool_window(attrs, false);
  if (!window) return std::nullopt;
  const size_t r = xs.size();
  const std::array<int64_t, 2> in{xs[r - 2], xs[r - 1]}, out{ys[r - 2], ys[r - 1]};
  const int64_t divisor_override = attrs.is_none("divisor_override") ? 0 : attrs.get_int("divisor_override");
  return launch_of(ctx,
                   avg_pool_source(x.elem, y.elem, y.numel(), in, out, window->kernel, window->stride, window->pad,
                                   attrs.get_bool("count_include_pad", true), divisor_override),
                   (y.numel() + kThreads - 1) / kThreads, y, x);
}

}  // namespace

void add_generated_reduction_ops(std::map<std::string, OpFactory>& table) {
  for (const char* op : {"sum", "mean", "amax", "amin"}) table.emplace(op, reduction_op);
  table.emplace("avg_pool2d", avg_pool_op);
}

}  // namespace npusim::cuda
