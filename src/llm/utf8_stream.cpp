#include "llm/utf8_stream.h"

#include <cstdint>

namespace npusim {
namespace {

enum class Scan { Complete, Invalid, Truncated };

struct ScanResult {
  Scan status;
  size_t length;  // bytes of the character, of the maximal invalid subpart, or of the truncated prefix
  char32_t code;
};

// Checks the sequence at bytes[pos] byte by byte, so that an invalid sequence ends at its maximal subpart.
ScanResult scan_utf8(std::string_view bytes, size_t pos) {
  const auto lead = static_cast<uint8_t>(bytes[pos]);
  if (lead < 0x80) return {Scan::Complete, 1, lead};
  size_t length = 0;
  uint8_t second_low = 0x80, second_high = 0xBF;
  char32_t code = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code = lead & 0x0F;
    if (lead == 0xE0) second_low = 0xA0;   // no overlong forms
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code = lead & 0x07;
    if (lead == 0xF0) second_low = 0x90;   // no overlong forms
    if (lead == 0xF4) second_high = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Scan::Invalid, 1, 0};
  }
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= bytes.size()) return {Scan::Truncated, i, 0};
    const auto byte = static_cast<uint8_t>(bytes[pos + i]);
    const uint8_t low = i == 1 ? second_low : 0x80;
    const uint8_t high = i == 1 ? second_high : 0xBF;
    if (byte < low || byte > high) return {Scan::Invalid, i, 0};
    code = (code << 6) | (byte & 0x3F);
  }
  return {Scan::Complete, length, code};
}

// Appends the valid text of bytes[0, end) to `out`; returns where an incomplete final character starts (`end`
// when there is none). With `at_end`, an incomplete final character is written as U+FFFD instead.
size_t append_valid(std::string_view bytes, bool at_end, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const ScanResult result = scan_utf8(bytes, pos);
    if (result.status == Scan::Complete) {
      out.append(bytes.substr(pos, result.length));
    } else if (result.status == Scan::Invalid || at_end) {
      out.append(kReplacementCharacter);
    } else {
      return pos;
    }
    pos += result.length;
  }
  return pos;
}

}  // namespace

size_t decode_utf8(std::string_view text, size_t pos, char32_t& code) {
  const ScanResult result = scan_utf8(text, pos);
  if (result.status != Scan::Complete) return 0;
  code = result.code;
  return result.length;
}

void append_utf8(std::string& out, char32_t code) {
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_valid(bytes, true, out);
  return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const size_t consumed = append_valid(pending_, false, out);
  pending_.erase(0, consumed);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out;
  append_valid(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace npusim
