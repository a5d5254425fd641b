#include "kernel_api/kernel_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "npusim/error.h"
#include "npusim/kernel_api.h"

namespace npusim::kernels {

namespace {

struct MemoryCache {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<void>> modules;
  CacheStats stats;
};

MemoryCache& memory_cache() {
  static MemoryCache cache;
  return cache;
}

// Serializes loading (compiling) so that two threads never build the same kernel at once.
std::mutex& load_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::filesystem::path default_cache_folder() {
  if (const char* dir = std::getenv("NPUSIM_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "npusim" / "kernels";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "npusim" / "kernels";
  return std::filesystem::temp_directory_path() / ("npusim-kernels-" + std::to_string(getuid()));
}

}  // namespace

CacheStats cache_stats() {
  MemoryCache& cache = memory_cache();
  std::lock_guard lock(cache.mutex);
  return cache.stats;
}

std::string cache_directory() { return default_cache_folder().string(); }

void clear_memory_cache() {
  std::lock_guard loading(load_mutex());
  MemoryCache& cache = memory_cache();
  std::lock_guard lock(cache.mutex);
  cache.modules.clear();
  cache.stats = {};
}

namespace detail {

std::string hash_hex(const std::string& text) {
  uint64_t first = 14695981039346656037ull, second = 0x84222325cbf29ce4ull;
  for (unsigned char c : text) {
    first = (first ^ c) * 1099511628211ull;
    second = (second ^ c) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  }
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(first),
                static_cast<unsigned long long>(second));
  return hex;
}

std::filesystem::path cache_folder() {
  const std::filesystem::path folder = default_cache_folder();
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error || !std::filesystem::is_directory(folder))
    fail("cannot create the kernel cache folder " + folder.string() + ": " +
         (error ? error.message() : std::string("not a directory")) + " (set NPUSIM_CACHE_DIR to a writable folder)");
  return folder;
}

std::shared_ptr<void> find_or_load(const std::string& key, const std::function<std::shared_ptr<void>()>& load) {
  MemoryCache& cache = memory_cache();
  {
    std::lock_guard lock(cache.mutex);
    if (auto it = cache.modules.find(key); it != cache.modules.end()) {
      ++cache.stats.memory_hits;
      return it->second;
    }
  }
  std::lock_guard loading(load_mutex());
  {
    std::lock_guard lock(cache.mutex);
    if (auto it = cache.modules.find(key); it != cache.modules.end()) {
      ++cache.stats.memory_hits;
      return it->second;
    }
  }
  std::shared_ptr<void> module = load();
  std::lock_guard lock(cache.mutex);
  cache.modules[key] = module;
  return module;
}

void count(CacheEvent event) {
  MemoryCache& cache = memory_cache();
  std::lock_guard lock(cache.mutex);
  ++(event == CacheEvent::Compiled ? cache.stats.compiled : cache.stats.disk_hits);
}

std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::ostringstream bytes;
  bytes << file.rdbuf();
  if (file.bad()) return std::nullopt;
  return bytes.str();
}

std::filesystem::path temporary_path(const std::filesystem::path& path) {
  static std::atomic<uint64_t> counter{0};
  return path.string() + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

void write_file_atomically(const std::filesystem::path& path, const std::string& bytes) {
  const std::filesystem::path temporary = temporary_path(path);
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!file) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      fail("cannot write " + temporary.string() + " in the kernel cache");
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    fail("cannot write " + path.string() + " in the kernel cache");
  }
}

}  // namespace detail
}  // namespace npusim::kernels
