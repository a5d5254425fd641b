#include "core/zeroed_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "npusim/error.h"

namespace npusim {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHeapAlignment = 64;

size_t mapped_bytes(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

}  // namespace

void ZeroedMemoryFree::operator()(std::byte* p) const {
  if (bytes >= kHugePage)
    ::munmap(p, mapped_bytes(bytes));
  else
    std::free(p);
}

ZeroedMemory allocate_zeroed(size_t bytes, const char* what) {
  const auto refuse = [&] { fail(std::string("cannot allocate ") + std::to_string(bytes) + " bytes for " + what); };
  if (bytes < kHugePage) {
    const size_t rounded = std::max(kHeapAlignment, (bytes + kHeapAlignment - 1) / kHeapAlignment * kHeapAlignment);
    auto* memory = static_cast<std::byte*>(std::aligned_alloc(kHeapAlignment, rounded));
    if (!memory) refuse();
    std::memset(memory, 0, rounded);
    return ZeroedMemory(memory, ZeroedMemoryFree{bytes});
  }
  const size_t rounded = mapped_bytes(bytes);
  void* raw = ::mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) refuse();
  // Keep the 2 MiB-aligned part; fresh anonymous pages are zero already.
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > begin) ::munmap(raw, aligned - begin);
  ::munmap(reinterpret_cast<void*>(aligned + rounded), begin + kHugePage - aligned);
  auto* memory = reinterpret_cast<std::byte*>(aligned);
  ::madvise(memory, rounded, MADV_HUGEPAGE);  // advice only: without huge pages the memory works the same
  return ZeroedMemory(memory, ZeroedMemoryFree{bytes});
}

}  // namespace npusim
