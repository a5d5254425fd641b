#pragma once
// The Unicode properties byte-level BPE pre-tokenizers use (\p{L}, \p{N}, \s) and NFC normalization.
#include <cstdint>
#include <string>
#include <string_view>

namespace npusim::unicode {

bool is_letter(char32_t code);  // \p{L}
bool is_number(char32_t code);  // \p{N}
// The White_Space property: what \s matches in Oniguruma and Rust's regex crate (so U+0085 yes, U+FEFF no).
bool is_white_space(char32_t code);
uint8_t combining_class(char32_t code);
// Version of the Unicode Character Database the tables come from.
const char* version();

// NFC of UTF-8 text. Bytes that are not valid UTF-8 are kept as they are and nothing composes across them.
std::string nfc(std::string_view text);
// True when nfc(text) == text is certain without normalizing (the NFC quick check answers Yes).
bool is_nfc_quick(std::string_view text);

}  // namespace npusim::unicode
