#pragma once
// Reading JSON that users hand us (IR files, safetensors headers, configs, tokenizers, targets, kernel specs) with
// one set of limits and error messages.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace npusim {

// Deeper nesting is refused while parsing (the readers walk the tree recursively; real files nest a few levels).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; errors name `source`: "SOURCE: not valid JSON: ..." (or "SOURCE: WHAT is not valid JSON: ..."
// when `what` names the part of the file), numbers beyond a double, nesting deeper than kMaxJsonDepth.
nlohmann::json parse_json_text(std::string_view text, const std::string& source, const std::string& what = "");

// The whole file; errors name it: missing or unreadable, or a directory ("PATH: is a directory, not EXPECTED").
std::string read_text_file(const std::string& path, const std::string& expected = "a file");

}  // namespace npusim
