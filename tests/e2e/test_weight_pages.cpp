// The weights file's pages once a CPU session is built on the qwen_tiny fixture (fp32 weights): a session that reads
// its linear weights in another form (int8), or the whole model from a copy (fp32 in the process's own memory, bf16
// converted), gives the mapping's pages back; they come back from the file where a kernel still reads a weight itself
// (the embedding rows a prompt looks up), and the logits do not change.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "llm/model_dir.h"
#include "llm/session.h"
#include "qwen_tiny.h"
#include "runtime/compare.h"
#include "runtime/safetensors.h"

namespace npusim {
namespace {

const ModelDir& tiny() {
  static const ModelDir model = test::copy_of_qwen_tiny("pages/qwen_tiny");
  return model;
}

// The bytes of the mapping that holds `address` resident in this process (its Rss in /proc/self/smaps).
size_t resident_bytes_of_mapping(const std::byte* address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto at = reinterpret_cast<uintptr_t>(address);
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      size_t kilobytes = 0;
      fields >> kilobytes;
      return kilobytes * 1024;
    }
  }
  ADD_FAILURE() << "no mapping holds " << static_cast<const void*>(address);
  return 0;
}

// Reads every tensor of the fixture's weights file in place; returns an address in its mapping.
const std::byte* touch_every_weight() {
  const SafetensorsFile& file = tiny().weights().files().at(0);
  const std::byte* mapped = nullptr;
  unsigned sum = 0;
  for (const std::string& name : file.names()) {
    const Tensor t = file.get(name);
    if (!t.borrowed()) continue;
    mapped = t.bytes();
    for (size_t i = 0; i < t.nbytes(); ++i) sum += static_cast<unsigned>(t.bytes()[i]);
  }
  EXPECT_NE(sum, 0u);
  return mapped;
}

// Builds a session with `options` after every weight was read, and returns the mapping's resident bytes before and
// after.
std::pair<size_t, size_t> resident_around_session(const SessionOptions& options) {
  const std::byte* mapped = touch_every_weight();
  if (!mapped) return {};
  const size_t before = resident_bytes_of_mapping(mapped);
  const Session session(tiny(), options);
  return {before, resident_bytes_of_mapping(mapped)};
}

TEST(WeightPages, AnInt8SessionGivesBackItsLinearWeights) {
  SessionOptions int8{.context = 64, .dtype = DType::Float32, .threads = 1};
  int8.quantize = WeightQuantization::Int8;
  const auto [before, after] = resident_around_session(int8);
  EXPECT_GT(before, 400u << 10);
  EXPECT_LT(after, before / 4) << before << " bytes resident before the session";

  const std::vector<int32_t> tokens = test::qwen_tiny_prompt();
  Session quantized(tiny(), int8);
  const Comparison c = compare_tensors(test::logits_tensor(quantized.feed(tokens)),
                                       test::logits_tensor(Session(tiny(), {.context = 64}).feed(tokens)));
  EXPECT_GT(c.pearson, 0.999) << c.summary();
}

TEST(WeightPages, ASessionOnACopyGivesBackTheMapping) {
  for (const DType dtype : {DType::Float32, DType::BFloat16}) {
    const auto [before, after] = resident_around_session({.context = 64, .dtype = dtype, .threads = 1});
    EXPECT_GT(before, 400u << 10) << dtype_name(dtype);
    EXPECT_LT(after, before / 4) << dtype_name(dtype) << ": " << before << " bytes resident before the session";
  }
}

}  // namespace
}  // namespace npusim
