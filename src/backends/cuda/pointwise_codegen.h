#pragma once
// CUDA C++ source for one pointwise kernel: inputs read through broadcast strides, a list of unary and binary steps
// computed in fp32, one output stored contiguously. Shapes, strides and scalars are baked into the source, so NVRTC
// turns index arithmetic into multiplications by constants. Contiguous, aligned operands are read and written 16
// bytes at a time.
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/storage.h"
#include "npusim/graph.h"

namespace npusim::cuda {

inline constexpr const char* kPointwiseKernelName = "npusim_pointwise";
inline constexpr int kPointwiseThreads = 256;

// An operand (float storage, or bool for a mask): its storage and, per dim of the kernel's shape, its element strides
// (0 where it broadcasts).
struct PointwiseInput {
  cpu::Elem elem = cpu::Elem::F32;
  std::vector<int64_t> strides;
};

// Select: a != 0 ? b : c (a a mask read as 0 or 1).
enum class PointwiseBinary { Add, Sub, Mul, Div, Select };

// A number, a unary step on value `a`, or an op on values `a` and `b` (and `c` for Select). Values 0 .. inputs-1 are
// the inputs; step s makes value inputs + s.
struct PointwiseStep {
  std::optional<float> constant;
  std::optional<cpu::UnaryStep> unary;
  PointwiseBinary binary = PointwiseBinary::Add;
  float alpha = 1.0f;  // add and sub: a +- alpha * b
  int a = 0, b = -1, c = -1;
};

struct PointwiseKernel {
  Shape shape;
  cpu::Elem out_elem = cpu::Elem::F32;
  std::vector<PointwiseInput> inputs;
  std::vector<PointwiseStep> steps;  // the last step's value is the output
  // Elements per thread: 1, or 4 (8 when every operand is 16-bit) where every operand is contiguous and its
  // address aligned to its share of 16 bytes (vector_lanes).
  int lanes = 1;
};

// Pieces every generated source shares: fp16/bf16 conversions (no headers needed) and helpers, the C type an
// element is stored as, and expressions reading a stored element as float and storing a float.
const char* generated_prelude();
const char* storage_type(cpu::Elem elem);
std::string load_as_float(cpu::Elem elem, const std::string& raw);
std::string store_from_float(cpu::Elem elem, const std::string& value);

// The lanes `kernel` can use with its operands at these addresses (the output's first).
int vector_lanes(const PointwiseKernel& kernel, const std::vector<const void*>& addresses);
// The kernel's source: extern "C" npusim_pointwise(out, in0, in1, ...), kPointwiseThreads threads a block, each
// `lanes` consecutive elements.
std::string pointwise_source(const PointwiseKernel& kernel);
// Blocks to launch for the kernel.
int64_t pointwise_blocks(const PointwiseKernel& kernel);

}  // namespace npusim::cuda
