#include "llm/tokenizer_json.h"

#include <filesystem>

#include "npusim/error.h"

namespace npusim::tokenizer_files {

std::string resolve(const std::string& path, const std::string& file_name) {
  if (std::filesystem::is_directory(path)) return (std::filesystem::path(path) / file_name).string();
  return path;
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
