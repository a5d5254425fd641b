#ifdef NPUSIM_HAVE_CUDA

#include "core/nvrtc_compiler.h"

#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <mutex>

#include "core/shared_library.h"
#include "npusim/error.h"

namespace npusim::nvrtc {

namespace {

// The NVRTC entry points npusim uses, resolved once.
struct Api {
  decltype(&::nvrtcVersion) version;
  decltype(&::nvrtcGetNumSupportedArchs) architecture_count;
  decltype(&::nvrtcGetSupportedArchs) architectures;
  decltype(&::nvrtcCreateProgram) create;
  decltype(&::nvrtcCompileProgram) compile;
  decltype(&::nvrtcGetProgramLogSize) log_size;
  decltype(&::nvrtcGetProgramLog) log;
  decltype(&::nvrtcGetCUBINSize) cubin_size;
  decltype(&::nvrtcGetCUBIN) cubin;
  decltype(&::nvrtcGetPTXSize) ptx_size;
  decltype(&::nvrtcGetPTX) ptx;
  decltype(&::nvrtcDestroyProgram) destroy;
  decltype(&::nvrtcGetErrorString) error_string;
};

const Api* load(std::string* problem) {
  static std::once_flag once;
  static Api api;
  static std::string failure;
  std::call_once(once, [] {
    // The NVRTC of the toolkit npusim was built with (its headers declare these entry points), else any.
    const std::string versioned = "libnvrtc.so." + std::to_string(CUDA_VERSION / 1000);
    void* library = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) library = dlopen("libnvrtc.so", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      failure = "NVRTC cannot be loaded: " + std::string(dlerror());
      return;
    }
    std::string missing;
    resolve_symbol(library, "nvrtcVersion", api.version, missing);
    resolve_symbol(library, "nvrtcGetNumSupportedArchs", api.architecture_count, missing);
    resolve_symbol(library, "nvrtcGetSupportedArchs", api.architectures, missing);
    resolve_symbol(library, "nvrtcCreateProgram", api.create, missing);
    resolve_symbol(library, "nvrtcCompileProgram", api.compile, missing);
    resolve_symbol(library, "nvrtcGetProgramLogSize", api.log_size, missing);
    resolve_symbol(library, "nvrtcGetProgramLog", api.log, missing);
    resolve_symbol(library, "nvrtcGetCUBINSize", api.cubin_size, missing);
    resolve_symbol(library, "nvrtcGetCUBIN", api.cubin, missing);
    resolve_symbol(library, "nvrtcGetPTXSize", api.ptx_size, missing);
    resolve_symbol(library, "nvrtcGetPTX", api.ptx, missing);
    resolve_symbol(library, "nvrtcDestroyProgram", api.destroy, missing);
    resolve_symbol(library, "nvrtcGetErrorString", api.error_string, missing);
    if (!missing.empty()) failure = "NVRTC lacks " + missing;
  });
  if (!failure.empty()) {
    if (problem) *problem = failure;
    return nullptr;
  }
  return &api;
}

const Api& api_for(const std::string& who) {
  std::string problem;
  const Api* api = load(&problem);
  if (!api) fail(who + ": CUDA kernels cannot be compiled: " + problem);
  return *api;
}

}  // namespace

bool available(std::string* problem) { return load(problem) != nullptr; }

Target target_for(int major, int minor, const std::string& who) {
  const Api& api = api_for(who);
  int count = 0;
  api.architecture_count(&count);
  std::vector<int> architectures(static_cast<size_t>(count > 0 ? count : 0));
  if (count > 0) api.architectures(architectures.data());
  const int wanted = major * 10 + minor;
  int best = 0;
  for (int architecture : architectures) {
    if (architecture == wanted) return {"sm_" + std::to_string(wanted), true};
    if (architecture < wanted) best = std::max(best, architecture);
  }
  return {"compute_" + std::to_string(best > 0 ? best : wanted), false};
}

std::string version_text(const std::string& who) {
  const Api& api = api_for(who);
  int major = 0, minor = 0;
  api.version(&major, &minor);
  return "NVRTC " + std::to_string(major) + "." + std::to_string(minor);
}

Compiled compile(const std::string& source, const std::string& file_name, const std::vector<std::string>& options,
                 bool cubin, const std::string& who) {
  const Api& api = api_for(who);
  nvrtcProgram program = nullptr;
  nvrtcResult result = api.create(&program, source.c_str(), file_name.c_str(), 0, nullptr, nullptr);
  if (result != NVRTC_SUCCESS) fail(who + ": nvrtcCreateProgram failed: " + api.error_string(result));
  std::vector<const char*> arguments;
  for (const std::string& option : options) arguments.push_back(option.c_str());
  Compiled compiled;
  result = api.compile(program, static_cast<int>(arguments.size()), arguments.data());
  size_t log_size = 0;
  api.log_size(program, &log_size);
  compiled.log.assign(log_size, '\0');
  if (log_size > 0) api.log(program, compiled.log.data());
  while (!compiled.log.empty() && compiled.log.back() == '\0') compiled.log.pop_back();
  compiled.ok = result == NVRTC_SUCCESS;
  if (!compiled.ok) {
    if (compiled.log.empty()) compiled.log = api.error_string(result);
    api.destroy(&program);
    return compiled;
  }
  size_t size = 0;
  nvrtcResult fetched = NVRTC_SUCCESS;
  if (cubin) {
    fetched = api.cubin_size(program, &size);
    compiled.image.resize(size);
    if (fetched == NVRTC_SUCCESS) fetched = api.cubin(program, compiled.image.data());
  } else {
    fetched = api.ptx_size(program, &size);
    compiled.image.resize(size);
    if (fetched == NVRTC_SUCCESS) fetched = api.ptx(program, compiled.image.data());
  }
  api.destroy(&program);
  if (fetched != NVRTC_SUCCESS)
    fail(who + ": reading the compiled " + (cubin ? "cubin" : "PTX") + " failed: " + api.error_string(fetched));
  return compiled;
}

}  // namespace npusim::nvrtc

#endif  // NPUSIM_HAVE_CUDA
