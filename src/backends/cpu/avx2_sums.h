#pragma once
// Sums across the lanes of AVX2 float vectors, for kernels compiled with the avx2 target attribute.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace npusim::cpu {

// The sum of v's eight lanes.
__attribute__((target("avx2"), always_inline)) inline float horizontal_sum(__m256 v) {
  const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

// Lane r of the result is the sum of v[r]'s eight lanes: pairwise sums within each 128-bit half, then the halves.
__attribute__((target("avx2"), always_inline)) inline __m256 horizontal_sums(const __m256 (&v)[8]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

}  // namespace npusim::cpu
#endif
