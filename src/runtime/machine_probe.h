#pragma once
// What this machine can do at best, measured in well under a second: streamed memory read bandwidth and fp32
// FMA peak, on one thread and on N. `npusim probe` prints it; `npusim bench` divides by it for efficiency.
#include <string>

#include "core/cpu_features.h"

namespace npusim {

struct ProbeOptions {
  int threads = 0;                          // the "N threads" measurements; 0: one per hardware thread
  size_t buffer_bytes = size_t{128} << 20;  // read buffer: well beyond the last-level cache
  int repeats = 5;                          // best of this many passes per measurement
};

struct MachineProbe {
  std::string cpu_name;  // "AMD EPYC 7B13" and the like, from /proc/cpuinfo where there is one
  int hardware_threads = 1;
  int threads = 1;  // N of the multi-threaded measurements
  CpuFeatures features;
  std::string fma_kernel;  // "avx512f", "avx2+fma" or "scalar"
  double read_gbps_1 = 0;  // GB/s (1e9 bytes per second)
  double read_gbps_n = 0;
  double fma_gflops_1 = 0;  // fp32, a fused multiply-add counted as 2 FLOPs
  double fma_gflops_n = 0;
  double bf16_dot_gflops_1 = 0;  // bf16 pair products (AVX-512 BF16), 0 where the CPU has none
  double bf16_dot_gflops_n = 0;
  double probe_ms = 0;  // how long measuring took
};

MachineProbe probe_machine(const ProbeOptions& options = {});

// The probe as one JSON object on one line, and as a few lines for people.
std::string probe_json(const MachineProbe& probe);
std::string format_probe(const MachineProbe& probe);

}  // namespace npusim
