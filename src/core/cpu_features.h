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
  bool amd = false;         // an AMD CPU (Zen 4 runs each 512-bit FMA as two 256-bit halves)

  bool avx2_fma_f16c() const { return avx2 && fma && f16c; }
  // The AVX-512 subset the kernels use (F, BW, VL), on top of AVX2.
  bool avx512() const { return avx2_fma_f16c() && avx512f && avx512bw && avx512vl; }
};

const CpuFeatures& cpu_features();

}  // namespace npusim
