#include "runtime/npy.h"

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/safetensors.h"

namespace npusim {

static_assert(std::endian::native == std::endian::little, "npy data is read as little-endian");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kAlignment = 64;

struct NpyDTypeName {
  const char* descr;
  DType dtype;
};
constexpr NpyDTypeName kNpyDTypes[] = {
    {"<f4", DType::Float32}, {"<f8", DType::Float64}, {"<f2", DType::Float16},
    {"<i8", DType::Int64},   {"<i4", DType::Int32},   {"<i2", DType::Int16},
    {"|i1", DType::Int8},    {"|u1", DType::UInt8},   {"|b1", DType::Bool},
};

std::optional<DType> parse_descr(std::string descr) {
  // Single-byte types have no byte order; numpy writes '|' but '<' and '=' mean the same.
  if (descr.size() == 3 && descr[2] == '1' && (descr[0] == '<' || descr[0] == '=')) descr[0] = '|';
  if (descr.size() == 3 && descr[0] == '=') descr[0] = '<';
  for (const auto& entry : kNpyDTypes)
    if (descr == entry.descr) return entry.dtype;
  return std::nullopt;
}

std::string npy_descr(DType dtype) {
  for (const auto& entry : kNpyDTypes)
    if (entry.dtype == dtype) return entry.descr;
  return "";
}

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// Parses the Python dict literal of an npy header: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  NpyHeader parse() {
    NpyHeader header;
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (true) {
      if (peek() == '}') break;
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"') error("structured dtypes are not supported");
        header.descr = parse_string();
        has_descr = true;
      } else if (key == "fortran_order") {
        header.fortran_order = parse_bool();
        has_order = true;
      } else if (key == "shape") {
        header.shape = parse_shape();
        has_shape = true;
      } else {
        error("unexpected key '" + key + "'");
      }
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') error("expected ',' or '}'");
    }
    if (!has_descr) error("missing 'descr'");
    if (!has_order) error("missing 'fortran_order'");
    if (!has_shape) error("missing 'shape'");
    return header;
  }

 private:
  [[noreturn]] void error(const std::string& problem) const {
    // The header ends in padding and a newline; the message stays on one line.
    const size_t end = text_.find_last_not_of(" \n");
    fail(path_ + ": malformed npy header (" + problem + " at offset " + std::to_string(pos_) +
         "): " + std::string(text_.substr(0, end == std::string_view::npos ? 0 : end + 1)));
  }

  char peek() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }

  void expect(char c) {
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }

  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a quoted string");
    const size_t close = text_.find(quote, pos_ + 1);
    if (close == std::string_view::npos) error("unterminated string");
    std::string value(text_.substr(pos_ + 1, close - pos_ - 1));
    pos_ = close + 1;
    return value;
  }

  bool parse_bool() {
    peek();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const std::string_view literal(word);
      if (text_.substr(pos_, literal.size()) == literal) {
        pos_ += literal.size();
        return value;
      }
    }
    error("expected True or False");
  }

  int64_t parse_int() {
    peek();
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const int digit = text_[pos_++] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) error("dimension too large");
      value = value * 10 + digit;
    }
    if (pos_ == start) error("expected a non-negative integer");
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
    return value;
  }

  Shape parse_shape() {
    Shape shape;
    expect('(');
    while (peek() != ')') {
      shape.push_back(parse_int());
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        error("expected ',' or ')' in shape");
      }
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& path_;
  size_t pos_ = 0;
};

std::vector<char> read_whole_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail(path + ": is a directory, not an npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path + ": cannot open: " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path + ": read failed");
  return bytes;
}

uint32_t read_le(const char* bytes, size_t count) {
  uint32_t value = 0;
  for (size_t i = 0; i < count; ++i) value |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}

std::string python_tuple(const Shape& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) text += ",";
  return text + ")";
}

}  // namespace

Tensor read_npy(const std::string& path) {
  const std::vector<char> bytes = read_whole_file(path);
  if (bytes.size() < kMagicSize || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0)
    fail(path + ": not an npy file (bad magic; expected \\x93NUMPY)");
  if (bytes.size() < kMagicSize + 2) fail(path + ": truncated npy file (no version)");
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(path + ": unsupported npy format version " + std::to_string(major) + "." + std::to_string(minor) +
         " (1.0, 2.0 and 3.0 are supported)");
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t preamble = kMagicSize + 2 + length_bytes;
  if (bytes.size() < preamble) fail(path + ": truncated npy file (no header length)");
  const size_t header_size = read_le(bytes.data() + kMagicSize + 2, length_bytes);
  if (bytes.size() < preamble + header_size)
    fail(path + ": truncated npy file (header of " + std::to_string(header_size) + " bytes, file has " +
         std::to_string(bytes.size()) + ")");

  const NpyHeader header = HeaderParser(std::string_view(bytes.data() + preamble, header_size), path).parse();
  if (header.fortran_order) fail(path + ": fortran_order arrays are not supported (save a C-contiguous array)");
  if (!header.descr.empty() && header.descr[0] == '>')
    fail(path + ": big-endian dtype '" + header.descr + "' is not supported");
  const auto dtype = parse_descr(header.descr);
  if (!dtype)
    fail(path + ": unsupported dtype '" + header.descr + "' (supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1)");

  const size_t available = bytes.size() - preamble - header_size;
  size_t needed = dtype_size(*dtype);
  for (int64_t dim : header.shape) {
    const auto extent = static_cast<size_t>(dim);
    if (extent != 0 && needed > std::numeric_limits<size_t>::max() / extent)
      fail(path + ": shape " + shape_string(header.shape) + " is too large");
    needed *= extent;
  }
  if (available < needed)
    fail(path + ": truncated npy file (" + std::to_string(available) + " bytes of data, " + std::to_string(needed) +
         " expected for shape " + shape_string(header.shape) + " of " + header.descr + ")");
  Tensor tensor(*dtype, header.shape);
  if (tensor.nbytes()) std::memcpy(tensor.mutable_bytes(), bytes.data() + preamble + header_size, tensor.nbytes());
  return tensor;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  const std::string descr = npy_descr(tensor.dtype());
  if (descr.empty()) fail(path + ": dtype " + std::string(dtype_name(tensor.dtype())) + " cannot be stored in npy");
  if (!tensor.defined()) fail(path + ": tensor has no data");
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + python_tuple(tensor.shape()) + ", }";
  const bool wide = header.size() + 1 + kMagicSize + 4 > 65535;
  const size_t preamble = kMagicSize + 2 + (wide ? 4 : 2);
  header.append((kAlignment - (preamble + header.size() + 1) % kAlignment) % kAlignment, ' ');
  header += '\n';

  write_file_atomically(path, [&](std::ostream& out) {
    out.write(kMagic, kMagicSize);
    const char version[2] = {static_cast<char>(wide ? 2 : 1), 0};
    out.write(version, 2);
    const uint32_t size = static_cast<uint32_t>(header.size());
    out.write(reinterpret_cast<const char*>(&size), wide ? 4 : 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    if (tensor.nbytes())
      out.write(reinterpret_cast<const char*>(tensor.bytes()), static_cast<std::streamsize>(tensor.nbytes()));
  });
}

}  // namespace npusim
