#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "npusim/error.h"

namespace npusim {

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
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
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
