#pragma once
// Hashes of contents that must be told apart (what the CPU backend's packed-weights files were made from, and that
// they are whole): xxHash's XXH3, run with the widest vectors the CPU has (the values are the same on every CPU).
#include <cstddef>
#include <cstdint>

namespace npusim {

// XXH3, 64 bits.
uint64_t hash_bytes(const void* data, size_t bytes);

// XXH3, 128 bits, over everything added, in order.
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;
  void add(const void* data, size_t bytes);
  void add_number(uint64_t value) { add(&value, sizeof value); }
  struct Digest {
    uint64_t high = 0, low = 0;
  };
  Digest digest() const;

 private:
  void* state_;
};

}  // namespace npusim
