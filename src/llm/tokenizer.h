#pragma once
// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2, Qwen2, Llama 3 families).
//
// Encoding follows the Hugging Face `tokenizers` pipeline: added tokens found in the text (such as <|im_start|>)
// become their ids first (all of them matched on the raw text); the text between them is normalized (NFC when the
// file asks for it), split by the pre-tokenizer pattern, and each piece is BPE-encoded over its UTF-8 bytes, so
// any byte string, valid UTF-8 or not, encodes and decodes back. Decoding concatenates token bytes;
// TokenStreamDecoder releases text only in complete UTF-8 characters. Supported files: model BPE, normalizer NFC
// or none, pre-tokenizer ByteLevel with the GPT-2, Qwen2 or Llama 3 split pattern, decoder ByteLevel,
// post-processor ByteLevel/TemplateProcessing; anything else is an error naming the field.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llm/utf8_stream.h"

namespace npusim {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool single_word = false;  // only matches where it is not part of a longer word
  bool normalized = false;
};

class Tokenizer {
 public:
  // Reads tokenizer.json (`path` is the file or the model directory holding it) and, when one lies beside it,
  // tokenizer_config.json for the names of the bos/eos/pad tokens.
  static Tokenizer load(const std::string& path);
  // The same from file contents; `config_json` may be empty (no tokenizer_config.json). The sources name the
  // origins in error messages.
  static Tokenizer parse(const std::string& tokenizer_json, const std::string& source,
                         const std::string& config_json = "", const std::string& config_source = "");

  // Token ids of `text`. Added and special tokens written in the text become their ids, as in Hugging Face.
  // With `add_special`, the post-processor's template is applied (Llama 3 puts <|begin_of_text|> in front; Qwen2
  // adds nothing); a rendered chat prompt already holds its special tokens, so pass false for it.
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;

  // The text of `ids`; bytes that do not form valid UTF-8 become U+FFFD. Ids without a token (the padding rows of
  // an embedding larger than the vocabulary) decode to nothing; a negative id is an error.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes of one token: may be part of a UTF-8 character; empty for an id without a token.
  std::string_view token_bytes(int32_t id) const;
  // The token as tokenizer.json spells it ("Ġthe" for " the"); empty for an id without a token.
  const std::string& token_string(int32_t id) const;
  // The id of the token spelled `token` in tokenizer.json (model.vocab or added_tokens).
  std::optional<int32_t> token_id(std::string_view token) const;

  // One more than the largest token id.
  int64_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  // From tokenizer_config.json when it names them.
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  const std::string& source() const;

  struct State;

 private:
  explicit Tokenizer(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;  // immutable after loading, so copies share it
};

// Decodes tokens one at a time as a model generates them, returning text only in complete UTF-8 characters (an
// emoji split over two tokens comes out whole with the second).
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(Tokenizer tokenizer, bool skip_special = false)
      : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

  // The text completed by `id` (often empty while a character is incomplete).
  std::string push(int32_t id);
  // The end of generation: an incomplete character left over comes out as U+FFFD.
  std::string finish() { return stream_.finish(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  Utf8Stream stream_;
};

}  // namespace npusim
