#pragma once
// Zero-filled memory for tensors and kernel buffers. Blocks of 2 MiB and more are anonymous mappings of their
// own, aligned to 2 MiB (fresh pages are zero, so nothing is cleared); smaller blocks come from the heap, 64-byte
// aligned. Memory that a decode step streams once per token asks for transparent huge pages at its first touch
// (Pages::Huge): read through 4 KiB pages the same GEMV measured 15-20% slower on x86. Other memory does not,
// because a huge page taken at the first touch may wait for the kernel to compact memory (60-300 ms per 100 MB
// measured while loading ResNet-50).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace npusim {

struct ZeroedMemoryFree {
  size_t bytes = 0;
  void operator()(std::byte* p) const;
};

using ZeroedMemory = std::unique_ptr<std::byte, ZeroedMemoryFree>;

enum class Pages : uint8_t { Small, Huge };

// Fails (npusim::Error naming `what`) when the memory cannot be had.
ZeroedMemory allocate_zeroed(size_t bytes, const char* what, Pages pages = Pages::Small);

// Maps the pages of [data, data + bytes) in now, in one call (MADV_POPULATE_WRITE; one byte per page written back as
// it is where the kernel lacks it), so that the first writes pay no page fault per 4 KiB page: for memory allocated
// zeroed at prepare time (a block from allocate_zeroed or a ZeroedArena) before it is written, while no other thread
// writes it. The contents stay as they are; pages already mapped cost nothing more.
void prefault(std::byte* data, size_t bytes);

// A block of a ZeroedArena: where it is, its size, and the tag its caller gave it (what it holds; 0: no tag).
struct ArenaBlock {
  std::byte* data = nullptr;
  size_t bytes = 0;
  uint64_t tag = 0;
};

// Many zero-filled blocks that live and die together (the packed weights of a prepared program), carved one after
// another from a few large mappings: no allocation per block and no block zeroed twice (fresh mappings are zero).
// The mappings start on 4 KiB pages, which a first touch gets at a steady cost, and are offered to huge pages once
// written (advise_huge_pages). Blocks are 64-byte aligned and freed only with the arena. Thread-safe.
//
// An arena may start with blocks written before (packed weights mapped from a file that `keeper` keeps alive): a
// request with the tag and size of one of them gets that block, already written, instead of a fresh one.
class ZeroedArena {
 public:
  ZeroedArena() = default;
  ZeroedArena(const std::vector<ArenaBlock>& written, std::shared_ptr<const void> keeper);
  ZeroedArena(const ZeroedArena&) = delete;
  ZeroedArena& operator=(const ZeroedArena&) = delete;

  struct Allocation {
    std::byte* data = nullptr;
    bool written = false;  // one of the blocks the arena started with: its contents are already in place
  };
  // Fails (npusim::Error naming `what`) when the memory cannot be had.
  Allocation allocate(size_t bytes, const char* what, uint64_t tag = 0);
  // Offers the chunks to transparent huge pages once the blocks are written: the kernel may then merge their 4 KiB
  // pages in the background (khugepaged), without stalling the first touch.
  void advise_huge_pages();
  size_t used_bytes() const;     // every block handed out
  size_t written_bytes() const;  // the blocks handed out already written
  // Every block handed out, in order.
  std::vector<ArenaBlock> blocks() const;

 private:
  mutable std::mutex mutex_;
  std::vector<ZeroedMemory> chunks_;
  size_t free_ = 0;  // bytes left at the end of the last chunk
  size_t used_ = 0;
  size_t written_used_ = 0;
  std::unordered_map<uint64_t, ArenaBlock> written_;  // by tag
  std::shared_ptr<const void> keeper_;
  std::vector<ArenaBlock> handed_out_;
};

}  // namespace npusim
