#include "llm/tokenizer_pretokenizer.h"

#include <cstdint>

#include "llm/tokenizer_unicode.h"
#include "llm/utf8_stream.h"

namespace npusim {
namespace {

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The character classes the patterns distinguish. Newline is \r or \n; Space is any other White_Space
// character; Other is everything else ([^\s\p{L}\p{N}]).
enum class Kind : uint8_t { Letter, Number, Newline, Space, Other };

struct Characters {
  std::vector<char32_t> code;
  std::vector<Kind> kind;
  std::vector<uint32_t> offset;  // byte offset of each character, plus the text size at the end
};

Kind classify(char32_t code) {
  if (code < 0x80) {
    if ((code | 0x20) >= 'a' && (code | 0x20) <= 'z') return Kind::Letter;
    if (code >= '0' && code <= '9') return Kind::Number;
    if (code == '\r' || code == '\n') return Kind::Newline;
    if (code == ' ' || (code >= 0x09 && code <= 0x0D)) return Kind::Space;
    return Kind::Other;
  }
  if (unicode::is_letter(code)) return Kind::Letter;
  if (unicode::is_number(code)) return Kind::Number;
  if (unicode::is_white_space(code)) return Kind::Space;
  return Kind::Other;
}

void decode_characters(std::string_view text, Characters& chars) {
  chars.code.clear();
  chars.kind.clear();
  chars.offset.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t code = 0;
    size_t length = decode_utf8(text, pos, code);
    Kind kind = Kind::Other;
    if (length == 0) {
      length = 1;
      code = 0xFFFD;
    } else {
      kind = classify(code);
    }
    chars.code.push_back(code);
    chars.kind.push_back(kind);
    chars.offset.push_back(static_cast<uint32_t>(pos));
    pos += length;
  }
  chars.offset.push_back(static_cast<uint32_t>(text.size()));
}

// Matches the patterns' alternatives in order at one position; each returns the match length in characters
// (0 when it does not match), with the backtracking a regex engine would do.
class Matcher {
 public:
  Matcher(const Characters& chars, SplitPattern pattern) : chars_(chars), pattern_(pattern), size_(chars.code.size()) {}

  size_t match(size_t i) const {
    if (size_t n = contraction(i)) return n;
    if (pattern_ == SplitPattern::Gpt2) {
      if (size_t n = optional_space_then_run(i, Kind::Letter)) return n;
      if (size_t n = optional_space_then_run(i, Kind::Number)) return n;
      if (size_t n = optional_space_then_run(i, Kind::Other)) return n;
    } else {
      if (size_t n = letters_with_prefix(i)) return n;
      if (size_t n = digits(i, pattern_ == SplitPattern::Llama3 ? 3 : 1)) return n;
      if (size_t n = optional_space_then_run(i, Kind::Other)) return n + run(i + n, Kind::Newline);
      if (size_t n = spaces_then_newlines(i)) return n;
    }
    return spaces(i);
  }

 private:
  bool is(size_t i, Kind kind) const { return i < size_ && chars_.kind[i] == kind; }
  bool is_space(size_t i) const { return is(i, Kind::Space) || is(i, Kind::Newline); }

  size_t run(size_t i, Kind kind) const {
    size_t j = i;
    while (is(j, kind)) ++j;
    return j - i;
  }

  size_t space_run(size_t i) const {
    size_t j = i;
    while (is_space(j)) ++j;
    return j - i;
  }

  // The lower-case ASCII letter `code` stands for under the pattern's case rule, or 0.
  char32_t folded(size_t i) const {
    if (i >= size_) return 0;
    const char32_t code = chars_.code[i];
    if (pattern_ == SplitPattern::Gpt2) return code;  // case-sensitive
    if (code >= 'A' && code <= 'Z') return code + 0x20;
    if (code == 0x17F) return 's';  // LATIN SMALL LETTER LONG S folds to s under (?i)
    return code;
  }

  // '(s|t|re|ve|m|ll|d)
  size_t contraction(size_t i) const {
    if (i >= size_ || chars_.code[i] != '\'') return 0;
    const char32_t a = folded(i + 1), b = folded(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t letters_with_prefix(size_t i) const {
    if (is(i, Kind::Letter)) return run(i, Kind::Letter);
    if (i < size_ && (is(i, Kind::Space) || is(i, Kind::Other)) && is(i + 1, Kind::Letter))
      return 1 + run(i + 1, Kind::Letter);
    return 0;
  }

  // \p{N} or \p{N}{1,3}
  size_t digits(size_t i, size_t most) const {
    size_t n = 0;
    while (n < most && is(i + n, Kind::Number)) ++n;
    return n;
  }

  // " ?X+" for the class X
  size_t optional_space_then_run(size_t i, Kind kind) const {
    if (i < size_ && chars_.code[i] == ' ' && is(i + 1, kind)) return 1 + run(i + 1, kind);
    return run(i, kind);
  }

  // \s*[\r\n]+ : \s* backs off until the last newline of the whitespace run.
  size_t spaces_then_newlines(size_t i) const {
    const size_t n = space_run(i);
    for (size_t k = n; k > 0; --k)
      if (is(i + k - 1, Kind::Newline)) return k;
    return 0;
  }

  // \s+(?!\S)|\s+ : a whitespace run leaves its last character to the next match unless the text ends there.
  size_t spaces(size_t i) const {
    const size_t n = space_run(i);
    if (n >= 2 && i + n < size_) return n - 1;
    return n;
  }

  const Characters& chars_;
  SplitPattern pattern_;
  size_t size_;
};

}  // namespace

std::optional<SplitPattern> recognize_split_pattern(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::Gpt2;
  if (regex == kQwen2Regex) return SplitPattern::Qwen2;
  if (regex == kLlama3Regex) return SplitPattern::Llama3;
  return std::nullopt;
}

void split_pieces(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& pieces) {
  thread_local Characters chars;
  decode_characters(text, chars);
  const Matcher matcher(chars, pattern);
  const size_t size = chars.code.size();
  size_t i = 0;
  while (i < size) {
    const size_t n = matcher.match(i);  // every character matches some alternative, so n >= 1
    pieces.push_back(text.substr(chars.offset[i], chars.offset[i + n] - chars.offset[i]));
    i += n;
  }
}

}  // namespace npusim
