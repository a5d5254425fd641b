#pragma once
// NVRTC, opened at run time (dlopen) the first time a CUDA kernel is compiled from source: the kernel API's CUDA
// launcher and the CUDA backend's generated kernels both compile through here. Only built with CUDA.
#ifdef NPUSIM_HAVE_CUDA

#include <string>
#include <vector>

namespace npusim::nvrtc {

// What to compile for a device of compute capability major.minor: its own architecture (a cubin) when NVRTC knows
// it, else the newest virtual architecture NVRTC knows (PTX, which the driver compiles on loading).
struct Target {
  std::string architecture;  // "sm_90" or "compute_90"
  bool cubin = false;
};

struct Compiled {
  bool ok = false;
  std::string image;  // the cubin or PTX when ok
  std::string log;    // NVRTC's log (its error text when the log is empty and compiling failed)
};

// Whether NVRTC can be loaded; otherwise false with the reason in `problem`.
bool available(std::string* problem);
// These throw npusim::Error starting with `who` when NVRTC cannot be loaded.
Target target_for(int major, int minor, const std::string& who);
// "NVRTC 13.0", for cache keys and messages.
std::string version_text(const std::string& who);
Compiled compile(const std::string& source, const std::string& file_name, const std::vector<std::string>& options,
                 bool cubin, const std::string& who);

}  // namespace npusim::nvrtc

#endif  // NPUSIM_HAVE_CUDA
