#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "npusim/error.h"
#include "npusim/tensor.h"
#include "runtime/npy.h"
#include "runtime/safetensors.h"
#include "work_dir.h"

using namespace npusim;

namespace {

std::string fresh_dir() { return npusim::test::fresh_work_dir("safetensors") + "/"; }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string u64_le(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}

// A safetensors file from a raw header text and `data_bytes` bytes of data 0, 1, 2, ...; the header is padded
// to a multiple of 8 so that the data section is aligned.
std::string safetensors_bytes(std::string header, size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i);
  return u64_le(header.size()) + header + data;
}

// Opening `bytes` written to a file must fail with a message naming the file and containing `problem`.
void expect_open_error(const std::string& bytes, const std::string& problem) {
  const std::string path = fresh_dir() + "bad.safetensors";
  write_bytes(path, bytes);
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "no error for a file that should give: " << problem;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path, 0), 0u) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << "expected '" << problem << "' in: " << message;
  }
}

template <typename T>
Tensor make_tensor(DType dtype, Shape shape, std::initializer_list<T> values) {
  Tensor tensor(dtype, std::move(shape));
  EXPECT_EQ(static_cast<size_t>(tensor.numel()), values.size());
  std::copy(values.begin(), values.end(), tensor.mutable_data<T>());
  return tensor;
}

void expect_same_tensor(const Tensor& actual, const Tensor& expected, const std::string& name) {
  EXPECT_EQ(actual.dtype(), expected.dtype()) << name;
  EXPECT_EQ(actual.shape(), expected.shape()) << name;
  ASSERT_EQ(actual.nbytes(), expected.nbytes()) << name;
  if (expected.nbytes()) {
    EXPECT_EQ(std::memcmp(actual.bytes(), expected.bytes(), expected.nbytes()), 0) << name;
  }
}

std::vector<std::pair<std::string, Tensor>> every_dtype() {
  return {
      {"f32", make_tensor<float>(DType::Float32, {2, 3}, {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f})},
      {"u8", make_tensor<uint8_t>(DType::UInt8, {3}, {0, 127, 255})},
      {"f16", make_tensor<uint16_t>(DType::Float16, {3}, {0x3c00, 0xc000, 0x7bff})},
      {"bf16", make_tensor<uint16_t>(DType::BFloat16, {1, 3}, {0x3f80, 0xc040, 0x0001})},
      {"f64", make_tensor<double>(DType::Float64, {2}, {3.141592653589793, -1e300})},
      {"i64", make_tensor<int64_t>(DType::Int64, {}, {-9007199254740993})},
      {"i32", make_tensor<int32_t>(DType::Int32, {5}, {-2147483647 - 1, -1, 0, 1, 2147483647})},
      {"i16", make_tensor<int16_t>(DType::Int16, {3}, {-32768, 5, 32767})},
      {"i8", make_tensor<int8_t>(DType::Int8, {3}, {-128, 0, 127})},
      {"bool", make_tensor<uint8_t>(DType::Bool, {2, 2}, {1, 0, 0, 1})},
      {"empty", Tensor(DType::Float32, {0, 4})},
  };
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDtype) {
  const std::string path = fresh_dir() + "all.safetensors";
  const auto tensors = every_dtype();
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "odd sizes"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.names(),
            (std::vector<std::string>{"bf16", "bool", "empty", "f16", "f32", "f64", "i16", "i32", "i64", "i8", "u8"}));
  for (const auto& [name, expected] : tensors) {
    EXPECT_TRUE(file.contains(name));
    expect_same_tensor(file.get(name), expected, name);
  }
  EXPECT_FALSE(file.contains("missing"));
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "odd sizes"}}));
}

TEST(Safetensors, PadsHeaderToEightBytesAndAlignsEveryTensor) {
  const std::string path = fresh_dir() + "aligned.safetensors";
  // A 3-byte tensor first would misalign what follows unless the writer orders by element size.
  write_safetensors(path, {{"a", make_tensor<uint8_t>(DType::UInt8, {3}, {1, 2, 3})},
                           {"b", make_tensor<double>(DType::Float64, {1}, {2.5})},
                           {"c", make_tensor<uint16_t>(DType::Float16, {1}, {0x3c00})},
                           {"d", make_tensor<float>(DType::Float32, {1}, {4.0f})}});
  const std::string bytes = read_bytes(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_size + 3 + 8 + 2 + 4);
  EXPECT_EQ(bytes.substr(8 + header_size - 1, 1), " ");  // padded with spaces

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.entry("b").begin, 0u);
  EXPECT_EQ(file.entry("d").begin, 8u);
  EXPECT_EQ(file.entry("c").begin, 12u);
  EXPECT_EQ(file.entry("a").begin, 14u);
  EXPECT_EQ(file.get("b").data<double>()[0], 2.5);
  EXPECT_EQ(file.get("d").data<float>()[0], 4.0f);
  EXPECT_EQ(file.get("a").data<uint8_t>()[2], 3);
}

TEST(Safetensors, BorrowsTheMappingAndKeepsItAlive) {
  const std::string path = fresh_dir() + "borrow.safetensors";
  write_safetensors(path, {{"w", make_tensor<float>(DType::Float32, {4}, {1.0f, 2.0f, 3.0f, 4.0f})}});
  Tensor borrowed;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    borrowed = file.get("w");
    // The data pointer lies inside a read-only mapping of this file.
    std::ifstream maps("/proc/self/maps");
    std::string line;
    bool inside_mapping = false;
    const auto address = reinterpret_cast<uintptr_t>(borrowed.bytes());
    while (std::getline(maps, line)) {
      if (line.find(path) == std::string::npos) continue;
      uintptr_t begin = 0, end = 0;
      char dash = 0;
      std::istringstream fields(line);
      fields >> std::hex >> begin >> dash >> end;
      if (address >= begin && address + borrowed.nbytes() <= end) inside_mapping = true;
    }
    EXPECT_TRUE(inside_mapping) << "tensor data is not inside the mapping of " << path;
  }
  EXPECT_THROW(borrowed.mutable_bytes(), Error);
  EXPECT_TRUE(borrowed.borrowed());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(borrowed.data<float>()[i], static_cast<float>(i + 1));
  // A clone owns its bytes.
  Tensor copy = borrowed.clone();
  EXPECT_FALSE(copy.borrowed());
  EXPECT_NE(copy.bytes(), borrowed.bytes());
  copy.mutable_data<float>()[0] = 9.0f;
  EXPECT_EQ(borrowed.data<float>()[0], 1.0f);
}

TEST(Tensors, LargeTensorsAreZeroedAndAlignedToHugePages) {
  for (const Shape& shape : {Shape{1 << 19}, Shape{(1 << 19) + 3}, Shape{3, 1 << 20}}) {
    Tensor t(DType::Float32, shape);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.bytes()) % (uintptr_t{2} << 20), 0u) << shape_string(shape);
    const float* values = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(values[i], 0.0f) << i;
    t.mutable_data<float>()[t.numel() - 1] = 1.0f;  // the last byte is writable
    const Tensor copy = t.clone();
    EXPECT_EQ(copy.data<float>()[t.numel() - 1], 1.0f);
    EXPECT_FALSE(t.borrowed());
  }
}

TEST(Safetensors, CopiesUnalignedTensors) {
  // u8 [1] at [0, 1), then f32 [2] at [1, 9): the floats sit at an odd address inside the mapping.
  const std::string header =
      R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  std::string bytes = safetensors_bytes(header, 9);
  const float values[2] = {1.5f, -3.0f};
  std::memcpy(bytes.data() + bytes.size() - 8, values, 8);
  const std::string path = fresh_dir() + "unaligned.safetensors";
  write_bytes(path, bytes);

  const Tensor f = SafetensorsFile::open(path).get("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.bytes()) % alignof(float), 0u);
  EXPECT_EQ(f.shape(), (Shape{2}));
  EXPECT_EQ(f.data<float>()[0], 1.5f);
  EXPECT_EQ(f.data<float>()[1], -3.0f);
}

TEST(Safetensors, ReadsTheQwenTinyFixture) {
  const SafetensorsFile file = SafetensorsFile::open(NPUSIM_TEST_DATA "/fixtures/qwen_tiny/model.safetensors");
  EXPECT_EQ(file.names().size(), 26u);
  EXPECT_FALSE(file.contains("lm_head.weight"));
  const Tensor embed = file.get("model.embed_tokens.weight");
  EXPECT_EQ(embed.dtype(), DType::Float32);
  EXPECT_EQ(embed.shape(), (Shape{512, 64}));
  EXPECT_FLOAT_EQ(embed.data<float>()[0], -0.005770312622189522f);
  EXPECT_FLOAT_EQ(embed.data<float>()[1], 0.03547132760286331f);
  const Tensor norm = file.get("model.norm.weight");
  for (int64_t i = 0; i < norm.numel(); ++i) EXPECT_EQ(norm.data<float>()[i], 1.0f);
}

TEST(Safetensors, AcceptsMetadataAndEmptyTensors) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},)"
      R"("w":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})";
  const std::string path = fresh_dir() + "meta.safetensors";
  write_bytes(path, safetensors_bytes(header, 4));
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"e", "w"}));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.get("e").numel(), 0);
  EXPECT_EQ(file.get("e").shape(), (Shape{0, 3}));
  EXPECT_EQ(file.get("w").data<int32_t>()[0], 0x03020100);
}

TEST(Safetensors, RejectsMalformedFiles) {
  expect_open_error("", "too short");
  expect_open_error("abc", "too short");
  expect_open_error(u64_le(1000) + "{}", "larger than the file");
  expect_open_error(u64_le(uint64_t{1} << 40) + "{}", "absurd");
  expect_open_error(safetensors_bytes("{not json", 0), "not valid JSON");
  expect_open_error(safetensors_bytes("[1, 2]", 0), "must be a JSON object");
  expect_open_error(safetensors_bytes(R"({"w": 3})", 0), "tensor 'w': entry must be a JSON object");
  expect_open_error(safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), "tensor 'w': missing 'dtype'");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4),
                    "tensor 'w': missing 'shape'");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", 4), "tensor 'w': missing 'data_offsets'");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
                    "tensor 'w': unknown dtype 'F8_E4M3'");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":3,"shape":[1],"data_offsets":[0,4]}})", 4),
                    "tensor 'w': 'dtype' must be a string");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,4]}})", 4),
                    "tensor 'w': negative dimension -1");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
                    "tensor 'w': dimension must be an integer");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,4]}})", 4),
                    "tensor 'w': 'shape' must be a list");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
                    "tensor 'w': data_offsets [8, 4] are reversed");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8),
                    "tensor 'w': 'data_offsets' must be [begin, end]");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                    "tensor 'w': data_offsets end 16 is past the end of the data section (8 bytes)");
  expect_open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                    "tensor 'w': byte size 8");
  expect_open_error(
      safetensors_bytes(R"({"w":{"dtype":"I64","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8),
      "tensor 'w': shape [4611686018427387904, 4] overflows");
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                      12),
                    "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]");
  expect_open_error(safetensors_bytes(R"({"__metadata__":{"n":1}})", 0), "__metadata__ entry 'n' must be a string");
  expect_open_error(safetensors_bytes(R"({"__metadata__":[1]})", 0), "__metadata__ must be an object");
}

TEST(Safetensors, ReportsMissingFilesAndUnknownNames) {
  const std::string dir = fresh_dir();
  try {
    SafetensorsFile::open(dir + "absent.safetensors");
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "absent.safetensors: cannot open"), std::string::npos) << e.what();
  }
  const std::string path = dir + "one.safetensors";
  write_safetensors(path, {{"w", Tensor(DType::Float32, {1})}});
  try {
    SafetensorsFile::open(path).get("v");
    ADD_FAILURE() << "found a tensor that is not there";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": no tensor named 'v'"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  const std::string path = fresh_dir() + "bad_write.safetensors";
  EXPECT_THROW(write_safetensors(path, {{"w", Tensor(DType::Float32, {1})}, {"w", Tensor(DType::Float32, {2})}}),
               Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", Tensor(DType::Float32, {1})}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"w", Tensor::borrow(DType::Float32, {2}, nullptr, nullptr)}}), Error);
}

TEST(Safetensors, OverwritingKeepsEarlierBorrowsIntact) {
  const std::string path = fresh_dir() + "rewrite.safetensors";
  write_safetensors(path, {{"w", make_tensor<float>(DType::Float32, {2}, {1.0f, 2.0f})}});
  const Tensor first = SafetensorsFile::open(path).get("w");
  write_safetensors(path, {{"w", make_tensor<float>(DType::Float32, {2}, {5.0f, 6.0f})}});
  EXPECT_EQ(first.data<float>()[0], 1.0f);
  EXPECT_EQ(first.data<float>()[1], 2.0f);
  EXPECT_EQ(SafetensorsFile::open(path).get("w").data<float>()[1], 6.0f);
}

// ---- npy ----

namespace {

std::string npy_bytes(int major, const std::string& header_dict, const std::string& data) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  std::string header = header_dict;
  const size_t preamble = 8 + length_bytes;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const uint32_t size = static_cast<uint32_t>(header.size());
  bytes.append(reinterpret_cast<const char*>(&size), length_bytes);
  return bytes + header + data;
}

void expect_npy_error(const std::string& bytes, const std::string& problem) {
  const std::string path = fresh_dir() + "bad.npy";
  write_bytes(path, bytes);
  try {
    read_npy(path);
    ADD_FAILURE() << "no error for a file that should give: " << problem;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path, 0), 0u) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << "expected '" << problem << "' in: " << message;
  }
}

}  // namespace

TEST(Npy, RoundTripsEverySupportedDtype) {
  const std::string dir = fresh_dir();
  for (const auto& [name, tensor] : every_dtype()) {
    if (tensor.dtype() == DType::BFloat16) continue;
    const std::string path = dir + name + ".npy";
    write_npy(path, tensor);
    expect_same_tensor(read_npy(path), tensor, name);
  }
}

TEST(Npy, WritesTheSameBytesAsNumpy) {
  // np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)): a 118-byte header padded to 128 bytes in all.
  const std::string path = fresh_dir() + "numpy.npy";
  write_npy(path, make_tensor<float>(DType::Float32, {2, 3}, {0, 1, 2, 3, 4, 5}));
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 128u + 24u);
  EXPECT_EQ(bytes.substr(0, 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes.substr(10 + dict.size(), 128 - 11 - dict.size()), std::string(128 - 11 - dict.size(), ' '));
  EXPECT_EQ(bytes[127], '\n');

  write_npy(path, make_tensor<uint8_t>(DType::Bool, {}, {1}));
  const std::string scalar_dict = "{'descr': '|b1', 'fortran_order': False, 'shape': (), }";
  EXPECT_EQ(read_bytes(path).substr(10, scalar_dict.size()), scalar_dict);
  EXPECT_EQ(read_bytes(path).size(), 129u);
}

TEST(Npy, ReadsVersionsOneToThreeAndOneElementTuples) {
  const std::string dir = fresh_dir();
  const int32_t values[3] = {7, -8, 9};
  const std::string data(reinterpret_cast<const char*>(values), sizeof values);
  for (int major : {1, 2, 3}) {
    const std::string path = dir + "v" + std::to_string(major) + ".npy";
    write_bytes(path, npy_bytes(major, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", data));
    const Tensor t = read_npy(path);
    EXPECT_EQ(t.dtype(), DType::Int32);
    EXPECT_EQ(t.shape(), (Shape{3}));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t.data<int32_t>()[i], values[i]) << "version " << major;
  }
  // Key order is free, double quotes and Python 2 long suffixes occur in old files.
  const std::string path = dir + "old.npy";
  write_bytes(path, npy_bytes(1, "{\"shape\": (1L, 3L), \"fortran_order\": False, \"descr\": \"<i4\"}", data));
  EXPECT_EQ(read_npy(path).shape(), (Shape{1, 3}));
}

TEST(Npy, RejectsBadFiles) {
  const std::string four_floats(16, '\0');
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
  expect_npy_error("", "bad magic");
  expect_npy_error("\x93NUMPX\x01\x00", "bad magic");
  expect_npy_error(std::string("\x93NUMPY\x01", 7), "truncated");
  expect_npy_error(std::string("\x93NUMPY\x01\x00\x76", 9), "truncated");
  expect_npy_error(npy_bytes(1, dict, four_floats).substr(0, 40), "truncated npy file (header");
  expect_npy_error(npy_bytes(1, dict, four_floats.substr(0, 12)), "truncated npy file (12 bytes of data, 16 expected");
  expect_npy_error(npy_bytes(4, dict, four_floats), "unsupported npy format version 4.0");
  expect_npy_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four_floats),
                   "fortran_order");
  expect_npy_error(npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", four_floats),
                   "big-endian dtype '>f4'");
  expect_npy_error(npy_bytes(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", four_floats),
                   "unsupported dtype '<c8'");
  expect_npy_error(npy_bytes(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", four_floats),
                   "structured dtypes");
  expect_npy_error(npy_bytes(1, "{'descr': '<f4', 'shape': (4,), }", four_floats), "missing 'fortran_order'");
  expect_npy_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, -1), }", four_floats),
                   "malformed npy header");
  expect_npy_error(npy_bytes(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,), }", four_floats),
                   "expected True or False");
}

TEST(Npy, RefusesBfloat16) {
  const std::string path = fresh_dir() + "bf16.npy";
  try {
    write_npy(path, Tensor(DType::BFloat16, {2}));
    ADD_FAILURE() << "bfloat16 written to npy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
}
