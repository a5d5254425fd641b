#include <cstdio>
#include <filesystem>

#include "cli_args.h"
#include "commands.h"
#include "kernel_api/kernel_spec_json.h"
#include "npusim/kernel_api.h"
#include "runtime/npy.h"

namespace npusim::cli {

namespace {

const std::vector<OptionSpec> kKernelOptions = {
    {"device", true, "cpu or cuda: overrides the spec's device"},
    {"verbose", false, "print the full generated source before compiling"},
    {"print-source", false, "print the generated source and exit without compiling"},
    {"save", true, "DIR: write each output to DIR/NAME.npy"},
    {"limit", true, "N: print at most N values of each output (default 32)"},
    {"help", false, "show this help"},
};

constexpr const char* kKernelUsage = R"(usage: npusim kernel run SPEC.json [options]

Compiles the kernel a JSON spec describes (for the CPU with the system C++ compiler, or for CUDA with NVRTC),
launches it once on the spec's arguments and prints its outputs. docs/kernel_api.md describes the spec.
)";

void print_output(const std::string& name, const Tensor& tensor, int64_t limit) {
  std::printf("%s: %s %s\n ", name.c_str(), std::string(dtype_name(tensor.dtype())).c_str(),
              shape_string(tensor.shape()).c_str());
  const int64_t shown = std::min(limit, tensor.numel());
  for (int64_t i = 0; i < shown; ++i) std::printf(" %.9g", tensor.element_as_double(i));
  if (shown < tensor.numel()) std::printf(" ... (%lld more)", static_cast<long long>(tensor.numel() - shown));
  std::printf("\n");
}

}  // namespace

int kernel_command(const std::vector<std::string>& argv) {
  const Args args("kernel", kKernelOptions, argv);
  if (args.flag("help")) {
    std::printf("%s\noptions:\n%s", kKernelUsage, args.usage().c_str());
    return 0;
  }
  const std::vector<std::string>& positionals = args.positionals();
  if (positionals.size() != 2 || positionals[0] != "run") {
    std::fprintf(stderr, "%s\noptions:\n%s", kKernelUsage, args.usage().c_str());
    return 2;
  }
  kernels::KernelSpec spec = kernels::read_kernel_spec(positionals[1]);
  if (auto device = args.value("device")) {
    const auto parsed = kernels::parse_device(*device);
    if (!parsed) fail("npusim kernel: unknown device '" + *device + "' (cpu or cuda)");
    spec.config.device = *parsed;
  }
  if (args.flag("verbose")) spec.config.verbose = true;
  const int64_t limit = args.integer("limit", 32, 0, int64_t{1} << 40);
  const kernels::Kernel kernel(spec.source);
  if (args.flag("print-source")) {
    std::fputs(kernel.generated_source(spec.arguments, spec.config).c_str(), stdout);
    return 0;
  }
  const std::vector<Tensor> outputs = kernel(spec.arguments, spec.config);
  const auto save = args.value("save");
  if (save) std::filesystem::create_directories(*save);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& name = spec.source.outputs[i];
    print_output(name, outputs[i], limit);
    if (save) write_npy((std::filesystem::path(*save) / (name + ".npy")).string(), outputs[i]);
  }
  return 0;
}

}  // namespace npusim::cli
