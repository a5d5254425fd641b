#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <system_error>

#include "core/json_text.h"
#include "core/mapped_file.h"

namespace npusim {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Deeper nesting is refused while parsing: the walks over the tree (and dump() in messages) recurse.
struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::Float32}, {"F16", DType::Float16}, {"BF16", DType::BFloat16}, {"F64", DType::Float64},
    {"I64", DType::Int64},   {"I32", DType::Int32},   {"I16", DType::Int16},     {"I8", DType::Int8},
    {"U8", DType::UInt8},    {"BOOL", DType::Bool},
};

std::optional<DType> parse_safetensors_dtype(const std::string& text) {
  for (const auto& entry : kDTypeNames)
    if (text == entry.name) return entry.dtype;
  return std::nullopt;
}

class EntryParser {
 public:
  EntryParser(const std::string& path, const std::string& name, size_t data_size)
      : prefix_(path + ": tensor '" + name + "': "), data_size_(data_size) {}

  SafetensorsEntry parse(const nlohmann::json& json) const {
    if (!json.is_object()) error("entry must be a JSON object, got " + std::string(json.type_name()));
    SafetensorsEntry entry;
    entry.dtype = parse_dtype_field(field(json, "dtype"));
    entry.shape = parse_shape(field(json, "shape"));
    std::tie(entry.begin, entry.end) = parse_offsets(field(json, "data_offsets"));
    check_byte_size(entry);
    return entry;
  }

 private:
  [[noreturn]] void error(const std::string& problem) const { fail(prefix_ + problem); }

  const nlohmann::json& field(const nlohmann::json& json, const char* key) const {
    auto it = json.find(key);
    if (it == json.end()) error(std::string("missing '") + key + "'");
    return *it;
  }

  DType parse_dtype_field(const nlohmann::json& json) const {
    if (!json.is_string()) error("'dtype' must be a string, got " + json.dump());
    const auto dtype = parse_safetensors_dtype(json.get<std::string>());
    if (!dtype)
      error("unknown dtype '" + json.get<std::string>() +
            "' (supported: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)");
    return *dtype;
  }

  int64_t parse_count(const nlohmann::json& json, const char* what) const {
    if (json.is_number_unsigned()) {
      if (json.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        error(std::string(what) + " " + json.dump() + " is too large");
      return static_cast<int64_t>(json.get<uint64_t>());
    }
    if (json.is_number_integer()) {
      const int64_t value = json.get<int64_t>();
      if (value < 0) error(std::string("negative ") + what + " " + std::to_string(value));
      return value;
    }
    error(std::string(what) + " must be an integer, got " + json.dump());
  }

  Shape parse_shape(const nlohmann::json& json) const {
    if (!json.is_array()) error("'shape' must be a list of integers, got " + json.dump());
    Shape shape;
    for (const auto& dim : json) shape.push_back(parse_count(dim, "dimension"));
    return shape;
  }

  std::pair<size_t, size_t> parse_offsets(const nlohmann::json& json) const {
    if (!json.is_array() || json.size() != 2) error("'data_offsets' must be [begin, end], got " + json.dump());
    const auto begin = static_cast<uint64_t>(parse_count(json[0], "data offset"));
    const auto end = static_cast<uint64_t>(parse_count(json[1], "data offset"));
    if (begin > end)
      error("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] are reversed (begin > end)");
    if (end > data_size_)
      error("data_offsets end " + std::to_string(end) + " is past the end of the data section (" +
            std::to_string(data_size_) + " bytes)");
    return {static_cast<size_t>(begin), static_cast<size_t>(end)};
  }

  void check_byte_size(const SafetensorsEntry& entry) const {
    uint64_t numel = 1;
    for (int64_t dim : entry.shape) {
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim))
        error("shape " + shape_string(entry.shape) + " overflows");
      numel *= static_cast<uint64_t>(dim);
    }
    const uint64_t element = dtype_size(entry.dtype);
    const uint64_t actual = entry.end - entry.begin;
    if (numel > std::numeric_limits<uint64_t>::max() / element || numel * element != actual)
      error("byte size " + std::to_string(actual) + " (data_offsets [" + std::to_string(entry.begin) + ", " +
            std::to_string(entry.end) + "]) does not match shape " + shape_string(entry.shape) + " of " +
            safetensors_dtype_name(entry.dtype) + " (" + std::to_string(numel) + " elements of " +
            std::to_string(element) + " bytes)");
  }

  std::string prefix_;
  size_t data_size_;
};

std::map<std::string, std::string> parse_metadata(const std::string& path, const nlohmann::json& json) {
  if (!json.is_object()) fail(path + ": __metadata__ must be an object of strings, got " + json.dump());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : json.items()) {
    if (!value.is_string()) fail(path + ": __metadata__ entry '" + key + "' must be a string, got " + value.dump());
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

void check_no_overlap(const std::string& path, const std::map<std::string, SafetensorsEntry>& entries) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> ranges;
  for (const auto& [name, entry] : entries)
    if (entry.end > entry.begin) ranges.emplace_back(&name, &entry);
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [previous_name, previous] = ranges[i - 1];
    const auto& [name, entry] = ranges[i];
    if (entry->begin < previous->end)
      fail(path + ": tensor '" + *name + "': data_offsets [" + std::to_string(entry->begin) + ", " +
           std::to_string(entry->end) + "] overlap tensor '" + *previous_name + "' [" +
           std::to_string(previous->begin) + ", " + std::to_string(previous->end) + "]");
  }
}

uint64_t read_u64_le(const std::byte* bytes) {
  uint64_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  for (const auto& entry : kDTypeNames)
    if (entry.dtype == dtype) return entry.name;
  fail("dtype " + std::string(dtype_name(dtype)) + " has no safetensors name");
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail(path + ": cannot write: " + std::strerror(errno));
    write(out);
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      fail(path + ": write failed: " + std::strerror(errno));
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    fail(path + ": cannot rename the written file into place: " + error.message());
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto mapping = std::make_shared<const MappedFile>(path);
  const size_t size = mapping->size();
  if (size < 8)
    fail(path + ": file is too short for a safetensors header (" + std::to_string(size) + " bytes, at least 8 needed)");
  const uint64_t header_bytes = read_u64_le(mapping->data());
  if (header_bytes > kMaxHeaderBytes)
    fail(path + ": header length " + std::to_string(header_bytes) +
         " is absurd (over 100 MB); this is not a safetensors file");
  if (header_bytes > size - 8)
    fail(path + ": header length " + std::to_string(header_bytes) + " is larger than the file (" +
         std::to_string(size) + " bytes)");

  const char* header_begin = reinterpret_cast<const char*>(mapping->data() + 8);
  const nlohmann::json header = parse_json_text(std::string_view(header_begin, header_bytes), path, "header");
  if (!header.is_object()) fail(path + ": header must be a JSON object, got " + std::string(header.type_name()));

  SafetensorsFile file;
  file.path_ = path;
  file.data_section_ = mapping->data() + 8 + header_bytes;
  const size_t data_size = size - 8 - static_cast<size_t>(header_bytes);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      file.metadata_ = parse_metadata(path, value);
      continue;
    }
    file.entries_[name] = EntryParser(path, name, data_size).parse(value);
  }
  check_no_overlap(path, file.entries_);
  file.mapping_ = std::move(mapping);
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) result.push_back(name);
  return result;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    fail(path_ + ": no tensor named '" + name + "' (the file has " + std::to_string(entries_.size()) + " tensors)");
  return it->second;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry& found = entry(name);
  const std::byte* data = data_section_ + found.begin;
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(found.dtype) == 0)
    return Tensor::borrow(found.dtype, found.shape, data, mapping_);
  Tensor copy(found.dtype, found.shape);
  if (copy.nbytes()) std::memcpy(copy.mutable_bytes(), data, copy.nbytes());
  return copy;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") fail(path + ": '__metadata__' cannot be a tensor name");
    if (!seen.insert(name).second) fail(path + ": tensor '" + name + "' is given twice");
    if (!tensor.defined()) fail(path + ": tensor '" + name + "' has no data");
    safetensors_dtype_name(tensor.dtype());
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype()) > dtype_size(tensors[b].second.dtype());
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (size_t index : order) {
    const auto& [name, tensor] = tensors[index];
    header[name] = {{"dtype", safetensors_dtype_name(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + tensor.nbytes()}}};
    offset += tensor.nbytes();
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  write_file_atomically(path, [&](std::ostream& out) {
    const uint64_t header_size = header_text.size();
    out.write(reinterpret_cast<const char*>(&header_size), sizeof header_size);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (size_t index : order) {
      const Tensor& tensor = tensors[index].second;
      if (tensor.nbytes())
        out.write(reinterpret_cast<const char*>(tensor.bytes()), static_cast<std::streamsize>(tensor.nbytes()));
    }
  });
}

}  // namespace npusim
