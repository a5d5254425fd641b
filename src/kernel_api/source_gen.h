#pragma once
// The full source compiled for a launch: a fixed preamble (types, positions, barrier, atomics, kernel_assert),
// the template parameters, the user's header, and the body inside the kernel function. The body's lines are
// copied unchanged, so that a line of the generated source maps back to a line of the body.
#include <string>

#include "kernel_api/kernel_plan.h"

namespace npusim::kernels::detail {

// The ABI between the CPU launcher and a compiled CPU kernel, as C structs. The generated source embeds the same
// text, so both sides always agree; kCpuAbiVersion changes whenever the entry points change.
#define NPUSIM_CPU_ABI_STRUCTS                                                        \
  struct npusim_cpu_launch {                                                          \
    void* const* params;                                                              \
    unsigned grid[3];                                                                 \
    unsigned group[3];                                                                \
    unsigned groups[3];                                                               \
    void (*barrier)(void* team);                                                      \
    void (*assert_failed)(void* state, int line, unsigned x, unsigned y, unsigned z); \
    void* assert_state;                                                               \
  };                                                                                  \
  struct npusim_cpu_call {                                                            \
    unsigned group[3];                                                                \
    unsigned first_thread;                                                            \
    unsigned thread_count;                                                            \
    unsigned char* shared_memory;                                                     \
    void* team;                                                                       \
  };
NPUSIM_CPU_ABI_STRUCTS
constexpr int kCpuAbiVersion = 1;

struct GeneratedSource {
  std::string text;
  int header_first_line = 0;  // 1-based; header_lines == 0 when there is no header
  int header_lines = 0;
  int body_first_line = 0;
  int body_lines = 0;

  // "body line 3", "header line 2" or "generated line 40", for a 1-based line of `text`.
  std::string describe_line(int line) const;
  std::string line_text(int line) const;
};

GeneratedSource generate_cpu_source(const Plan& plan);
// `fp16_headers`: include cuda_fp16.h and cuda_bf16.h (they define half and bfloat16).
GeneratedSource generate_cuda_source(const Plan& plan, bool fp16_headers);

// Whether the kernel needs half or bfloat16 (a parameter or template dtype, or the names in its code).
bool needs_fp16_types(const Plan& plan);

// The compiler's errors, each with its place in the user's source and the line, then the compiler's output.
std::string explain_compile_errors(const Plan& plan, const GeneratedSource& source, const std::string& log);

}  // namespace npusim::kernels::detail
