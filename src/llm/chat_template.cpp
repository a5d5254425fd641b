#include "llm/chat_template.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string_view>

#include "core/json_text.h"
#include "llm/tokenizer_json.h"
#include "llm/tokenizer_unicode.h"
#include "llm/utf8_stream.h"
#include "npusim/error.h"

namespace npusim {
namespace {

using tokenizer_files::Json;

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kHeaderStart = "<|start_header_id|>";
constexpr std::string_view kHeaderEnd = "<|end_header_id|>";
constexpr std::string_view kEotId = "<|eot_id|>";

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// The value of a Jinja string literal's body (Python escapes).
std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char escaped = body[++i];
    switch (escaped) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      default:
        out.push_back(escaped);  // \\ \' \"
    }
  }
  return out;
}

// Text from `pos` up to `end` inside the same string literal, or nothing when the literal closes (or an
// expression starts) first. The literal's quote is the character before `start`.
std::optional<std::string> literal_until(std::string_view jinja, size_t start, size_t pos, std::string_view end) {
  if (start == 0) return std::nullopt;
  const char quote = jinja[start - 1];
  if (quote != '\'' && quote != '"') return std::nullopt;
  for (size_t i = pos; i < jinja.size(); ++i) {
    if (jinja.compare(i, end.size(), end) == 0) return unescape(jinja.substr(pos, i - pos));
    if (jinja[i] == '\\') {
      ++i;
      continue;
    }
    if (jinja[i] == quote) return std::nullopt;
  }
  return std::nullopt;
}

// Qwen2/2.5 write their default system turn as one literal: '<|im_start|>system\nYou are ...<|im_end|>\n'.
std::optional<std::string> find_default_system_prompt(std::string_view jinja) {
  for (const std::string_view marker :
       {std::string_view("<|im_start|>system\\n"), std::string_view("<|im_start|>system\n")}) {
    for (size_t at = jinja.find(marker); at != std::string_view::npos; at = jinja.find(marker, at + 1)) {
      if (auto prompt = literal_until(jinja, at, at + marker.size(), kImEnd)) return prompt;
    }
  }
  return std::nullopt;
}

// The text after `marker` inside its literal, up to an escaped or real newline or the closing quote.
std::optional<std::string> literal_after(std::string_view jinja, std::string_view marker) {
  const size_t at = jinja.find(marker);
  if (at == std::string_view::npos) return std::nullopt;
  size_t end = at + marker.size();
  while (end < jinja.size() && jinja[end] != '"' && jinja[end] != '\'' && jinja[end] != '\n' &&
         jinja.compare(end, 2, "\\n") != 0)
    ++end;
  return std::string(jinja.substr(at + marker.size(), end - at - marker.size()));
}

std::string today(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[128];
  const size_t length = std::strftime(text, sizeof(text), format.c_str(), &local);
  return std::string(text, length);
}

// Python's str.strip(): the whitespace it removes is White_Space plus U+001C..U+001F.
bool is_python_space(char32_t code) { return (code >= 0x1C && code <= 0x1F) || unicode::is_white_space(code); }

std::string python_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    char32_t code = 0;
    const size_t length = decode_utf8(text, begin, code);
    if (length == 0 || !is_python_space(code)) break;
    begin += length;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    char32_t code = 0;
    if (decode_utf8(text, start, code) != end - start || !is_python_space(code)) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

std::string_view lstrip_newlines(std::string_view text) {
  while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
  return text;
}

std::string_view rstrip_newlines(std::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return text;
}

void check_roles(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages) {
  const bool llama = chat_template.format == ChatFormat::Llama3;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "system" || role == "user" || role == "assistant" || role == "tool" || (llama && role == "ipython"))
      continue;
    fail("chat message " + std::to_string(i) + " has role '" + role + "'; the template of " + chat_template.source +
         " takes system, user, assistant and tool" + (llama ? " (or ipython)" : ""));
  }
}

std::string chatml_turn(std::string_view role, std::string_view content) {
  std::string turn;
  turn.append(kImStart).append(role).append("\n").append(content).append(kImEnd).append("\n");
  return turn;
}

bool is_tool_response(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

// Qwen3: the last user message that is not a wrapped tool response (the last message when there is none).
size_t last_query_index(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i > 0; --i)
    if (messages[i - 1].role == "user" && !is_tool_response(messages[i - 1].content)) return i - 1;
  return messages.empty() ? 0 : messages.size() - 1;
}

// Qwen3's assistant turn: reasoning before </think> goes into a <think> block, kept only after the last query.
std::string qwen3_assistant_turn(const ChatMessage& message, bool after_last_query, bool is_last) {
  std::string_view content = message.content;
  std::string_view reasoning;
  const size_t close = content.find("</think>");
  if (close != std::string_view::npos) {
    reasoning = rstrip_newlines(content.substr(0, close));
    const size_t open = reasoning.rfind("<think>");
    if (open != std::string_view::npos) reasoning.remove_prefix(open + std::string_view("<think>").size());
    reasoning = lstrip_newlines(reasoning);
    content = lstrip_newlines(content.substr(content.rfind("</think>") + std::string_view("</think>").size()));
  }
  std::string turn(kImStart);
  turn += "assistant\n";
  if (after_last_query && (is_last || !reasoning.empty())) {
    turn.append("<think>\n").append(lstrip_newlines(rstrip_newlines(reasoning))).append("\n</think>\n\n");
    turn.append(lstrip_newlines(content));
  } else {
    turn.append(content);
  }
  turn.append(kImEnd).append("\n");
  return turn;
}

std::string render_chatml(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt) {
  std::string out;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    out += chatml_turn("system", messages[0].content);
    first = 1;
  } else if (chat_template.default_system_prompt) {
    out += chatml_turn("system", *chat_template.default_system_prompt);
  }
  const size_t last_query = last_query_index(messages);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "tool" && chat_template.wraps_tool_responses) {
      if (i == 0 || messages[i - 1].role != "tool") out.append(kImStart).append("user");
      out.append("\n<tool_response>\n").append(message.content).append("\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out.append(kImEnd).append("\n");
    } else if (message.role == "assistant" && chat_template.separates_reasoning) {
      out += qwen3_assistant_turn(message, i > last_query, i + 1 == messages.size());
    } else {
      out += chatml_turn(message.role, message.content);
    }
  }
  if (add_generation_prompt) {
    out.append(kImStart).append("assistant\n");
    if (chat_template.separates_reasoning && !chat_template.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// Python's json.dumps(text, ensure_ascii=False): Llama 3.1+ templates pass tool results through tojson, and a
// string is iterable in Jinja, so string results arrive quoted.
std::string json_quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

std::string llama3_turn(std::string_view role, std::string_view content) {
  std::string turn;
  turn.append(kHeaderStart).append(role).append(kHeaderEnd).append("\n\n").append(content).append(kEotId);
  return turn;
}

std::string render_llama3(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt) {
  std::string out;
  if (chat_template.dated_system_header) {
    out = chat_template.bos_token;
    size_t first = 0;
    std::string system_message;
    if (!messages.empty() && messages[0].role == "system") {
      system_message = python_strip(messages[0].content);
      first = 1;
    }
    out.append(kHeaderStart).append("system").append(kHeaderEnd).append("\n\n");
    out += "Cutting Knowledge Date: " + chat_template.knowledge_cutoff + "\n";
    out += "Today Date: " + chat_template.date_string + "\n\n";
    out.append(system_message).append(kEotId);
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& message = messages[i];
      if (message.role == "tool" || message.role == "ipython")
        out += llama3_turn("ipython", json_quoted(message.content));
      else
        out += llama3_turn(message.role, python_strip(message.content));
    }
  } else {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i == 0) out += chat_template.bos_token;
      out += llama3_turn(messages[i].role, python_strip(messages[i].content));
    }
  }
  if (add_generation_prompt) out.append(kHeaderStart).append("assistant").append(kHeaderEnd).append("\n\n");
  return out;
}

// The template text in tokenizer_config.json: a string, or a list of named templates ("default" is used).
std::optional<std::string> template_field(const Json& config, const std::string& source) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string names;
    for (const Json& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
          !entry["template"].is_string())
        tokenizer_files::field_error(source, "chat_template", "must be a string or a list of {name, template} objects");
      if (entry["name"] == "default") return entry["template"].get<std::string>();
      names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    tokenizer_files::field_error(source, "chat_template", "has no template named 'default' (it has: " + names + ")");
  }
  tokenizer_files::field_error(source, "chat_template", "must be a string or a list of {name, template} objects");
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& path) {
  const std::string config_path = tokenizer_files::resolve(path, "tokenizer_config.json");
  const Json config = parse_json_text(read_text_file(config_path), config_path);
  if (!config.is_object()) fail(config_path + ": a tokenizer_config.json must be a JSON object");
  const std::string bos_token = tokenizer_files::token_name(config, "bos_token", config_path).value_or("");
  if (auto jinja = template_field(config, config_path)) return from_jinja(*jinja, config_path, bos_token);
  const std::string jinja_path = (std::filesystem::path(config_path).parent_path() / "chat_template.jinja").string();
  if (std::filesystem::is_regular_file(jinja_path))
    return from_jinja(read_text_file(jinja_path), jinja_path, bos_token);
  fail(config_path + ": has no 'chat_template' field and there is no chat_template.jinja beside it");
}

ChatTemplate ChatTemplate::from_jinja(const std::string& jinja, const std::string& source,
                                      const std::string& bos_token) {
  ChatTemplate result;
  result.source = source;
  result.bos_token = bos_token;
  if (contains(jinja, kImStart) && contains(jinja, kImEnd)) {
    result.format = ChatFormat::ChatML;
    result.default_system_prompt = find_default_system_prompt(jinja);
    result.wraps_tool_responses = contains(jinja, "<tool_response>");
    result.separates_reasoning = contains(jinja, "</think>") && contains(jinja, "reasoning_content");
    return result;
  }
  if (contains(jinja, kHeaderStart) && contains(jinja, kHeaderEnd) && contains(jinja, kEotId)) {
    result.format = ChatFormat::Llama3;
    if (const auto cutoff = literal_after(jinja, "Cutting Knowledge Date: ")) {
      result.dated_system_header = true;
      result.knowledge_cutoff = *cutoff;
      result.date_string = literal_after(jinja, "set date_string = \"").value_or("26 Jul 2024");
      if (const auto format = literal_after(jinja, "strftime_now(\"")) result.date_string = today(*format);
    }
    if (contains(jinja, "bos_token") && bos_token.empty())
      fail(source + ": the Llama 3 chat template starts with bos_token, but the tokenizer_config.json names none");
    return result;
  }
  fail(source +
       ": chat_template is not a family this program implements (ChatML with <|im_start|> as in Qwen2, "
       "or Llama 3 with <|start_header_id|>); it begins: " +
       jinja.substr(0, 120));
}

std::string ChatTemplate::end_of_turn() const { return std::string(format == ChatFormat::ChatML ? kImEnd : kEotId); }

std::string apply_chat_template(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  check_roles(chat_template, messages);
  if (chat_template.format == ChatFormat::ChatML) return render_chatml(chat_template, messages, add_generation_prompt);
  return render_llama3(chat_template, messages, add_generation_prompt);
}

}  // namespace npusim
