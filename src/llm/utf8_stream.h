#pragma once
// UTF-8 helpers for text that arrives in pieces: a token may end in the middle of a character, so decoded text
// is released only when its characters are complete.
#include <cstddef>
#include <string>
#include <string_view>

namespace npusim {

// The character U+FFFD, written for bytes that are not valid UTF-8.
inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// Decodes the character starting at text[pos]. Returns its length in bytes and stores it in `code`, or returns 0
// when the bytes there are not a complete, valid character (overlong forms, surrogates and values above
// U+10FFFF are invalid).
size_t decode_utf8(std::string_view text, size_t pos, char32_t& code);

void append_utf8(std::string& out, char32_t code);

// `bytes` with each invalid sequence replaced by U+FFFD, one per maximal invalid subpart (the rule of Python's
// errors="replace" and of the WHATWG decoder).
std::string to_valid_utf8(std::string_view bytes);

// Turns a stream of bytes into text made only of complete characters.
class Utf8Stream {
 public:
  // Adds bytes; returns the text of every character completed by them. Invalid bytes become U+FFFD; the bytes of
  // a character still missing its continuation bytes are held back for the next call.
  std::string push(std::string_view bytes);
  // Ends the stream: returns U+FFFD when an incomplete character was held back, else nothing.
  std::string finish();
  // True while the bytes of an incomplete character are held back.
  bool has_pending() const { return !pending_.empty(); }

 private:
  std::string pending_;
};

}  // namespace npusim
