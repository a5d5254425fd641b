#pragma once
// The vector extensions this CPU offers (and the OS enables), detected once; every kernel that picks an
// implementation at run time asks here. NPUSIM_CPU_ISA=portable|avx2|avx512|amx caps them (to measure or test the
// kernels an older CPU would get); an unknown value is an error.

namespace npusim {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;  // vdpbf16ps
  bool avx512vnni = false;  // vpdpbusd
  bool amx = false;         // AMX tiles present and enabled by the OS
  bool amd = false;         // an AMD CPU
  // 512-bit operations issue as two 256-bit halves (AMD's Zen 4, and the Zen 5 cores of its laptop chips): there a
  // 512-bit FMA does no more work per cycle than a 256-bit one. Zen 5's server and desktop cores run them whole.
  bool avx512_halved = false;

  bool avx2_fma_f16c() const { return avx2 && fma && f16c; }
  // The AVX-512 subset the kernels use (F, BW, VL), on top of AVX2.
  bool avx512() const { return avx2_fma_f16c() && avx512f && avx512bw && avx512vl; }
};

const CpuFeatures& cpu_features();

// Whether an AMD CPU of this CPUID family and model issues 512-bit operations as two 256-bit halves.
bool amd_splits_avx512(unsigned family, unsigned model);

}  // namespace npusim
