#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "npusim/error.h"

namespace npusim {

namespace {

// The read-only mappings alive now, by first byte: the only memory release_pages may give back.
struct ReadOnlyMappings {
  std::mutex mutex;
  std::map<const std::byte*, size_t> sizes;
};

ReadOnlyMappings& read_only_mappings() {
  static ReadOnlyMappings mappings;
  return mappings;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, Access access) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int saved = errno;
    ::close(fd);
    fail(path + ": cannot stat: " + std::strerror(saved));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ > 0) {
    const int protection = access == Access::CopyOnWrite ? PROT_READ | PROT_WRITE : PROT_READ;
    void* address = ::mmap(nullptr, size_, protection, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      fail(path + ": cannot map: " + std::strerror(saved));
    }
    data_ = static_cast<std::byte*>(address);
  }
  ::close(fd);
  if (data_ && access == Access::ReadOnly) {
    ReadOnlyMappings& mappings = read_only_mappings();
    std::lock_guard<std::mutex> lock(mappings.mutex);
    mappings.sizes[data_] = size_;
  }
}

MappedFile::~MappedFile() {
  if (!data_) return;
  {
    ReadOnlyMappings& mappings = read_only_mappings();
    std::lock_guard<std::mutex> lock(mappings.mutex);
    mappings.sizes.erase(data_);
  }
  ::munmap(data_, size_);
}

size_t MappedFile::release_pages(const void* data, size_t bytes) {
  const auto* begin = static_cast<const std::byte*>(data);
  ReadOnlyMappings& mappings = read_only_mappings();
  std::lock_guard<std::mutex> lock(mappings.mutex);  // held so that the mapping cannot go meanwhile
  auto after = mappings.sizes.upper_bound(begin);
  if (after == mappings.sizes.begin()) return 0;
  const auto& [mapping, mapping_size] = *std::prev(after);
  if (begin < mapping || bytes > mapping_size || begin - mapping > static_cast<ptrdiff_t>(mapping_size - bytes))
    return 0;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  if (last <= first) return 0;
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

void MappedFile::map_in() const {
#ifdef MADV_POPULATE_READ
  if (::madvise(data_, size_, MADV_POPULATE_READ) == 0) return;
#endif
  unsigned char sum = 0;
  for (size_t at = 0; at < size_; at += 4096) sum ^= *reinterpret_cast<const volatile unsigned char*>(data_ + at);
  (void)sum;
}

}  // namespace npusim
