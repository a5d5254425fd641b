#pragma once
// A whole file mapped private into memory: read-only, or copy-on-write (a write changes this process's copy of the
// page, never the file). Unmapped when destroyed.
#include <cstddef>
#include <cstdint>
#include <string>

namespace npusim {

class MappedFile {
 public:
  enum class Access : uint8_t { ReadOnly, CopyOnWrite };
  // Fails (npusim::Error naming `path`) when the file cannot be opened or mapped, or is not a regular file.
  explicit MappedFile(const std::string& path, Access access = Access::ReadOnly);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // Maps every page in now, for reading: one call where the kernel can (MAP_POPULATE on a copy-on-write mapping
  // would copy every page), else a byte read from each page (a fault maps its neighbours in too).
  void map_in() const;

  // Gives back this process's copy of the whole pages of [data, data + bytes) where they lie in a read-only
  // MappedFile that is still mapped: their contents come back from the file at the next read. For a weight whose
  // readers all read a form made from it; anywhere else (memory of any other kind, a copy-on-write mapping) it does
  // nothing. Returns the bytes given back.
  static size_t release_pages(const void* data, size_t bytes);

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace npusim
