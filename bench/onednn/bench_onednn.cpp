// oneDNN (Debian's libdnnl) against npusim's CPU backend, convolution by convolution of an exported CNN, fp32:
// npusim's times come from profiled runs of the compiled program (each kernel timed in place, in the model), oneDNN's
// from its convolution primitive on the same shapes with the same epilogue (bias; the residual as a sum post-op;
// ReLU), once with the layouts it prefers (blocked; the reorders into them left out, as if the whole network stayed
// in them: oneDNN's best case) and once on plain NCHW tensors (what it gives as a drop-in for one convolution).
// Each figure is the minimum over the runs. oneDNN's threads are OpenMP's (OMP_NUM_THREADS, or --threads).
//
// usage: bench_onednn GRAPH.json [--threads N] [--iters N]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "npusim/error.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "runtime/random_fill.h"
#include "runtime/weight_transforms.h"

namespace {

using Clock = std::chrono::steady_clock;
using dnnl::memory;

struct ConvShape {
  std::string node;
  memory::dim n, c, h, w, k, r, s, oh, ow, groups;
  std::vector<int64_t> stride, padding, dilation;
  bool bias = false, residual = false, relu = false;
};

std::vector<int64_t> pair_of(const std::vector<int64_t>& values) {
  return values.size() == 1 ? std::vector<int64_t>{values[0], values[0]} : values;
}

// The convolutions of the compiled graph, in order.
std::vector<ConvShape> convolutions(const npusim::Graph& graph) {
  std::vector<ConvShape> shapes;
  for (const npusim::Node& node : graph.nodes) {
    if (node.op != "conv2d" && node.op != "fused_conv2d") continue;
    const npusim::Shape& x = graph.value(node.inputs[0]).meta.shape;
    const npusim::Shape& w = graph.value(node.inputs[1]).meta.shape;
    const npusim::Shape& y = graph.value(node.outputs[0]).meta.shape;
    if (x.size() != 4 || w.size() != 4 || y.size() != 4) continue;
    ConvShape c{node.name, x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], node.attrs.get_int("groups", 1)};
    c.stride = pair_of(node.attrs.get_ints("stride", {1}));
    c.padding = pair_of(node.attrs.get_ints("padding", {0}));
    c.dilation = pair_of(node.attrs.get_ints("dilation", {1}));
    const bool fused = node.op == "fused_conv2d";
    c.bias = fused ? node.attrs.get_bool("has_bias", false) : node.inputs.size() == 3;
    c.residual = fused && node.attrs.get_bool("has_residual", false);
    c.relu = fused && node.attrs.has("activation") && node.attrs.get_string("activation") == "relu";
    shapes.push_back(c);
  }
  return shapes;
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// oneDNN's time for one convolution: the minimum over `iters` runs after a warm-up.
double onednn_ms(const ConvShape& c, bool blocked, int iters, const dnnl::engine& engine, dnnl::stream& stream) {
  const memory::dims src{c.n, c.c, c.h, c.w}, dst{c.n, c.k, c.oh, c.ow}, bias{c.k};
  const memory::dims weights = c.groups == 1 ? memory::dims{c.k, c.c, c.r, c.s}
                                             : memory::dims{c.groups, c.k / c.groups, c.c / c.groups, c.r, c.s};
  const memory::dims strides{c.stride[0], c.stride[1]}, padding{c.padding[0], c.padding[1]};
  const memory::dims dilation{c.dilation[0] - 1, c.dilation[1] - 1};
  const auto any = memory::format_tag::any;
  const auto f32 = memory::data_type::f32;
  const memory::desc src_md(src, f32, blocked ? any : memory::format_tag::nchw);
  const memory::desc dst_md(dst, f32, blocked ? any : memory::format_tag::nchw);
  const memory::desc weights_md(weights, f32,
                                blocked ? any : (c.groups == 1 ? memory::format_tag::oihw : memory::format_tag::goihw));
  const memory::desc bias_md(bias, f32, memory::format_tag::x);
  dnnl::post_ops ops;
  if (c.residual) ops.append_sum(1.0f);
  if (c.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const auto desc =
      c.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                               src_md, weights_md, bias_md, dst_md, strides, dilation, padding, padding)
             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                               src_md, weights_md, dst_md, strides, dilation, padding, padding);
  const dnnl::convolution_forward::primitive_desc pd(desc, attr, engine);
  memory src_mem(pd.src_desc(), engine), weights_mem(pd.weights_desc(), engine), dst_mem(pd.dst_desc(), engine);
  memory bias_mem(bias_md, engine);
  for (memory* m : {&src_mem, &weights_mem, &dst_mem, &bias_mem}) {
    auto* values = static_cast<float*>(m->get_data_handle());
    std::fill(values, values + m->get_desc().get_size() / sizeof(float), 0.01f);
  }
  const dnnl::convolution_forward conv(pd);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weights_mem}, {DNNL_ARG_DST, dst_mem}};
  if (c.bias) args.insert({DNNL_ARG_BIAS, bias_mem});
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < iters + 3; ++i) {
    const auto start = Clock::now();
    conv.execute(stream, args);
    stream.wait();
    if (i >= 3) best = std::min(best, ms_since(start));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_onednn GRAPH.json [--threads N] [--iters N]\n");
    return 2;
  }
  int threads = 0, iters = 20;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "bench_onednn: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  try {
    const npusim::Program program = npusim::compiler::compile_graph(npusim::read_torch_ir(argv[1]), {});
    std::vector<std::pair<npusim::ValueId, npusim::Tensor>> weights = npusim::random_weights(program.graph, 7);
    npusim::add_derived_weights(program.graph, weights);
    auto prepared = npusim::cpu::CpuBackend({.threads = threads}).prepare(program, weights);
    std::map<std::string, npusim::Tensor> inputs;
    for (npusim::ValueId id : program.graph.inputs)
      inputs.emplace(program.graph.value(id).name, npusim::random_input(program.graph.value(id), 5));
    prepared->set_profiling(true);
    std::map<std::string, double> ours;
    for (int i = 0; i < iters + 2; ++i) {
      prepared->run(inputs);
      if (i < 2) continue;
      for (const npusim::KernelTiming& t : prepared->last_timings()) {
        auto [it, added] = ours.emplace(t.node, t.milliseconds);
        if (!added) it->second = std::min(it->second, t.milliseconds);
      }
    }

    if (threads > 0) omp_set_num_threads(threads);
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    double total_ours = 0.0, total_blocked = 0.0, total_plain = 0.0;
    std::printf("%-10s %-34s %9s %9s %9s\n", "node", "shape (N,C,H,W -> K,R,S / stride)", "npusim", "dnnl-blk",
                "dnnl-nchw");
    for (const ConvShape& c : convolutions(program.graph)) {
      const auto found = ours.find(c.node);
      if (found == ours.end()) continue;  // fused into another kernel
      const double blocked = onednn_ms(c, true, iters, engine, stream);
      const double plain = onednn_ms(c, false, iters, engine, stream);
      total_ours += found->second;
      total_blocked += blocked;
      total_plain += plain;
      const std::string shape = std::to_string(c.n) + "," + std::to_string(c.c) + "," + std::to_string(c.h) + "," +
                                std::to_string(c.w) + " -> " + std::to_string(c.k) + "," + std::to_string(c.r) + "," +
                                std::to_string(c.s) + " / " + std::to_string(c.stride[0]);
      std::printf("%-10s %-34s %9.3f %9.3f %9.3f\n", c.node.c_str(), shape.c_str(), found->second, blocked, plain);
    }
    std::printf("%-10s %-34s %9.3f %9.3f %9.3f  (ms, minimum of %d runs; threads: npusim %d, oneDNN %d)\n", "total",
                "convolutions", total_ours, total_blocked, total_plain, iters, threads, omp_get_max_threads());
  } catch (const npusim::Error& error) {
    std::fprintf(stderr, "bench_onednn: %s\n", error.what());
    return 1;
  } catch (const dnnl::error& error) {
    std::fprintf(stderr, "bench_onednn: oneDNN: %s\n", error.what());
    return 1;
  }
  return 0;
}
