// The tokenizer.json reader (byte-level BPE), then encoding and decoding with every tokenizer it accepts.
// Errors (npusim::Error) are expected; anything else, or a tokenizer that cannot decode what it encoded, is a
// finding.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "llm/tokenizer.h"
#include "npusim/error.h"

namespace {

// Plain and special text, invalid UTF-8, combining marks (NFC), digits, contractions and newlines.
const char* const kTexts[] = {
    "Hello world! It's 2024.\n\n  tabs\tand spaces ",
    "<|im_start|>user\nhi<|im_end|><|endoftext|>",
    "na\xc3\xafve e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
    "\xff\xfe\x80 broken \xe2\x82",
    "",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const npusim::Tokenizer tokenizer =
        npusim::Tokenizer::parse(std::string(reinterpret_cast<const char*>(data), size), "tokenizer.json");
    for (const char* text : kTexts) {
      for (bool add_special : {false, true}) {
        const std::vector<int32_t> ids = tokenizer.encode(text, add_special);
        for (int32_t id : ids) npusim::fuzz::require(id >= 0 && id < tokenizer.vocab_size());
        tokenizer.decode(ids);
        tokenizer.decode(ids, true);
      }
    }
    const auto last = static_cast<int32_t>(tokenizer.vocab_size() - 1);
    tokenizer.decode(std::vector<int32_t>{0, last, last + 1, 2147483647});
    npusim::TokenStreamDecoder stream(tokenizer);
    for (int32_t id : tokenizer.encode(kTexts[2], false)) stream.push(id);
  } catch (const npusim::Error&) {
  }
  return 0;
}
