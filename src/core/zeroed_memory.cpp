#include "core/zeroed_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "npusim/error.h"

namespace npusim {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHeapAlignment = 64;

size_t mapped_bytes(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
// Whole 64-byte lines, at least one: the size of a heap block, or of an arena block.
size_t line_bytes(size_t bytes) {
  return std::max(kHeapAlignment, (bytes + kHeapAlignment - 1) / kHeapAlignment * kHeapAlignment);
}

[[noreturn]] void refuse(size_t bytes, const char* what) {
  fail(std::string("cannot allocate ") + std::to_string(bytes) + " bytes for " + what);
}

// A fresh anonymous mapping of `rounded` bytes (a multiple of 2 MiB), aligned to 2 MiB, zero.
std::byte* map_aligned(size_t rounded, size_t bytes, const char* what) {
  void* raw = ::mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) refuse(bytes, what);
  // Keep the 2 MiB-aligned part.
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > begin) ::munmap(raw, aligned - begin);
  ::munmap(reinterpret_cast<void*>(aligned + rounded), begin + kHugePage - aligned);
  return reinterpret_cast<std::byte*>(aligned);
}

}  // namespace

void ZeroedMemoryFree::operator()(std::byte* p) const {
  if (bytes >= kHugePage)
    ::munmap(p, mapped_bytes(bytes));
  else
    std::free(p);
}

ZeroedMemory allocate_zeroed(size_t bytes, const char* what, Pages pages) {
  if (bytes < kHugePage) {
    const size_t rounded = line_bytes(bytes);
    auto* memory = static_cast<std::byte*>(std::aligned_alloc(kHeapAlignment, rounded));
    if (!memory) refuse(bytes, what);
    std::memset(memory, 0, rounded);
    return ZeroedMemory(memory, ZeroedMemoryFree{bytes});
  }
  const size_t rounded = mapped_bytes(bytes);
  std::byte* memory = map_aligned(rounded, bytes, what);
  if (pages == Pages::Huge) ::madvise(memory, rounded, MADV_HUGEPAGE);  // advice only: works the same without
  return ZeroedMemory(memory, ZeroedMemoryFree{bytes});
}

void prefault(std::byte* data, size_t bytes) {
  constexpr size_t kPage = 4096;
  const auto begin = reinterpret_cast<uintptr_t>(data) / kPage * kPage;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes + kPage - 1) / kPage * kPage;
  if (!data || begin >= end) return;
#ifdef MADV_POPULATE_WRITE
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
#endif
  // Without it (kernels before 5.14): one byte of each page written back as it is.
  for (uintptr_t page = begin; page < end; page += kPage) {
    volatile auto* byte = reinterpret_cast<volatile unsigned char*>(std::max(page, reinterpret_cast<uintptr_t>(data)));
    *byte = *byte;
  }
}

ZeroedArena::ZeroedArena(const std::vector<ArenaBlock>& written, std::shared_ptr<const void> keeper)
    : keeper_(std::move(keeper)) {
  for (const ArenaBlock& block : written)
    if (block.tag != 0) written_[block.tag] = block;
}

ZeroedArena::Allocation ZeroedArena::allocate(size_t bytes, const char* what, uint64_t tag) {
  // Chunks of 32 MiB: a ResNet-50's packed weights take a handful; pages of a chunk that no block reaches are never
  // touched, so they cost address space only.
  constexpr size_t kChunk = size_t{32} << 20;
  const size_t rounded = line_bytes(bytes);
  const std::lock_guard lock(mutex_);
  if (const auto it = written_.find(tag); tag != 0 && it != written_.end() && it->second.bytes == bytes) {
    handed_out_.push_back(it->second);
    used_ += rounded;
    written_used_ += rounded;
    return {it->second.data, true};
  }
  if (rounded > free_) {
    // No huge-page advice yet. First touches of huge pages measured 11 ms per 100 MB here when the kernel had them
    // at hand, but 60-300 ms in most start-ups (the kernel, or the host, must make them first: timing the first
    // touch of each page to fall back after a slow one did not help; measured again on ResNet-50's 152 MB: prepare
    // took 35-73 ms with huge pages in half the runs, 139-200 ms in the others); 4 KiB pages take a steady 55 ms on one
    // thread, 30 on two, and packing maps each block in over the pool before it writes it (prefault), which costs less
    // than a fault per page. Populating whole chunks as they are mapped measured slower: one thread, and the last
    // chunk's tail.
    const size_t size = std::max(kChunk, mapped_bytes(rounded));
    chunks_.push_back(ZeroedMemory(map_aligned(size, bytes, what), ZeroedMemoryFree{size}));
    free_ = size;
  }
  std::byte* block = chunks_.back().get() + (chunks_.back().get_deleter().bytes - free_);
  free_ -= rounded;
  used_ += rounded;
  handed_out_.push_back({block, bytes, tag});
  return {block, false};
}

void ZeroedArena::advise_huge_pages() {
  const std::lock_guard lock(mutex_);
  for (const ZeroedMemory& chunk : chunks_) ::madvise(chunk.get(), chunk.get_deleter().bytes, MADV_HUGEPAGE);
}

size_t ZeroedArena::used_bytes() const {
  const std::lock_guard lock(mutex_);
  return used_;
}

size_t ZeroedArena::written_bytes() const {
  const std::lock_guard lock(mutex_);
  return written_used_;
}

std::vector<ArenaBlock> ZeroedArena::blocks() const {
  const std::lock_guard lock(mutex_);
  return handed_out_;
}

}  // namespace npusim
