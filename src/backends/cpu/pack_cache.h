#pragma once
// Packed weights kept in files between processes. A program prepared again with the same weights, options and build
// on the same kind of CPU maps the file its first preparation wrote instead of packing and transforming its weights
// again: what start-up costs beyond reading the weights is then the mapping (ResNet-50: 152 MB of packed weights).
// One file per key, named by it; a file that does not match is ignored and written anew.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "core/zeroed_memory.h"
#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim::cpu {

// What packed weights are a function of: the build (its GNU build id), the CPU's vector extensions, the program, the
// backend options that change packing (`options`), and every bound weight's value id, type, shape and bytes (hashed
// over the pool's threads).
struct PackKey {
  uint64_t high = 0, low = 0;
  std::string hex() const;
  bool operator==(const PackKey&) const = default;
};

// Empty when this build carries no build id (packed weights then cannot be told apart from another build's).
std::string build_id();

PackKey pack_key(const std::vector<uint8_t>& program_bytes, const std::string& options,
                 const std::vector<std::pair<ValueId, Tensor>>& weights, ThreadPool& pool);

class PackCache {
 public:
  // What one directory keeps at most: saving a file removes the least recently used others (by modification time,
  // which mapping a file renews) until the files fit; a file larger than this is not saved.
  static constexpr uint64_t kMaxDirectoryBytes = uint64_t{4} << 30;

  explicit PackCache(std::string directory) : directory_(std::move(directory)) {}
  const std::string& directory() const { return directory_; }
  std::string file_for(const PackKey& key) const;

  // An arena that starts with the blocks of the file kept for `key` (mapped, not copied; its checksum verified over
  // the pool), or an empty one when there is no such file; a file that cannot be used (truncated, damaged, made for
  // another key) is left for save() to replace, and `note` says why.
  std::shared_ptr<ZeroedArena> arena_for(const PackKey& key, ThreadPool& pool, std::string& note) const;
  // Writes the tagged blocks the arena handed out (the last of each tag) and their checksum as the file for `key`:
  // to a temporary file renamed into place, so that a reader sees a whole file or none. Returns what it did, or why
  // it did not.
  std::string save(const PackKey& key, const ZeroedArena& arena, ThreadPool& pool) const;

 private:
  // Removes the least recently used files but the one named `kept` while the directory's files exceed
  // kMaxDirectoryBytes; what it removed, as a clause to append to save's note.
  std::string evict_older(const std::string& kept) const;

  std::string directory_;
};

}  // namespace npusim::cpu
