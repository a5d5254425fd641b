#pragma once
// Reading and writing the .safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the raw data.
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "npusim/dtype.h"
#include "npusim/tensor.h"

namespace npusim {

// One tensor as the header describes it; offsets are relative to the start of the data section.
struct SafetensorsEntry {
  DType dtype = DType::Float32;
  Shape shape;
  size_t begin = 0;
  size_t end = 0;
};

class MappedFile;

// A memory-mapped, fully validated safetensors file. Tensors returned by `get` borrow the mapping and keep
// it alive, so they stay valid after the SafetensorsFile is gone.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // A read-only view into the mapping; a copy when the data is not aligned for its dtype.
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::shared_ptr<const MappedFile> mapping_;
  const std::byte* data_section_ = nullptr;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes the tensors (names must be unique) with the header padded by spaces to a multiple of 8 bytes, as the
// reference Python library does. Data is laid out widest dtype first so that every tensor is aligned.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a file through a temporary next to it, renamed into place once complete, so that readers which mapped
// the previous version keep seeing intact bytes. Errors name the path.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// The safetensors spelling of a dtype ("F32", "BF16", ...).
std::string safetensors_dtype_name(DType dtype);

}  // namespace npusim
