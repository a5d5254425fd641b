#include "backends/cpu/pack_cache.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "core/content_hash.h"
#include "core/cpu_features.h"
#include "core/mapped_file.h"
#include "npusim/error.h"

namespace npusim::cpu {

namespace {

constexpr std::array<char, 8> kMagic = {'N', 'P', 'U', 'P', 'A', 'C', 'K', '1'};
constexpr uint64_t kDataAlignment = 4096;  // where the blocks start in the file: a page, so they map in place
constexpr uint64_t kBlockAlignment = 64;   // each block, as the arena aligns them

// The file: this header, `blocks` entries, then the blocks' bytes from `data_offset` on. Little-endian, as written.
// `checksum` covers the block table and every block's bytes (contents_checksum).
struct FileHeader {
  std::array<char, 8> magic;
  uint64_t key_high, key_low;
  uint64_t blocks;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t checksum;
};

struct FileBlock {
  uint64_t tag;
  uint64_t offset;  // from data_offset
  uint64_t bytes;
};

uint64_t round_up(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string megabytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

struct BuildIdSearch {
  uintptr_t address;
  std::string id;
};

int find_build_id(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<BuildIdSearch*>(data);
  bool contains = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (segment.p_type == PT_LOAD && search->address >= begin && search->address < begin + segment.p_memsz)
      contains = true;
  }
  if (!contains) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_NOTE) continue;
    const auto* at = reinterpret_cast<const unsigned char*>(info->dlpi_addr + segment.p_vaddr);
    const unsigned char* end = at + segment.p_memsz;
    while (at + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) note;
      std::memcpy(&note, at, sizeof note);
      const unsigned char* name = at + sizeof note;
      const unsigned char* description = name + round_up(note.n_namesz, 4);
      if (description + note.n_descsz > end) break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        search->id.assign(reinterpret_cast<const char*>(description), note.n_descsz);
        return 1;
      }
      at = description + round_up(note.n_descsz, 4);
    }
  }
  return 1;
}

std::string features_text() {
  const CpuFeatures& f = cpu_features();
  std::string text;
  for (const bool feature : {f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw, f.avx512vl, f.avx512bf16, f.avx512vnni,
                             f.amx, f.amd, f.avx512_halved})
    text += feature ? '1' : '0';
  return text;
}

// Hashes of the ranges' bytes in pieces of 4 MiB, in order, the pieces spread over the pool.
std::vector<uint64_t> piece_hashes(const std::vector<std::pair<const std::byte*, size_t>>& ranges, ThreadPool& pool) {
  constexpr size_t kPiece = size_t{4} << 20;
  std::vector<std::pair<const std::byte*, size_t>> pieces;
  for (const auto& [data, bytes] : ranges)
    for (size_t at = 0; at < bytes; at += kPiece) pieces.emplace_back(data + at, std::min(kPiece, bytes - at));
  std::vector<uint64_t> hashes(pieces.size());
  pool.parallel_for(static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const auto& [data, bytes] = pieces[static_cast<size_t>(i)];
      hashes[static_cast<size_t>(i)] = hash_bytes(data, bytes);
    }
  });
  return hashes;
}

// What the header's checksum holds: the block table and the bytes of each block (block i at block_data[i]).
uint64_t contents_checksum(const std::vector<FileBlock>& table, const std::vector<const std::byte*>& block_data,
                           ThreadPool& pool) {
  std::vector<std::pair<const std::byte*, size_t>> ranges;
  for (size_t i = 0; i < table.size(); ++i) ranges.emplace_back(block_data[i], static_cast<size_t>(table[i].bytes));
  const std::vector<uint64_t> pieces = piece_hashes(ranges, pool);
  ContentHasher hasher;
  hasher.add(table.data(), table.size() * sizeof(FileBlock));
  hasher.add(pieces.data(), pieces.size() * sizeof(uint64_t));
  return hasher.digest().low;
}

// The header and block table at the start of `file`, checked against its size; empty `why` when usable.
std::vector<FileBlock> read_table(const MappedFile& file, const PackKey& key, FileHeader& header, std::string& why) {
  const uint64_t file_size = file.size();
  if (file_size < sizeof header) {
    why = "shorter than its header";
    return {};
  }
  std::memcpy(&header, file.data(), sizeof header);
  if (header.magic != kMagic) {
    why = "not a packed-weights file of this version";
    return {};
  }
  if (header.key_high != key.high || header.key_low != key.low) {
    why = "made for another key";
    return {};
  }
  const uint64_t table_end = sizeof header + header.blocks * sizeof(FileBlock);
  if (header.blocks > file_size / sizeof(FileBlock) || header.data_offset % kDataAlignment != 0 ||
      header.data_offset < table_end || header.data_offset > file_size ||
      header.data_bytes > file_size - header.data_offset) {
    why = "truncated or damaged (" + std::to_string(file_size) + " bytes)";
    return {};
  }
  std::vector<FileBlock> table(header.blocks);
  std::memcpy(table.data(), file.data() + sizeof header, table.size() * sizeof(FileBlock));
  for (const FileBlock& block : table)
    if (block.offset % kBlockAlignment != 0 || block.offset > header.data_bytes ||
        block.bytes > header.data_bytes - block.offset) {
      why = "a block lies outside the file's data";
      return {};
    }
  return table;
}

// Writes all of [data, data + bytes) at `offset`.
bool write_all(int fd, const void* data, size_t bytes, uint64_t offset) {
  const auto* at = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    const ssize_t written = ::pwrite(fd, at, bytes, static_cast<off_t>(offset));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    at += written;
    offset += static_cast<uint64_t>(written);
    bytes -= static_cast<size_t>(written);
  }
  return true;
}

}  // namespace

std::string PackKey::hex() const {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return text;
}

std::string build_id() {
  static const std::string id = [] {
    BuildIdSearch search{reinterpret_cast<uintptr_t>(&find_build_id), {}};
    dl_iterate_phdr(find_build_id, &search);
    return search.id;
  }();
  return id;
}

PackKey pack_key(const std::vector<uint8_t>& program_bytes, const std::string& options,
                 const std::vector<std::pair<ValueId, Tensor>>& weights, ThreadPool& pool) {
  ContentHasher hasher;
  const auto add_text = [&hasher](const std::string& text) {
    hasher.add_number(text.size());
    hasher.add(text.data(), text.size());
  };
  add_text("npusim packed weights 1");
  add_text(build_id());
  add_text(features_text());
  add_text(options);
  hasher.add_number(program_bytes.size());
  hasher.add(program_bytes.data(), program_bytes.size());
  std::vector<std::pair<const std::byte*, size_t>> ranges;
  for (const auto& [id, tensor] : weights) {
    hasher.add_number(static_cast<uint64_t>(id));
    hasher.add_number(static_cast<uint64_t>(tensor.dtype()));
    hasher.add_number(tensor.shape().size());
    for (const int64_t extent : tensor.shape()) hasher.add_number(static_cast<uint64_t>(extent));
    ranges.emplace_back(tensor.bytes(), tensor.nbytes());
  }
  const std::vector<uint64_t> pieces = piece_hashes(ranges, pool);
  hasher.add(pieces.data(), pieces.size() * sizeof(uint64_t));
  const ContentHasher::Digest digest = hasher.digest();
  return {digest.high, digest.low};
}

std::string PackCache::file_for(const PackKey& key) const { return directory_ + "/" + key.hex() + ".npupack"; }

std::shared_ptr<ZeroedArena> PackCache::arena_for(const PackKey& key, ThreadPool& pool, std::string& note) const {
  const std::string path = file_for(key);
  std::error_code absent;
  if (!std::filesystem::exists(path, absent)) return std::make_shared<ZeroedArena>();
  std::shared_ptr<const MappedFile> mapped;
  std::string why;
  FileHeader header{};
  std::vector<FileBlock> table;
  try {
    // Copy-on-write: a block written again (which packing never does with a block that came written) changes this
    // process's copy of the page, not the file.
    mapped = std::make_shared<const MappedFile>(path, MappedFile::Access::CopyOnWrite);
    table = read_table(*mapped, key, header, why);
  } catch (const Error& error) {  // it names the file
    note = std::string("ignored ") + error.what();
    return std::make_shared<ZeroedArena>();
  }
  std::vector<const std::byte*> block_data;
  if (why.empty()) {
    mapped->map_in();
    for (const FileBlock& block : table) block_data.push_back(mapped->data() + header.data_offset + block.offset);
    if (contents_checksum(table, block_data, pool) != header.checksum) why = "its contents do not match their checksum";
  }
  if (!why.empty()) {
    note = "ignored " + path + ": " + why;
    return std::make_shared<ZeroedArena>();
  }
  std::vector<ArenaBlock> blocks;
  for (size_t i = 0; i < table.size(); ++i)
    blocks.push_back({const_cast<std::byte*>(block_data[i]), static_cast<size_t>(table[i].bytes), table[i].tag});
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // used now: the last file evict_older would remove
  return std::make_shared<ZeroedArena>(blocks, mapped);
}

std::string PackCache::save(const PackKey& key, const ZeroedArena& arena, ThreadPool& pool) const {
  const std::string path = file_for(key);
  // The last block of each tag: a node's kernel made again packs its weights again.
  std::vector<ArenaBlock> blocks;
  std::unordered_map<uint64_t, size_t> index;
  for (const ArenaBlock& block : arena.blocks()) {
    if (block.tag == 0) continue;
    const auto [it, added] = index.emplace(block.tag, blocks.size());
    if (added)
      blocks.push_back(block);
    else
      blocks[it->second] = block;
  }
  std::vector<FileBlock> table;
  uint64_t data_bytes = 0;
  for (const ArenaBlock& block : blocks) {
    table.push_back({block.tag, data_bytes, block.bytes});
    data_bytes = round_up(data_bytes + block.bytes, kBlockAlignment);
  }
  FileHeader header{kMagic, key.high, key.low, table.size(), 0, data_bytes, 0};
  header.data_offset = round_up(sizeof header + table.size() * sizeof(FileBlock), kDataAlignment);
  const uint64_t file_bytes = header.data_offset + data_bytes;
  if (file_bytes > kMaxDirectoryBytes)
    return "not saved to " + path + ": its " + megabytes(file_bytes) + " are more than a pack cache keeps (" +
           megabytes(kMaxDirectoryBytes) + ")";
  std::vector<const std::byte*> block_data;
  for (const ArenaBlock& block : blocks) block_data.push_back(block.data);
  header.checksum = contents_checksum(table, block_data, pool);

  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error) return "not saved to " + path + ": cannot create " + directory_ + ": " + error.message();
  std::string temporary = directory_ + "/.npupack-XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) return system_error("not saved to " + path + ": cannot create a file in " + directory_);
  bool written = write_all(fd, &header, sizeof header, 0) &&
                 write_all(fd, table.data(), table.size() * sizeof(FileBlock), sizeof header) &&
                 ::ftruncate(fd, static_cast<off_t>(header.data_offset + data_bytes)) == 0;
  for (size_t i = 0; written && i < blocks.size(); ++i)
    written = write_all(fd, blocks[i].data, blocks[i].bytes, header.data_offset + table[i].offset);
  std::string failure = written ? "" : system_error("cannot write " + temporary);
  if (::close(fd) != 0 && failure.empty()) failure = system_error("cannot write " + temporary);
  if (failure.empty() && std::rename(temporary.c_str(), path.c_str()) != 0)
    failure = system_error("cannot rename " + temporary);
  if (!failure.empty()) {
    ::unlink(temporary.c_str());
    return "not saved to " + path + ": " + failure;
  }
  return "saved " + path + " (" + megabytes(file_bytes) + ")" +
         evict_older(std::filesystem::path(path).filename().string());
}

std::string PackCache::evict_older(const std::string& kept) const {
  struct Entry {
    std::filesystem::file_time_type used;
    uint64_t bytes;
    std::filesystem::path path;
  };
  std::vector<Entry> files;
  uint64_t total = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory_, error)) {
    std::error_code ignored;
    if (entry.path().extension() != ".npupack" || !entry.is_regular_file(ignored)) continue;
    const uint64_t bytes = entry.file_size(ignored);
    total += bytes;
    if (entry.path().filename() != kept) files.push_back({entry.last_write_time(ignored), bytes, entry.path()});
  }
  std::sort(files.begin(), files.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  size_t removed = 0;
  uint64_t removed_bytes = 0;
  for (const Entry& file : files) {
    if (total <= kMaxDirectoryBytes) break;
    std::error_code ignored;
    if (!std::filesystem::remove(file.path, ignored)) continue;
    total -= file.bytes;
    ++removed;
    removed_bytes += file.bytes;
  }
  if (removed == 0) return "";
  return "; removed the " + std::to_string(removed) + " least recently used file(s) (" + megabytes(removed_bytes) +
         ") to keep " + directory_ + " within " + megabytes(kMaxDirectoryBytes);
}

}  // namespace npusim::cpu
