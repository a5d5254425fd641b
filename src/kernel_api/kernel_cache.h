#pragma once
// Compiled kernels, kept in memory (loaded modules) and on disk (the source beside the binary built from it).
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace npusim::kernels::detail {

// A 128-bit FNV-1a hash as 32 hex digits.
std::string hash_hex(const std::string& text);

// The disk cache folder, created when missing. Fails naming the folder when it cannot be created.
std::filesystem::path cache_folder();

// Loaded modules by key (a device prefix and the hash). `load` runs at most once per key at a time; a module
// stays loaded until clear_memory_cache().
std::shared_ptr<void> find_or_load(const std::string& key, const std::function<std::shared_ptr<void>()>& load);

enum class CacheEvent { Compiled, DiskHit };
void count(CacheEvent event);

// Reads a whole file, or nothing when it does not exist or cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& path);
// Writes bytes to a temporary file beside `path` and renames it over `path`, so readers never see half a file.
void write_file_atomically(const std::filesystem::path& path, const std::string& bytes);
// A fresh name for a temporary file beside `path`.
std::filesystem::path temporary_path(const std::filesystem::path& path);

}  // namespace npusim::kernels::detail
