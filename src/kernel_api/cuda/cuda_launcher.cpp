// CUDA kernels: NVRTC compiles the generated source for the device's architecture (a cubin, or PTX for the newest
// virtual architecture NVRTC knows when the device is newer), the driver loads it, and the launch copies the
// arguments to the device and the outputs back. The driver and NVRTC are opened at run time (dlopen), so a program
// built with CUDA starts on machines without a driver and reports why CUDA is unavailable, and a program that never
// compiles a CUDA kernel does not pay for loading NVRTC.
#ifdef NPUSIM_HAVE_CUDA

#include <cuda.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sstream>

#include "core/nvrtc_compiler.h"
#include "core/shared_library.h"
#include "kernel_api/kernel_cache.h"
#include "kernel_api/launchers.h"
#include "kernel_api/source_gen.h"
#include "npusim/error.h"

namespace npusim::kernels::detail {

namespace {

// The driver API entry points npusim uses, resolved from libcuda.so.1.
struct Driver {
  decltype(&::cuInit) init;
  decltype(&::cuDriverGetVersion) driver_version;
  decltype(&::cuDeviceGetCount) device_count;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDeviceGetName) device_name;
  decltype(&::cuDeviceGetAttribute) device_attribute;
  decltype(&::cuDevicePrimaryCtxRetain) retain_primary_context;
  decltype(&::cuCtxSetCurrent) set_current;
  decltype(&::cuCtxSynchronize) synchronize;
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuModuleGetFunction) module_function;
  decltype(&::cuModuleGetGlobal) module_global;
  decltype(&::cuFuncGetAttribute) function_attribute;
  decltype(&::cuFuncSetAttribute) set_function_attribute;
  decltype(&::cuLaunchKernel) launch;
  decltype(&::cuMemAlloc) allocate;
  decltype(&::cuMemFree) free;
  decltype(&::cuMemcpyHtoD) copy_to_device;
  decltype(&::cuMemcpyDtoH) copy_to_host;
  decltype(&::cuMemsetD8) memset;
  decltype(&::cuGetErrorName) error_name;
  decltype(&::cuGetErrorString) error_string;
};

std::string error_text(const Driver& driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  driver.error_name(result, &name);
  driver.error_string(result, &text);
  return std::string(name ? name : "CUDA error " + std::to_string(static_cast<int>(result))) + " (" +
         (text ? text : "no description") + ")";
}

// The device npusim launches on ($NPUSIM_CUDA_DEVICE, default 0), with its limits.
struct CudaDevice {
  Driver driver{};
  CUdevice device = 0;
  CUcontext context = nullptr;
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;
  int max_block[3] = {0, 0, 0};
  int max_shared_default = 0;  // per block without opting in
  int max_shared_optin = 0;    // per block at most
};

// Opens the driver and the device once; afterwards returns the device, or null with the reason.
const CudaDevice* open_device(std::string* reason) {
  static std::once_flag once;
  static CudaDevice device;
  static std::string problem;
  std::call_once(once, [] {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      problem = "no CUDA driver (libcuda.so.1 cannot be loaded: " + std::string(dlerror()) + ")";
      return;
    }
    Driver& d = device.driver;
    std::string missing;
    resolve_symbol(library, "cuInit", d.init, missing);
    resolve_symbol(library, "cuDriverGetVersion", d.driver_version, missing);
    resolve_symbol(library, "cuDeviceGetCount", d.device_count, missing);
    resolve_symbol(library, "cuDeviceGet", d.device_get, missing);
    resolve_symbol(library, "cuDeviceGetName", d.device_name, missing);
    resolve_symbol(library, "cuDeviceGetAttribute", d.device_attribute, missing);
    resolve_symbol(library, "cuDevicePrimaryCtxRetain", d.retain_primary_context, missing);
    resolve_symbol(library, "cuCtxSetCurrent", d.set_current, missing);
    resolve_symbol(library, "cuCtxSynchronize", d.synchronize, missing);
    resolve_symbol(library, "cuModuleLoadData", d.module_load, missing);
    resolve_symbol(library, "cuModuleUnload", d.module_unload, missing);
    resolve_symbol(library, "cuModuleGetFunction", d.module_function, missing);
    resolve_symbol(library, "cuModuleGetGlobal_v2", d.module_global, missing);
    resolve_symbol(library, "cuFuncGetAttribute", d.function_attribute, missing);
    resolve_symbol(library, "cuFuncSetAttribute", d.set_function_attribute, missing);
    resolve_symbol(library, "cuLaunchKernel", d.launch, missing);
    resolve_symbol(library, "cuMemAlloc_v2", d.allocate, missing);
    resolve_symbol(library, "cuMemFree_v2", d.free, missing);
    resolve_symbol(library, "cuMemcpyHtoD_v2", d.copy_to_device, missing);
    resolve_symbol(library, "cuMemcpyDtoH_v2", d.copy_to_host, missing);
    resolve_symbol(library, "cuMemsetD8_v2", d.memset, missing);
    resolve_symbol(library, "cuGetErrorName", d.error_name, missing);
    resolve_symbol(library, "cuGetErrorString", d.error_string, missing);
    if (!missing.empty()) {
      problem = "the CUDA driver lacks " + missing + " (driver too old?)";
      return;
    }
    auto failed = [&](CUresult result, const std::string& what) {
      if (result == CUDA_SUCCESS) return false;
      problem = what + " failed: " + error_text(d, result);
      return true;
    };
    if (failed(d.init(0), "cuInit")) return;
    int count = 0;
    if (failed(d.device_count(&count), "cuDeviceGetCount")) return;
    if (count == 0) {
      problem = "the CUDA driver sees no device";
      return;
    }
    if (const char* chosen = std::getenv("NPUSIM_CUDA_DEVICE"); chosen && *chosen) device.ordinal = std::atoi(chosen);
    if (device.ordinal < 0 || device.ordinal >= count) {
      problem = "NPUSIM_CUDA_DEVICE=" + std::to_string(device.ordinal) + " but there are " + std::to_string(count) +
                " devices";
      return;
    }
    if (failed(d.device_get(&device.device, device.ordinal), "cuDeviceGet")) return;
    char name[256] = {};
    d.device_name(name, sizeof name, device.device);
    device.name = name;
    const std::pair<CUdevice_attribute, int*> attributes[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &device.major},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &device.minor},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &device.max_block[0]},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, &device.max_block[1]},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, &device.max_block[2]},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, &device.max_shared_default},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &device.max_shared_optin},
    };
    for (const auto& [attribute, value] : attributes)
      if (failed(d.device_attribute(value, attribute, device.device), "cuDeviceGetAttribute")) return;
    if (failed(d.retain_primary_context(&device.context, device.device), "cuDevicePrimaryCtxRetain")) return;
  });
  if (!problem.empty()) {
    if (reason) *reason = problem;
    return nullptr;
  }
  return &device;
}

const CudaDevice& device_for(const Plan& plan) {
  std::string reason;
  const CudaDevice* device = open_device(&reason);
  if (!device) fail(plan.label() + ": CUDA is not available: " + reason);
  return *device;
}

void check(const CudaDevice& device, CUresult result, const Plan& plan, const std::string& what) {
  if (result != CUDA_SUCCESS) fail(plan.label() + ": " + what + " failed: " + error_text(device.driver, result));
}

// ---- compilation ----

// The folder holding cuda_fp16.h: $NPUSIM_CUDA_INCLUDE, the toolkit npusim was built with, $CUDA_HOME, $CUDA_PATH,
// /usr/local/cuda. Empty when none has it.
std::string fp16_include_folder() {
  std::vector<std::string> candidates;
  auto add_list = [&](const std::string& list) {
    std::stringstream stream(list);
    for (std::string folder; std::getline(stream, folder, ':');)
      if (!folder.empty()) candidates.push_back(folder);
  };
  if (const char* chosen = std::getenv("NPUSIM_CUDA_INCLUDE")) add_list(chosen);
  add_list(NPUSIM_CUDA_INCLUDE_PATH);
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(variable); home && *home) candidates.push_back(std::string(home) + "/include");
  candidates.push_back("/usr/local/cuda/include");
  for (const std::string& folder : candidates)
    if (std::filesystem::exists(std::filesystem::path(folder) / "cuda_fp16.h")) return folder;
  return "";
}

struct CudaModule {
  const Driver* driver = nullptr;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  CUdeviceptr assert_state = 0;
  GeneratedSource source;
  int max_threads = 0;    // asked of the compiled kernel
  int static_shared = 0;  // bytes of __shared__ the kernel declares itself
  ~CudaModule() {
    if (module) driver->module_unload(module);
  }
};

std::string compile(const Plan& plan, const GeneratedSource& source, const std::vector<std::string>& options,
                    bool cubin) {
  const nvrtc::Compiled compiled = nvrtc::compile(source.text, plan.source->name + ".cu", options, cubin, plan.label());
  if (!compiled.ok) fail(explain_compile_errors(plan, source, compiled.log));
  return compiled.image;
}

std::shared_ptr<CudaModule> load_module(const CudaDevice& device, const Plan& plan, const GeneratedSource& source,
                                        const std::string& image, std::string* problem) {
  const Driver& d = device.driver;
  auto module = std::make_shared<CudaModule>();
  module->driver = &d;
  module->source = source;
  CUresult result = d.module_load(&module->module, image.data());
  if (result == CUDA_SUCCESS) result = d.module_function(&module->function, module->module, "npusim_kernel");
  size_t assert_bytes = 0;
  if (result == CUDA_SUCCESS)
    result = d.module_global(&module->assert_state, &assert_bytes, module->module, "npusim_assert_state");
  if (result == CUDA_SUCCESS)
    result = d.function_attribute(&module->max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, module->function);
  if (result == CUDA_SUCCESS)
    result = d.function_attribute(&module->static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, module->function);
  if (result != CUDA_SUCCESS) {
    if (problem) *problem = error_text(d, result);
    return nullptr;
  }
  (void)plan;
  return module;
}

std::shared_ptr<CudaModule> build_module(const CudaDevice& device, const Plan& plan, const GeneratedSource& source,
                                         const std::string& include_folder) {
  const nvrtc::Target target = nvrtc::target_for(device.major, device.minor, plan.label());
  const std::string& architecture = target.architecture;
  const bool cubin = target.cubin;
  // Functions of the user's header need no __device__, as on the CPU.
  std::vector<std::string> options = {"--gpu-architecture=" + architecture, "-std=c++17",
                                      "--device-as-default-execution-space"};
  if (!include_folder.empty()) options.push_back("-I" + include_folder);
  std::string key_text = "cuda " + nvrtc::version_text(plan.label());
  for (const std::string& option : options) key_text += " " + option;
  key_text += "\n" + source.text;
  const std::string hash = hash_hex(key_text);
  const std::string key = "cuda" + std::to_string(device.ordinal) + ":" + hash;

  return std::static_pointer_cast<CudaModule>(find_or_load(key, [&]() -> std::shared_ptr<void> {
    const std::filesystem::path base = cache_folder() / (plan.source->name + "-" + hash);
    const std::filesystem::path source_path = base.string() + ".cu";
    const std::filesystem::path image_path = base.string() + (cubin ? ".cubin" : ".ptx");
    if (read_file(source_path) == source.text) {
      if (auto image = read_file(image_path)) {
        if (auto module = load_module(device, plan, source, *image, nullptr)) {
          count(CacheEvent::DiskHit);
          return module;
        }
      }
    }
    const std::string image = compile(plan, source, options, cubin);
    write_file_atomically(image_path, image);
    write_file_atomically(source_path, source.text);
    std::string problem;
    auto module = load_module(device, plan, source, image, &problem);
    if (!module) fail(plan.label() + ": cannot load the compiled kernel for " + architecture + ": " + problem);
    count(CacheEvent::Compiled);
    return module;
  }));
}

// ---- launch ----

class DeviceBuffer {
 public:
  DeviceBuffer(const CudaDevice& device, const Plan& plan, size_t bytes) : driver_(&device.driver) {
    if (bytes > 0)
      check(device, driver_->allocate(&pointer_, bytes), plan, "cuMemAlloc of " + std::to_string(bytes) + " bytes");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (pointer_) driver_->free(pointer_);
  }
  CUdeviceptr get() const { return pointer_; }

 private:
  const Driver* driver_;
  CUdeviceptr pointer_ = 0;
};

void check_dtypes(const CudaDevice& device, const Plan& plan) {
  const int capability = device.major * 10 + device.minor;
  auto refuse = [&](DType dtype, int needed) {
    fail(plan.label() + ": dtype " + std::string(dtype_name(dtype)) + " is not supported on " + device.name +
         " (compute capability " + std::to_string(device.major) + "." + std::to_string(device.minor) + "; it needs " +
         std::to_string(needed / 10) + "." + std::to_string(needed % 10) + ")");
  };
  if (plan.uses_dtype(DType::BFloat16) && capability < 80) refuse(DType::BFloat16, 80);
  if (plan.uses_dtype(DType::Float16) && capability < 53) refuse(DType::Float16, 53);
  if (plan.source->atomic_outputs && capability < 60)
    for (const Param& param : plan.params)
      if (param.output && param.dtype == DType::Float64) refuse(DType::Float64, 60);
}

void check_geometry(const CudaDevice& device, const CudaModule& module, const Plan& plan) {
  const int64_t group[3] = {plan.threadgroup.x, plan.threadgroup.y, plan.threadgroup.z};
  const int64_t threads = plan.threads_per_threadgroup();
  if (threads > module.max_threads)
    fail(plan.label() + ": a threadgroup of " + std::to_string(threads) +
         " threads exceeds the compiled kernel's limit of " + std::to_string(module.max_threads) +
         " threads per threadgroup on " + device.name);
  for (int d = 0; d < 3; ++d)
    if (group[d] > device.max_block[d])
      fail(plan.label() + ": threadgroup dimension " + "xyz"[d] + " of " + std::to_string(group[d]) +
           " threads exceeds the device limit of " + std::to_string(device.max_block[d]));
  const int64_t shared = plan.shared_memory_bytes + module.static_shared;
  if (shared > device.max_shared_optin)
    fail(plan.label() + ": " + std::to_string(plan.shared_memory_bytes) + " bytes of shared memory" +
         (module.static_shared ? " (plus " + std::to_string(module.static_shared) + " the kernel declares)" : "") +
         " exceed the device limit of " + std::to_string(device.max_shared_optin) + " bytes per threadgroup on " +
         device.name);
}

}  // namespace

bool cuda_usable(std::string* reason) { return open_device(reason) != nullptr; }

std::string cuda_generated_source(const Plan& plan) {
  return generate_cuda_source(plan, !fp16_include_folder().empty()).text;
}

void launch_cuda(const Plan& plan, std::vector<Tensor>& tensors, const ScalarBytes& scalars) {
  const CudaDevice& device = device_for(plan);
  const Driver& d = device.driver;
  check_dtypes(device, plan);
  check(device, d.set_current(device.context), plan, "cuCtxSetCurrent");

  const std::string include_folder = fp16_include_folder();
  if (include_folder.empty() && needs_fp16_types(plan))
    fail(plan.label() +
         ": half and bfloat16 need cuda_fp16.h, which is not found (set NPUSIM_CUDA_INCLUDE to the "
         "CUDA toolkit's include folder)");
  const GeneratedSource source = generate_cuda_source(plan, !include_folder.empty());
  if (plan.verbose)
    std::cerr << "--- " << plan.label() << ": generated source ---\n"
              << source.text << "--- end of " << plan.label() << " ---\n";
  const std::shared_ptr<CudaModule> module = build_module(device, plan, source, include_folder);
  check_geometry(device, *module, plan);
  if (plan.shared_memory_bytes > device.max_shared_default - module->static_shared)
    check(device,
          d.set_function_attribute(module->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   static_cast<int>(plan.shared_memory_bytes)),
          plan, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");

  // Arguments and outputs (already initialized or poisoned on the host) go to the device.
  std::vector<std::unique_ptr<DeviceBuffer>> buffers(plan.params.size());
  std::vector<void*> data(plan.params.size(), nullptr);
  for (size_t p = 0; p < plan.params.size(); ++p) {
    if (plan.params[p].scalar) continue;
    const Tensor& tensor = tensors[p];
    buffers[p] = std::make_unique<DeviceBuffer>(device, plan, tensor.nbytes());
    data[p] = reinterpret_cast<void*>(buffers[p]->get());
    if (tensor.nbytes() > 0)
      check(device, d.copy_to_device(buffers[p]->get(), tensor.bytes(), tensor.nbytes()), plan,
            "copying '" + plan.params[p].name + "' to the device");
  }
  SlotStorage slots;
  fill_slots(plan, std::move(data), scalars, slots);
  struct {
    unsigned x, y, z;
  } grid = {static_cast<unsigned>(plan.grid.x), static_cast<unsigned>(plan.grid.y), static_cast<unsigned>(plan.grid.z)};
  std::vector<void*> parameters = slots.pointers;
  parameters.push_back(&grid);
  check(device, d.memset(module->assert_state, 0, sizeof(unsigned) * 5), plan, "clearing the kernel_assert record");

  const std::string geometry = " (grid " + std::to_string(plan.grid.x) + "x" + std::to_string(plan.grid.y) + "x" +
                               std::to_string(plan.grid.z) + " threads in " + std::to_string(plan.blocks.x) + "x" +
                               std::to_string(plan.blocks.y) + "x" + std::to_string(plan.blocks.z) +
                               " threadgroups of " + std::to_string(plan.threadgroup.x) + "x" +
                               std::to_string(plan.threadgroup.y) + "x" + std::to_string(plan.threadgroup.z) + ")";
  check(device,
        d.launch(module->function, static_cast<unsigned>(plan.blocks.x), static_cast<unsigned>(plan.blocks.y),
                 static_cast<unsigned>(plan.blocks.z), static_cast<unsigned>(plan.threadgroup.x),
                 static_cast<unsigned>(plan.threadgroup.y), static_cast<unsigned>(plan.threadgroup.z),
                 static_cast<unsigned>(plan.shared_memory_bytes), nullptr, parameters.data(), nullptr),
        plan, "the launch" + geometry);
  const CUresult finished = d.synchronize();
  if (finished != CUDA_SUCCESS)
    fail(plan.label() + ": the kernel failed while running (reported at synchronization): " + error_text(d, finished) +
         "; the CUDA context cannot be used again in this process");

  unsigned record[5] = {};
  check(device, d.copy_to_host(record, module->assert_state, sizeof record), plan, "reading the kernel_assert record");
  if (record[0] != 0) {
    const int line = static_cast<int>(record[1]);
    fail(plan.label() + ": kernel_assert failed at " + module->source.describe_line(line) + " in thread (" +
         std::to_string(record[2]) + ", " + std::to_string(record[3]) + ", " + std::to_string(record[4]) +
         "):\n      " + module->source.line_text(line));
  }
  for (size_t p = 0; p < plan.params.size(); ++p) {
    if (!plan.params[p].output || tensors[p].nbytes() == 0) continue;
    check(device, d.copy_to_host(tensors[p].mutable_bytes(), buffers[p]->get(), tensors[p].nbytes()), plan,
          "copying '" + plan.params[p].name + "' back from the device");
  }
}

}  // namespace npusim::kernels::detail

#endif  // NPUSIM_HAVE_CUDA
