#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "work_dir.h"

using namespace npusim;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Byte i of every file here: a pattern that no page of zeros or of another offset matches.
unsigned char pattern_byte(size_t i) { return static_cast<unsigned char>((i * 2654435761u) >> 13); }

std::string write_pattern_file(size_t bytes) {
  const std::string path = test::fresh_work_dir("mapped") + "/pattern.bin";
  std::vector<unsigned char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = pattern_byte(i);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), std::streamsize(bytes));
  return path;
}

size_t first_mismatch(const std::byte* data, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i)
    if (static_cast<unsigned char>(data[i]) != pattern_byte(i)) return i;
  return bytes;
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(MappedFile, ReleasedPagesComeBackFromTheFile) {
  const size_t bytes = 4 * kMiB + 123;
  const MappedFile file(write_pattern_file(bytes));
  ASSERT_EQ(first_mismatch(file.data(), bytes), bytes);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // From the middle of one page to the middle of another: only the whole pages between them go.
  const size_t released = MappedFile::release_pages(file.data() + 1000, 2 * kMiB);
  EXPECT_EQ(released, 2 * kMiB - page);
  EXPECT_EQ(first_mismatch(file.data(), bytes), bytes);
  EXPECT_EQ(MappedFile::release_pages(file.data(), bytes), bytes / page * page);
  EXPECT_EQ(first_mismatch(file.data(), bytes), bytes);
}

TEST(MappedFile, ReleasingPagesLowersTheResidentMemory) {
  const size_t bytes = 64 * kMiB;
  const MappedFile file(write_pattern_file(bytes));
  file.map_in();
  ASSERT_EQ(first_mismatch(file.data(), bytes), bytes);
  const size_t before = resident_bytes();
  ASSERT_EQ(MappedFile::release_pages(file.data(), bytes), bytes);
  const size_t after = resident_bytes();
  EXPECT_GT(before, after + bytes / 2) << "resident " << before << " bytes before, " << after << " after";
  EXPECT_EQ(first_mismatch(file.data(), bytes), bytes);
}

TEST(MappedFile, NothingElseIsReleased) {
  const size_t bytes = 2 * kMiB;
  const std::string path = write_pattern_file(bytes);

  // Memory of the process's own: giving it back would zero it.
  std::vector<std::byte> own(bytes);
  for (size_t i = 0; i < bytes; ++i) own[i] = std::byte{pattern_byte(i)};
  EXPECT_EQ(MappedFile::release_pages(own.data(), bytes), 0u);
  EXPECT_EQ(first_mismatch(own.data(), bytes), bytes);

  // A copy-on-write mapping's written pages exist nowhere else.
  const MappedFile writable(path, MappedFile::Access::CopyOnWrite);
  auto* written = const_cast<std::byte*>(writable.data());
  std::memset(written, 0x5a, bytes);
  EXPECT_EQ(MappedFile::release_pages(written, bytes), 0u);
  EXPECT_EQ(static_cast<unsigned char>(written[bytes - 1]), 0x5au);

  // A range running past the end of a read-only mapping, or starting before it.
  const MappedFile file(path);
  EXPECT_EQ(MappedFile::release_pages(file.data() + kMiB, bytes), 0u);
  EXPECT_EQ(MappedFile::release_pages(file.data() - 4096, 8192), 0u);
  EXPECT_EQ(MappedFile::release_pages(file.data(), 0), 0u);
  EXPECT_EQ(first_mismatch(file.data(), bytes), bytes);
}

TEST(MappedFile, AnUnmappedFileIsForgotten) {
  const size_t bytes = 2 * kMiB;
  const std::string path = write_pattern_file(bytes);
  const std::byte* old_address = nullptr;
  {
    const MappedFile file(path);
    old_address = file.data();
  }
  EXPECT_EQ(MappedFile::release_pages(old_address, bytes), 0u);
}

}  // namespace
