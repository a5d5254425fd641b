#include "llm/tokenizer_json.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "npusim/error.h"

namespace npusim::tokenizer_files {
namespace {

// Deeper nesting is refused while parsing: walks over the tree (and dump() in messages) recurse.
constexpr int kMaxJsonDepth = 64;

}  // namespace

std::string resolve(const std::string& path, const std::string& file_name) {
  if (std::filesystem::is_directory(path)) return (std::filesystem::path(path) / file_name).string();
  return path;
}

std::string read_text_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail(path + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Json parse_json(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text, [&](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth)
        fail(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      return true;
    });
  } catch (const Json::exception& e) {
    fail(source + ": not valid JSON: " + e.what());
  }
}

void field_error(const std::string& source, const std::string& field, const std::string& problem) {
  fail(source + ": field '" + field + "' " + problem);
}

std::optional<std::string> token_name(const Json& object, const std::string& key, const std::string& source) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  field_error(source, key, "must be a token string or an object with a string 'content', got " + it->dump());
}

}  // namespace npusim::tokenizer_files
