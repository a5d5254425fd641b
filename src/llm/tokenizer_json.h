#pragma once
// Reading the JSON files of a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json) with errors that name
// the file and the field.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace npusim::tokenizer_files {

using Json = nlohmann::json;

// `path` itself when it is a file, else `path`/`file_name` (a model directory).
std::string resolve(const std::string& path, const std::string& file_name);

[[noreturn]] void field_error(const std::string& source, const std::string& field, const std::string& problem);

// A special token named in tokenizer_config.json: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> token_name(const Json& object, const std::string& key, const std::string& source);

}  // namespace npusim::tokenizer_files
