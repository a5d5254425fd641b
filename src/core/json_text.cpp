#include "core/json_text.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "npusim/error.h"

namespace npusim {

nlohmann::json parse_json_text(std::string_view text, const std::string& source, const std::string& what) {
  using Json = nlohmann::json;
  try {
    return Json::parse(text.begin(), text.end(), [&](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth)
        fail(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      return true;
    });
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    fail(source + ": " + (what.empty() ? "" : what + " is ") + "not valid JSON: " + e.what());
  }
}

std::string read_text_file(const std::string& path, const std::string& expected) {
  if (std::filesystem::is_directory(path)) fail(path + ": is a directory, not " + expected);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace npusim
