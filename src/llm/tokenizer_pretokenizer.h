#pragma once
// The regex split of byte-level BPE pre-tokenizers, matched by hand for the patterns of the model families we
// support (regex engines rarely handle \p{L} and \p{N}, and these patterns only need a few character classes).
#include <optional>
#include <string_view>
#include <vector>

namespace npusim {

enum class SplitPattern {
  // GPT-2's ByteLevel pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Gpt2,
  // Qwen2's Split pattern: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
  //   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,
  // Llama 3's Split pattern: Qwen2's with \p{N}{1,3} for \p{N}.
  Llama3,
};

// The pattern a tokenizer.json regex spells, or nothing when it is not one we implement.
std::optional<SplitPattern> recognize_split_pattern(std::string_view regex);

// Appends to `pieces` the consecutive matches of `pattern` over `text` (every character belongs to one match,
// so the pieces concatenate back to `text`). Bytes that are not valid UTF-8 count as punctuation.
void split_pieces(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& pieces);

}  // namespace npusim
