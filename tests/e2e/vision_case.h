#pragma once
// A torchvision test case written by make_resnet_case.py (DIR/weights.safetensors, inputs.safetensors with `x`,
// reference.safetensors with PyTorch's logits) run as a compiled program on the CPU backend.
#include <string>

#include "compiler/compile.h"
#include "runtime/backend.h"
#include "runtime/compare.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"

namespace npusim::test {

// `graph` compiled with activations and weights stored as `storage`, run on the case in `dir`; its single output
// compared with the reference (top-5).
inline Comparison compiled_on_cpu_against_reference(const Graph& graph, DType storage, const std::string& dir) {
  compiler::CompileOptions options;
  options.compute_dtype = storage;
  const Program program = compiler::compile_graph(graph, options);
  WeightStore store;
  store.add_file(dir + "/weights.safetensors");
  auto prepared = make_backend("cpu")->prepare(program, store.bind(program.graph).tensors);
  const SafetensorsFile inputs = SafetensorsFile::open(dir + "/inputs.safetensors");
  const SafetensorsFile reference = SafetensorsFile::open(dir + "/reference.safetensors");
  const NamedTensors outputs = prepared->run({{"x", inputs.get("x")}});
  EXPECT_EQ(outputs.size(), 1u);
  return compare_tensors(outputs.at(0).second, reference.get(outputs.at(0).first), 5);
}

}  // namespace npusim::test
