#pragma once
// Zero-filled memory for tensors and kernel buffers. Blocks of 2 MiB and more are anonymous mappings of their
// own, aligned to 2 MiB and offered to transparent huge pages: a decode step streams every weight once, and reading
// them through 4 KiB pages (a file mapping, or the default heap) measured 15-20% slower on x86. Smaller blocks come
// from the heap, 64-byte aligned.
#include <cstddef>
#include <memory>

namespace npusim {

struct ZeroedMemoryFree {
  size_t bytes = 0;
  void operator()(std::byte* p) const;
};

using ZeroedMemory = std::unique_ptr<std::byte, ZeroedMemoryFree>;

// Fails (npusim::Error naming `what`) when the memory cannot be had.
ZeroedMemory allocate_zeroed(size_t bytes, const char* what);

}  // namespace npusim
