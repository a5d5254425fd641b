#include "core/content_hash.h"

#include "core/cpu_features.h"
#include "npusim/error.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace npusim {

#if defined(__x86_64__) && !defined(__clang__)
#define NPUSIM_HASH_AVX2 1
uint64_t hash_bytes_avx2(const void* data, size_t bytes);  // content_hash_avx2.cpp
#endif

uint64_t hash_bytes(const void* data, size_t bytes) {
#ifdef NPUSIM_HASH_AVX2
  static const bool avx2 = cpu_features().avx2;
  if (avx2) return hash_bytes_avx2(data, bytes);
#endif
  return XXH3_64bits(data, bytes);
}

ContentHasher::ContentHasher() : state_(XXH3_createState()) {
  if (!state_) fail("cannot allocate a hash state");
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

ContentHasher::~ContentHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ContentHasher::add(const void* data, size_t bytes) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

ContentHasher::Digest ContentHasher::digest() const {
  const XXH128_hash_t hash = XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_));
  return {hash.high64, hash.low64};
}

}  // namespace npusim
