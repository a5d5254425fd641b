#include "llm/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "core/json_text.h"
#include "llm/tokenizer_bpe.h"
#include "llm/tokenizer_json.h"
#include "llm/tokenizer_pretokenizer.h"
#include "llm/tokenizer_unicode.h"
#include "npusim/error.h"

namespace npusim {

using tokenizer_files::field_error;
using tokenizer_files::Json;

namespace {

// Ids beyond this are refused: the tables are indexed by id.
constexpr int64_t kMaxTokenId = 1 << 24;
// The piece cache is emptied when it grows past this many entries; longer pieces (rare) are not cached.
constexpr size_t kMaxCachedPieces = 1 << 16;
constexpr size_t kMaxCachedPieceBytes = 256;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for U+0100 onwards.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<int16_t, 0x144> byte_of_char{};  // -1 for characters outside the alphabet

  ByteLevelAlphabet() {
    byte_of_char.fill(-1);
    char32_t next_extra = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      char_of_byte[byte] = printable ? static_cast<char32_t>(byte) : next_extra++;
      byte_of_char[char_of_byte[byte]] = static_cast<int16_t>(byte);
    }
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet table;
  return table;
}

// The bytes a vocabulary spelling stands for. Characters outside the alphabet keep their UTF-8 bytes, as the
// ByteLevel decoder of Hugging Face does.
std::string bytes_of_spelling(std::string_view spelling) {
  std::string bytes;
  size_t pos = 0;
  while (pos < spelling.size()) {
    char32_t code = 0;
    const size_t length = decode_utf8(spelling, pos, code);
    if (length == 0) {
      bytes.push_back(spelling[pos++]);
      continue;
    }
    const int byte = code < alphabet().byte_of_char.size() ? alphabet().byte_of_char[code] : -1;
    if (byte >= 0)
      bytes.push_back(static_cast<char>(byte));
    else
      bytes.append(spelling.substr(pos, length));
    pos += length;
  }
  return bytes;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

template <typename Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

bool is_word_character(char32_t code) { return code == '_' || unicode::is_letter(code) || unicode::is_number(code); }

// The character that ends just before text[end] (0 at the start or after an invalid byte).
char32_t character_before(std::string_view text, size_t end, size_t& begin) {
  begin = end;
  if (end == 0) return 0;
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  char32_t code = 0;
  if (decode_utf8(text, start, code) != end - start) {
    begin = end - 1;
    return 0;
  }
  begin = start;
  return code;
}

char32_t character_at(std::string_view text, size_t pos, size_t& length) {
  char32_t code = 0;
  length = pos < text.size() ? decode_utf8(text, pos, code) : 0;
  return length == 0 ? 0 : code;
}

const Json& required(const Json& object, const std::string& key, const std::string& source, const std::string& field) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) field_error(source, field, "is missing");
  return *it;
}

bool optional_bool(const Json& object, const std::string& key, bool fallback, const std::string& source,
                   const std::string& field) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) field_error(source, field, "must be true or false, got " + it->dump());
  return it->get<bool>();
}

std::string type_of(const Json& object, const std::string& source, const std::string& field) {
  if (!object.is_object()) field_error(source, field, "must be an object, got " + object.dump());
  const Json& type = required(object, "type", source, field + ".type");
  if (!type.is_string()) field_error(source, field + ".type", "must be a string, got " + type.dump());
  return type.get<std::string>();
}

int32_t token_id_value(const Json& value, const std::string& source, const std::string& field) {
  if (!value.is_number_integer()) field_error(source, field, "must be an integer token id, got " + value.dump());
  const int64_t id = value.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId)
    field_error(source, field, "is " + std::to_string(id) + ", outside [0, " + std::to_string(kMaxTokenId) + ")");
  return static_cast<int32_t>(id);
}

}  // namespace

struct Tokenizer::State {
  static constexpr uint8_t kPresent = 1, kSpecial = 2, kAdded = 4;

  std::string source;
  std::vector<std::string> spellings;   // by id
  std::vector<uint8_t> flags;           // by id
  std::string bytes;                    // the bytes of every token, back to back
  std::vector<uint32_t> bytes_offsets;  // by id, plus the end
  StringMap<int32_t> ids_by_spelling;
  StringMap<int32_t> ids_by_bytes;  // only with ignore_merges
  BytePairEncoder bpe;
  bool ignore_merges = false;
  bool nfc = false;
  bool add_prefix_space = false;
  std::vector<SplitPattern> split_patterns;  // applied one after the other
  std::vector<AddedToken> added;
  std::array<std::vector<int32_t>, 256> added_by_first_byte;  // indices into `added`, longest first
  std::vector<int32_t> prefix_ids, suffix_ids;                // the post-processor's template
  std::optional<int32_t> bos, eos, pad;

  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;  // BPE result of each piece seen

  std::string_view token_bytes(int32_t id) const {
    return std::string_view(bytes).substr(bytes_offsets[id], bytes_offsets[id + 1] - bytes_offsets[id]);
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The added token that matches at text[pos] (longest first), or -1; `begin`/`end` get the span it takes,
  // widened by lstrip/rstrip but never before `floor`.
  int32_t match_added(std::string_view text, size_t pos, size_t floor, size_t& begin, size_t& end) const;
};

namespace {

class TokenizerReader {
 public:
  TokenizerReader(Tokenizer::State& state, const std::string& source) : state_(state), source_(source) {}

  void read(const Json& root) {
    if (!root.is_object()) fail(source_ + ": a tokenizer.json must be a JSON object");
    const Json& model = required(root, "model", source_, "model");
    const std::string model_type = type_of(model, source_, "model");
    if (model_type != "BPE")
      field_error(source_, "model.type", "is '" + model_type + "'; only byte-level BPE tokenizers are supported");
    read_vocab(model);
    read_added_tokens(root);
    store_token_bytes();
    read_byte_tokens(model);
    read_merges(model);
    read_model_options(model);
    if (const auto it = root.find("normalizer"); it != root.end() && !it->is_null()) read_normalizer(*it, "normalizer");
    read_pre_tokenizer(root);
    read_decoder(root);
    if (const auto it = root.find("post_processor"); it != root.end() && !it->is_null())
      read_post_processor(*it, "post_processor");
  }

 private:
  void ensure_size(int32_t id) {
    if (static_cast<size_t>(id) >= state_.spellings.size()) {
      state_.spellings.resize(id + 1);
      state_.flags.resize(id + 1, 0);
    }
  }

  void read_vocab(const Json& model) {
    const Json& vocab = required(model, "vocab", source_, "model.vocab");
    if (!vocab.is_object()) field_error(source_, "model.vocab", "must be an object of token -> id");
    state_.ids_by_spelling.reserve(vocab.size() + 1024);
    for (const auto& [spelling, value] : vocab.items()) {
      const int32_t id = token_id_value(value, source_, "model.vocab[\"" + spelling + "\"]");
      ensure_size(id);
      if (state_.flags[id] & Tokenizer::State::kPresent)
        field_error(
            source_, "model.vocab",
            "gives id " + std::to_string(id) + " to both '" + state_.spellings[id] + "' and '" + spelling + "'");
      state_.spellings[id] = spelling;
      state_.flags[id] = Tokenizer::State::kPresent;
      state_.ids_by_spelling.emplace(spelling, id);
    }
  }

  void read_added_tokens(const Json& root) {
    const auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return;
    if (!it->is_array()) field_error(source_, "added_tokens", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& entry = (*it)[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!entry.is_object()) field_error(source_, field, "must be an object");
      AddedToken token;
      token.id = token_id_value(required(entry, "id", source_, field + ".id"), source_, field + ".id");
      const Json& content = required(entry, "content", source_, field + ".content");
      if (!content.is_string() || content.get<std::string>().empty())
        field_error(source_, field + ".content", "must be a non-empty string");
      token.content = content.get<std::string>();
      token.special = optional_bool(entry, "special", false, source_, field + ".special");
      token.lstrip = optional_bool(entry, "lstrip", false, source_, field + ".lstrip");
      token.rstrip = optional_bool(entry, "rstrip", false, source_, field + ".rstrip");
      token.single_word = optional_bool(entry, "single_word", false, source_, field + ".single_word");
      token.normalized = optional_bool(entry, "normalized", !token.special, source_, field + ".normalized");
      ensure_size(token.id);
      state_.spellings[token.id] = token.content;
      state_.flags[token.id] =
          Tokenizer::State::kPresent | Tokenizer::State::kAdded | (token.special ? Tokenizer::State::kSpecial : 0);
      state_.ids_by_spelling[token.content] = token.id;
      state_.added.push_back(std::move(token));
    }
    for (size_t i = 0; i < state_.added.size(); ++i)
      state_.added_by_first_byte[static_cast<uint8_t>(state_.added[i].content[0])].push_back(static_cast<int32_t>(i));
    for (auto& candidates : state_.added_by_first_byte)
      std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
        return state_.added[a].content.size() > state_.added[b].content.size();
      });
  }

  // Vocabulary tokens are spelled in the byte-level alphabet; added tokens are plain text.
  void store_token_bytes() {
    state_.bytes_offsets.reserve(state_.spellings.size() + 1);
    for (size_t id = 0; id < state_.spellings.size(); ++id) {
      state_.bytes_offsets.push_back(static_cast<uint32_t>(state_.bytes.size()));
      const bool added = state_.flags[id] & Tokenizer::State::kAdded;
      state_.bytes += added ? state_.spellings[id] : bytes_of_spelling(state_.spellings[id]);
    }
    state_.bytes_offsets.push_back(static_cast<uint32_t>(state_.bytes.size()));
  }

  void read_byte_tokens(const Json& model) {
    std::optional<int32_t> unknown;
    if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
      if (!it->is_string()) field_error(source_, "model.unk_token", "must be a string or null");
      const auto found = state_.ids_by_spelling.find(it->get<std::string>());
      if (found == state_.ids_by_spelling.end())
        field_error(source_, "model.unk_token", "names '" + it->get<std::string>() + "', which is not in model.vocab");
      unknown = found->second;
    }
    for (int byte = 0; byte < 256; ++byte) {
      std::string spelling;
      append_utf8(spelling, alphabet().char_of_byte[byte]);
      const auto found = state_.ids_by_spelling.find(spelling);
      if (found != state_.ids_by_spelling.end())
        state_.bpe.set_byte_id(static_cast<uint8_t>(byte), found->second);
      else if (unknown)
        state_.bpe.set_byte_id(static_cast<uint8_t>(byte), *unknown);
    }
  }

  int32_t vocab_id(const std::string& spelling, const std::string& field) const {
    const auto found = state_.ids_by_spelling.find(spelling);
    if (found == state_.ids_by_spelling.end())
      field_error(source_, field, "names '" + spelling + "', which is not in model.vocab");
    return found->second;
  }

  void read_merges(const Json& model) {
    const auto it = model.find("merges");
    if (it == model.end() || it->is_null()) return;
    if (!it->is_array()) field_error(source_, "model.merges", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& entry = (*it)[i];
      const std::string field = "model.merges[" + std::to_string(i) + "]";
      std::string left, right;
      if (entry.is_string()) {  // "left right"
        const std::string text = entry.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == text.size() ||
            text.find(' ', space + 1) != std::string::npos)
          field_error(source_, field, "must be two tokens separated by one space, got \"" + text + "\"");
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
        left = entry[0].get<std::string>();
        right = entry[1].get<std::string>();
      } else {
        field_error(source_, field, "must be \"left right\" or [\"left\", \"right\"], got " + entry.dump());
      }
      const int32_t left_id = vocab_id(left, field);
      const int32_t right_id = vocab_id(right, field);
      state_.bpe.add_merge(left_id, right_id, vocab_id(left + right, field));
    }
  }

  void read_model_options(const Json& model) {
    state_.ignore_merges = optional_bool(model, "ignore_merges", false, source_, "model.ignore_merges");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto it = model.find(key);
      if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
        field_error(source_, std::string("model.") + key, "is " + it->dump() + "; byte-level BPE uses none");
    }
    if (const auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
      if (!it->is_number() || it->get<double>() != 0.0)
        field_error(source_, "model.dropout",
                    "is " + it->dump() + "; BPE dropout is a training feature, not supported");
    }
    if (state_.ignore_merges)
      for (size_t id = 0; id < state_.spellings.size(); ++id)
        if (state_.flags[id] == Tokenizer::State::kPresent)  // model.vocab tokens, not added ones
          state_.ids_by_bytes.emplace(std::string(state_.token_bytes(static_cast<int32_t>(id))),
                                      static_cast<int32_t>(id));
  }

  void read_normalizer(const Json& normalizer, const std::string& field) {
    const std::string type = type_of(normalizer, source_, field);
    if (type == "NFC") {
      state_.nfc = true;
    } else if (type == "Sequence") {
      const Json& steps = required(normalizer, "normalizers", source_, field + ".normalizers");
      if (!steps.is_array()) field_error(source_, field + ".normalizers", "must be an array");
      for (size_t i = 0; i < steps.size(); ++i)
        read_normalizer(steps[i], field + ".normalizers[" + std::to_string(i) + "]");
    } else {
      field_error(source_, field + ".type", "is '" + type + "'; only NFC (or none) is supported");
    }
  }

  void read_pre_tokenizer(const Json& root) {
    const auto it = root.find("pre_tokenizer");
    if (it == root.end() || it->is_null())
      field_error(source_, "pre_tokenizer", "is missing; byte-level BPE needs a ByteLevel pre-tokenizer");
    bool byte_level = false;
    read_pre_tokenizer_step(*it, "pre_tokenizer", byte_level);
    if (!byte_level)
      field_error(source_, "pre_tokenizer", "has no ByteLevel step; only byte-level BPE tokenizers are supported");
  }

  void read_pre_tokenizer_step(const Json& step, const std::string& field, bool& byte_level) {
    const std::string type = type_of(step, source_, field);
    if (type == "Sequence") {
      const Json& steps = required(step, "pretokenizers", source_, field + ".pretokenizers");
      if (!steps.is_array()) field_error(source_, field + ".pretokenizers", "must be an array");
      for (size_t i = 0; i < steps.size(); ++i)
        read_pre_tokenizer_step(steps[i], field + ".pretokenizers[" + std::to_string(i) + "]", byte_level);
    } else if (type == "ByteLevel") {
      if (byte_level) field_error(source_, field, "is a second ByteLevel step");
      byte_level = true;
      state_.add_prefix_space = optional_bool(step, "add_prefix_space", false, source_, field + ".add_prefix_space");
      // After a Split, the prefix space would go in front of every piece; only the GPT-2 layout is supported.
      if (state_.add_prefix_space && !state_.split_patterns.empty())
        field_error(source_, field + ".add_prefix_space", "is true after a Split step, which is not supported");
      if (optional_bool(step, "use_regex", true, source_, field + ".use_regex"))
        state_.split_patterns.push_back(SplitPattern::Gpt2);
    } else if (type == "Split") {
      read_split(step, field);
    } else {
      field_error(source_, field + ".type",
                  "is '" + type +
                      "'; supported pre-tokenizers are ByteLevel, Split (GPT-2, Qwen2 and Llama 3 "
                      "patterns) and Sequence of them");
    }
  }

  void read_split(const Json& step, const std::string& field) {
    const Json& pattern = required(step, "pattern", source_, field + ".pattern");
    const auto regex = pattern.is_object() ? pattern.find("Regex") : pattern.end();
    if (!pattern.is_object() || regex == pattern.end() || !regex->is_string())
      field_error(source_, field + ".pattern", "must be {\"Regex\": \"...\"}, got " + pattern.dump());
    const auto known = recognize_split_pattern(regex->get<std::string>());
    if (!known)
      field_error(
          source_, field + ".pattern.Regex",
          "is a pattern this tokenizer does not implement (GPT-2, Qwen2 and Llama 3 patterns are): " + regex->dump());
    const auto behavior = step.find("behavior");
    if (behavior != step.end() && *behavior != "Isolated")
      field_error(source_, field + ".behavior", "is " + behavior->dump() + "; only \"Isolated\" is supported");
    if (optional_bool(step, "invert", false, source_, field + ".invert"))
      field_error(source_, field + ".invert", "is true; only false is supported");
    state_.split_patterns.push_back(*known);
  }

  void read_decoder(const Json& root) {
    const auto it = root.find("decoder");
    if (it == root.end() || it->is_null())
      field_error(source_, "decoder", "is missing; byte-level BPE needs a ByteLevel decoder");
    const std::string type = type_of(*it, source_, "decoder");
    if (type != "ByteLevel") field_error(source_, "decoder.type", "is '" + type + "'; only ByteLevel is supported");
  }

  void read_post_processor(const Json& processor, const std::string& field) {
    const std::string type = type_of(processor, source_, field);
    if (type == "ByteLevel") return;  // only adjusts offsets
    if (type == "Sequence") {
      const Json& steps = required(processor, "processors", source_, field + ".processors");
      if (!steps.is_array()) field_error(source_, field + ".processors", "must be an array");
      for (size_t i = 0; i < steps.size(); ++i)
        read_post_processor(steps[i], field + ".processors[" + std::to_string(i) + "]");
      return;
    }
    if (type != "TemplateProcessing")
      field_error(source_, field + ".type",
                  "is '" + type + "'; supported post-processors are ByteLevel, TemplateProcessing and Sequence");
    read_template(processor, field);
  }

  void read_template(const Json& processor, const std::string& field) {
    const Json& single = required(processor, "single", source_, field + ".single");
    if (!single.is_array()) field_error(source_, field + ".single", "must be an array");
    const auto specials = processor.find("special_tokens");
    bool after_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const Json& item = single[i];
      const std::string item_field = field + ".single[" + std::to_string(i) + "]";
      if (item.is_object() && item.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      const auto special = item.is_object() ? item.find("SpecialToken") : item.end();
      if (!item.is_object() || special == item.end() || !special->is_object() || !special->contains("id") ||
          !(*special)["id"].is_string())
        field_error(source_, item_field,
                    "must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}, got " + item.dump());
      const std::string name = (*special)["id"].get<std::string>();
      std::vector<int32_t>& target = after_sequence ? state_.suffix_ids : state_.prefix_ids;
      const Json* entry = nullptr;
      if (specials != processor.end() && specials->is_object() && specials->contains(name)) entry = &(*specials)[name];
      if (entry && entry->contains("ids") && (*entry)["ids"].is_array()) {
        for (const Json& id : (*entry)["ids"]) {
          const std::string ids_field = field + ".special_tokens." + name + ".ids";
          const int32_t value = token_id_value(id, source_, ids_field);
          // An id the vocabulary lacks would reach the model's embedding as an index past its end.
          if (static_cast<size_t>(value) >= state_.flags.size() || !(state_.flags[value] & Tokenizer::State::kPresent))
            field_error(source_, ids_field, "holds " + std::to_string(value) + ", which is not a token");
          target.push_back(value);
        }
      } else {
        const auto found = state_.ids_by_spelling.find(name);
        if (found == state_.ids_by_spelling.end())
          field_error(source_, item_field, "names the token '" + name + "', which the tokenizer does not have");
        target.push_back(found->second);
      }
    }
  }

  Tokenizer::State& state_;
  const std::string& source_;
};

std::optional<int32_t> config_token(const Tokenizer::State& state, const Json& config, const std::string& key,
                                    const std::string& config_source) {
  const auto name = tokenizer_files::token_name(config, key, config_source);
  if (!name) return std::nullopt;
  const auto found = state.ids_by_spelling.find(*name);
  if (found == state.ids_by_spelling.end())
    field_error(config_source, key, "names '" + *name + "', which is not a token of " + state.source);
  return found->second;
}

}  // namespace

int32_t Tokenizer::State::match_added(std::string_view text, size_t pos, size_t floor, size_t& begin,
                                      size_t& end) const {
  for (const int32_t index : added_by_first_byte[static_cast<uint8_t>(text[pos])]) {
    const AddedToken& token = added[index];
    if (text.compare(pos, token.content.size(), token.content) != 0) continue;
    begin = pos;
    end = pos + token.content.size();
    if (token.single_word) {
      size_t unused = 0;
      if (is_word_character(character_before(text, begin, unused)) ||
          is_word_character(character_at(text, end, unused)))
        continue;
    }
    if (token.lstrip) {
      while (begin > floor) {
        size_t start = 0;
        const char32_t code = character_before(text, begin, start);
        if (start < floor || !unicode::is_white_space(code)) break;
        begin = start;
      }
    }
    if (token.rstrip) {
      size_t length = 0;
      while (end < text.size() && unicode::is_white_space(character_at(text, end, length))) end += length;
    }
    return index;
  }
  return -1;
}

void Tokenizer::State::encode(std::string_view text, std::vector<int32_t>& out) const {
  size_t segment_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (added_by_first_byte[static_cast<uint8_t>(text[pos])].empty()) {
      ++pos;
      continue;
    }
    size_t begin = 0, end = 0;
    const int32_t index = match_added(text, pos, segment_start, begin, end);
    if (index < 0) {
      ++pos;
      continue;
    }
    encode_text(text.substr(segment_start, begin - segment_start), out);
    out.push_back(added[index].id);
    segment_start = pos = end;
  }
  encode_text(text.substr(segment_start), out);
}

void Tokenizer::State::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string storage;
  if (nfc && !unicode::is_nfc_quick(text)) {
    storage = unicode::nfc(text);
    text = storage;
  }
  if (add_prefix_space && text[0] != ' ') {
    storage = " " + std::string(text);
    text = storage;
  }
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> split;
  for (const SplitPattern pattern : split_patterns) {
    split.clear();
    for (std::string_view piece : pieces) split_pieces(piece, pattern, split);
    pieces.swap(split);
  }
  for (std::string_view piece : pieces) encode_piece(piece, out);
}

void Tokenizer::State::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    const auto found = ids_by_bytes.find(piece);
    if (found != ids_by_bytes.end()) {
      out.push_back(found->second);
      return;
    }
  }
  if (piece.size() == 1) {
    const int32_t id = bpe.byte_id(static_cast<uint8_t>(piece[0]));
    if (id >= 0) out.push_back(id);
    return;
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    bpe.encode(piece, out);
    return;
  }
  {
    std::lock_guard lock(cache_mutex);
    const auto found = cache.find(piece);
    if (found != cache.end()) {
      out.insert(out.end(), found->second.begin(), found->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe.encode(piece, out);
  std::vector<int32_t> ids(out.begin() + static_cast<ptrdiff_t>(first), out.end());
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kMaxCachedPieces) cache.clear();
  cache.emplace(std::string(piece), std::move(ids));
}

Tokenizer Tokenizer::load(const std::string& path) {
  const std::string tokenizer_path = tokenizer_files::resolve(path, "tokenizer.json");
  const std::string config_path =
      (std::filesystem::path(tokenizer_path).parent_path() / "tokenizer_config.json").string();
  const std::string config_text = std::filesystem::is_regular_file(config_path) ? read_text_file(config_path) : "";
  return parse(read_text_file(tokenizer_path), tokenizer_path, config_text, config_path);
}

Tokenizer Tokenizer::parse(const std::string& tokenizer_json, const std::string& source, const std::string& config_json,
                           const std::string& config_source) {
  auto state = std::make_shared<State>();
  state->source = source;
  const Json root = parse_json_text(tokenizer_json, source);
  try {
    TokenizerReader(*state, source).read(root);
  } catch (const Json::exception& e) {  // a value of an unexpected type that no check above caught
    fail(source + ": unexpected content: " + e.what());
  }
  if (!config_json.empty()) {
    const Json config = parse_json_text(config_json, config_source);
    if (!config.is_object()) fail(config_source + ": a tokenizer_config.json must be a JSON object");
    state->bos = config_token(*state, config, "bos_token", config_source);
    state->eos = config_token(*state, config, "eos_token", config_source);
    state->pad = config_token(*state, config, "pad_token", config_source);
  }
  return Tokenizer(std::move(state));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special) ids = state_->prefix_ids;
  state_->encode(text, ids);
  if (add_special) ids.insert(ids.end(), state_->suffix_ids.begin(), state_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0) fail("cannot decode token id " + std::to_string(id) + ": ids are not negative");
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return to_valid_utf8(bytes);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= state_->spellings.size()) return {};
  return state_->token_bytes(id);
}

const std::string& Tokenizer::token_string(int32_t id) const {
  static const std::string kNone;
  if (id < 0 || static_cast<size_t>(id) >= state_->spellings.size()) return kNone;
  return state_->spellings[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  const auto found = state_->ids_by_spelling.find(token);
  if (found == state_->ids_by_spelling.end()) return std::nullopt;
  return found->second;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(state_->spellings.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < state_->flags.size() && (state_->flags[id] & State::kSpecial);
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return state_->added; }
std::optional<int32_t> Tokenizer::bos_token_id() const { return state_->bos; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return state_->eos; }
std::optional<int32_t> Tokenizer::pad_token_id() const { return state_->pad; }
const std::string& Tokenizer::source() const { return state_->source; }

std::string TokenStreamDecoder::push(int32_t id) {
  if (id < 0) fail("cannot decode token id " + std::to_string(id) + ": ids are not negative");
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  return stream_.push(tokenizer_.token_bytes(id));
}

}  // namespace npusim
