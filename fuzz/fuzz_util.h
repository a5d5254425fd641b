#pragma once
// Shared by the fuzz targets: loaders that take a path get the input through an in-memory file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace npusim::fuzz {

// An anonymous in-memory file holding the fuzzer's bytes, reachable by a /proc path; closed on destruction.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("npusim-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    size_t written = 0;
    while (written < size) {
      const ssize_t n = ::write(fd_, data + written, size - written);
      if (n <= 0) std::abort();
      written += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  ~MemoryFile() { ::close(fd_); }

  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A broken invariant that the sanitizers cannot see (e.g. a read past a size inside the same mapping).
inline void require(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace npusim::fuzz
