#include "core/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "npusim/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NPUSIM_FEATURES_X86 1
#endif

namespace npusim {

namespace {

#ifdef NPUSIM_FEATURES_X86
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool cpuid_bit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1;
}

constexpr int kEax = 0, kEcx = 2, kEdx = 3;

// Family and model as CPUID leaf 1 encodes them (the extended fields count where the base family is 0xF).
std::pair<unsigned, unsigned> family_and_model() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return {0, 0};
  const unsigned base_family = (eax >> 8) & 0xF, base_model = (eax >> 4) & 0xF;
  const unsigned family = base_family == 0xF ? base_family + ((eax >> 20) & 0xFF) : base_family;
  const unsigned model =
      base_family == 0xF || base_family == 0x6 ? base_model | (((eax >> 16) & 0xF) << 4) : base_model;
  return {family, model};
}

// AMX needs the tile and bf16 bits of CPUID leaf 7, the OS saving the tile state (XCR0 bits 17 and 18), and (Linux
// 5.16 on) the process's permission to use the tile data, asked for once here.
bool amx_usable() {
  if (!cpuid_bit(7, 0, kEdx, 24) || !cpuid_bit(7, 0, kEdx, 22) || !cpuid_bit(1, 0, 2, 27))
    return false;  // AMX-TILE, AMX-BF16, OSXSAVE
  constexpr uint64_t kTileState = (uint64_t{1} << 17) | (uint64_t{1} << 18);
  if ((read_xcr0() & kTileState) != kTileState) return false;
  constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
  return ::syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // By CPUID where clang 14's __builtin_cpu_supports lacks the name (the fuzz build uses it).
  f.f16c = cpuid_bit(1, 0, kEcx, 29);
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bf16 = f.avx512f && cpuid_bit(7, 1, kEax, 5);  // the OS state is that of avx512f
  f.avx512vnni = f.avx512f && cpuid_bit(7, 0, kEcx, 11);
  f.amx = amx_usable();
  f.amd = __builtin_cpu_is("amd");
  if (f.amd) {
    const auto [family, model] = family_and_model();
    f.avx512_halved = f.avx512f && amd_splits_avx512(family, model);
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

// The detected features less those above NPUSIM_CPU_ISA.
CpuFeatures capped(CpuFeatures f) {
  const char* cap = std::getenv("NPUSIM_CPU_ISA");
  if (!cap || !*cap) return f;
  const std::string isa = cap;
  if (isa != "portable" && isa != "avx2" && isa != "avx512" && isa != "amx")
    fail("NPUSIM_CPU_ISA must be portable, avx2, avx512 or amx, got '" + isa + "'");
  if (isa != "amx") f.amx = false;
  if (isa != "avx512" && isa != "amx")
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512bf16 = f.avx512vnni = f.avx512_halved = false;
  if (isa == "portable") f.avx2 = f.fma = f.f16c = false;
  return f;
}

}  // namespace

// Family 0x19 is Zen 3 (no AVX-512) and Zen 4 (split); family 0x1A is Zen 5, whose server (models 0x00-0x1F),
// desktop (0x40-0x4F) and Strix Halo (0x70-0x7F) cores have full-width units, while Strix Point (0x20-0x2F) and
// Krackan Point (0x60-0x6F) keep 256-bit ones. Later families are taken to be full width.
bool amd_splits_avx512(unsigned family, unsigned model) {
  if (family < 0x1A) return true;
  if (family > 0x1A) return false;
  return (model >= 0x20 && model <= 0x2F) || (model >= 0x60 && model <= 0x6F);
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = capped(detect());
  return features;
}

}  // namespace npusim
