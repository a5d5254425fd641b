#pragma once
// A kernel and one launch of it described in JSON (the input of `npusim kernel run SPEC.json`):
//
//   {"name": "scale", "inputs": ["x", "factor"], "outputs": ["y"],
//    "source": "y[thread_position_in_grid.x] = x[thread_position_in_grid.x] * factor;",  (or a list of lines)
//    "header": "...", "atomic_outputs": false, "max_threads_per_threadgroup": 0,
//    "arguments": {"x": {"dtype": "float32", "shape": [4], "data": [1, 2, 3, 4]},   (or "data": 0.5 for all)
//                  "w": {"npy": "w.npy"},                                         (relative to the spec's folder)
//                  "factor": {"scalar": 2.5, "dtype": "float32"}},
//    "output_specs": {"y": {"shape": [4], "dtype": "float32"}},
//    "grid": [4, 1, 1] or "blocks": [1, 1, 1], "threadgroup": [256, 1, 1], "shared_memory_bytes": 0,
//    "init_value": 0, "template": {"T": "float32", "N": 4, "FAST": true}, "device": "cpu", "verbose": false}
//
// Unknown keys and wrong types are errors naming the file and the key.
#include <map>
#include <string>

#include "npusim/kernel_api.h"

namespace npusim::kernels {

struct KernelSpec {
  KernelSource source;
  std::map<std::string, Argument> arguments;
  LaunchConfig config;
};

KernelSpec parse_kernel_spec(const std::string& text, const std::string& source_name, const std::string& base_folder);
KernelSpec read_kernel_spec(const std::string& path);

}  // namespace npusim::kernels
