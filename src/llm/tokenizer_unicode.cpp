#include "llm/tokenizer_unicode.h"

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "llm/tokenizer_unicode_data.h"
#include "llm/utf8_stream.h"

namespace npusim::unicode {
namespace {

using namespace unicode_data;

bool in_ranges(const CodeRange* ranges, size_t count, char32_t code) {
  const CodeRange* end = ranges + count;
  const CodeRange* it = std::upper_bound(ranges, end, code, [](char32_t c, const CodeRange& r) { return c < r.first; });
  return it != ranges && code <= (it - 1)->last;
}

enum Flag : uint8_t { kLetter = 1, kNumber = 2 };

// Letter/number flags of the Basic Multilingual Plane, so that most text needs no binary search.
const std::array<uint8_t, 0x10000>& bmp_flags() {
  static const std::unique_ptr<std::array<uint8_t, 0x10000>> flags = [] {
    auto table = std::make_unique<std::array<uint8_t, 0x10000>>();
    table->fill(0);
    for (size_t i = 0; i < kLetterRangesCount; ++i)
      for (char32_t c = kLetterRanges[i].first; c <= kLetterRanges[i].last && c < 0x10000; ++c) (*table)[c] |= kLetter;
    for (size_t i = 0; i < kNumberRangesCount; ++i)
      for (char32_t c = kNumberRanges[i].first; c <= kNumberRanges[i].last && c < 0x10000; ++c) (*table)[c] |= kNumber;
    return table;
  }();
  return *flags;
}

constexpr char32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3;
constexpr char32_t kJamoLFirst = 0x1100, kJamoVFirst = 0x1161, kJamoTFirst = 0x11A7;
constexpr char32_t kJamoLCount = 19, kJamoVCount = 21, kJamoTCount = 28;
constexpr char32_t kHangulPerL = kJamoVCount * kJamoTCount;

void decompose(char32_t code, std::vector<char32_t>& out) {
  if (code >= kHangulFirst && code <= kHangulLast) {
    const char32_t index = code - kHangulFirst;
    out.push_back(kJamoLFirst + index / kHangulPerL);
    out.push_back(kJamoVFirst + (index % kHangulPerL) / kJamoTCount);
    if (index % kJamoTCount != 0) out.push_back(kJamoTFirst + index % kJamoTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kDecompositionsCount;
  const Decomposition* it =
      std::lower_bound(kDecompositions, end, code, [](const Decomposition& d, char32_t c) { return d.code < c; });
  if (it == end || it->code != code) {
    out.push_back(code);
    return;
  }
  out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->length);
}

// Stable sort of each run of non-starters by combining class.
void canonical_order(std::vector<char32_t>& text, std::vector<uint8_t>& classes) {
  classes.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) classes[i] = combining_class(text[i]);
  for (size_t i = 1; i < text.size(); ++i) {
    if (classes[i] == 0) continue;
    for (size_t j = i; j > 0 && classes[j - 1] > classes[j]; --j) {
      std::swap(classes[j - 1], classes[j]);
      std::swap(text[j - 1], text[j]);
    }
  }
}

// The primary composite of first + second, or 0.
char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= kJamoLFirst && first < kJamoLFirst + kJamoLCount && second >= kJamoVFirst &&
      second < kJamoVFirst + kJamoVCount)
    return kHangulFirst + ((first - kJamoLFirst) * kJamoVCount + (second - kJamoVFirst)) * kJamoTCount;
  if (first >= kHangulFirst && first <= kHangulLast && (first - kHangulFirst) % kJamoTCount == 0 &&
      second > kJamoTFirst && second < kJamoTFirst + kJamoTCount)
    return first + (second - kJamoTFirst);
  const Composition* end = kCompositions + kCompositionsCount;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::pair{first, second}, [](const Composition& c, auto key) {
        return c.first < key.first || (c.first == key.first && c.second < key.second);
      });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

// The canonical composition algorithm of UAX #15 over decomposed, canonically ordered text.
void compose(std::vector<char32_t>& text, const std::vector<uint8_t>& classes) {
  size_t out = 0;
  ptrdiff_t starter = -1;  // index in the output of the last starter
  uint8_t last_class = 0;  // combining class of the last character written
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t code = text[i];
    const uint8_t combining = classes[i];
    const bool adjacent = starter >= 0 && static_cast<size_t>(starter) + 1 == out;
    if (starter >= 0 && (adjacent || (last_class != 0 && last_class < combining))) {
      if (const char32_t composite = compose_pair(text[starter], code)) {
        text[starter] = composite;
        continue;
      }
    }
    if (combining == 0) starter = static_cast<ptrdiff_t>(out);
    last_class = combining;
    text[out++] = code;
  }
  text.resize(out);
}

void flush_normalized(std::vector<char32_t>& decomposed, std::vector<uint8_t>& classes, std::string& out) {
  canonical_order(decomposed, classes);
  compose(decomposed, classes);
  for (char32_t code : decomposed) append_utf8(out, code);
  decomposed.clear();
}

}  // namespace

bool is_letter(char32_t code) {
  if (code < 0x10000) return bmp_flags()[code] & kLetter;
  return in_ranges(kLetterRanges, kLetterRangesCount, code);
}

bool is_number(char32_t code) {
  if (code < 0x10000) return bmp_flags()[code] & kNumber;
  return in_ranges(kNumberRanges, kNumberRangesCount, code);
}

bool is_white_space(char32_t code) {
  if (code <= 0x20) return code == 0x20 || (code >= 0x09 && code <= 0x0D);
  if (code < 0x85) return false;
  return code == 0x85 || code == 0xA0 || code == 0x1680 || (code >= 0x2000 && code <= 0x200A) || code == 0x2028 ||
         code == 0x2029 || code == 0x202F || code == 0x205F || code == 0x3000;
}

uint8_t combining_class(char32_t code) {
  if (code < 0x300) return 0;
  const CombiningClassRange* end = kCombiningClassRanges + kCombiningClassRangesCount;
  const CombiningClassRange* it = std::upper_bound(
      kCombiningClassRanges, end, code, [](char32_t c, const CombiningClassRange& r) { return c < r.first; });
  return it != kCombiningClassRanges && code <= (it - 1)->last ? (it - 1)->combining_class : 0;
}

const char* version() { return kUnicodeVersion; }

bool is_nfc_quick(std::string_view text) {
  uint8_t last_class = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      last_class = 0;
      ++pos;
      continue;
    }
    char32_t code = 0;
    const size_t length = decode_utf8(text, pos, code);
    if (length == 0) {  // invalid bytes stay as they are and separate what is around them
      last_class = 0;
      ++pos;
      continue;
    }
    pos += length;
    if (code < 0x300) {
      last_class = 0;
      continue;
    }
    if (in_ranges(kNfcQuickCheckRanges, kNfcQuickCheckRangesCount, code)) return false;
    const uint8_t combining = combining_class(code);
    if (combining != 0 && last_class > combining) return false;
    last_class = combining;
  }
  return true;
}

std::string nfc(std::string_view text) {
  if (is_nfc_quick(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  std::vector<char32_t> decomposed;
  std::vector<uint8_t> classes;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t code = 0;
    const size_t length = decode_utf8(text, pos, code);
    if (length == 0) {
      flush_normalized(decomposed, classes, out);
      out.push_back(text[pos++]);
      continue;
    }
    decompose(code, decomposed);
    pos += length;
  }
  flush_normalized(decomposed, classes, out);
  return out;
}

}  // namespace npusim::unicode
