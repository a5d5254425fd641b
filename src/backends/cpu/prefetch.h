#pragma once
// Asking for memory a kernel writes or reads a little later, where its accesses jump further than the hardware
// prefetchers follow (rows of C a whole row apart, the transform points' matrices of a Winograd channel).
#include <cstddef>

namespace npusim::cpu {

inline constexpr size_t kCacheLine = 64;

// Every cache line of [data, data + bytes) into L2 (not L1, where the lines would evict what the kernel reads now).
inline void prefetch_to_l2(const void* data, size_t bytes) {
  const char* first = static_cast<const char*>(data);
  for (size_t at = 0; at < bytes; at += kCacheLine) __builtin_prefetch(first + at, 0, 2);
}

}  // namespace npusim::cpu
