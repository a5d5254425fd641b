#pragma once
// Chat prompts for the model families we run, recognized from the Jinja `chat_template` of tokenizer_config.json
// (no Jinja engine: each family's template is implemented here and checked against the real templates).
//
//   ChatML (Qwen2, Qwen2.5, Qwen3): <|im_start|>role\ncontent<|im_end|>\n ... ; generation prompt
//     <|im_start|>assistant\n. Qwen2/2.5 add a default system prompt when the conversation has none; Qwen3 moves
//     <think> reasoning out of earlier assistant turns.
//   Llama 3 (3.0 to 3.3): <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ... ;
//     3.1 and later open with a system header holding the knowledge cutoff and the date.
#include <optional>
#include <string>
#include <vector>

namespace npusim {

struct ChatMessage {
  std::string role;  // system, user, assistant or tool (Llama 3 also takes ipython)
  std::string content;
};

enum class ChatFormat { ChatML, Llama3 };

struct ChatTemplate {
  ChatFormat format = ChatFormat::ChatML;
  std::string source;  // where the template came from, for messages

  // ChatML: the system prompt used when the first message is not a system message (absent: none).
  std::optional<std::string> default_system_prompt;
  // ChatML: consecutive tool messages are wrapped in one user turn as <tool_response> blocks (Qwen2.5, Qwen3).
  bool wraps_tool_responses = false;
  // ChatML (Qwen3): reasoning in <think>...</think> is kept only in assistant turns after the last user query.
  bool separates_reasoning = false;
  // Qwen3's enable_thinking: false puts an empty <think></think> block in the generation prompt.
  bool enable_thinking = true;

  std::string bos_token;  // Llama 3 begins the conversation with it
  // Llama 3.1+: the system header with the knowledge cutoff and the date.
  bool dated_system_header = false;
  std::string knowledge_cutoff;  // "December 2023"
  // "26 Jul 2024" as the template defaults it, or today's date when the template asks for strftime_now (as
  // transformers renders it). Set it to make prompts reproducible.
  std::string date_string;

  // Reads the chat template of tokenizer_config.json (`path` is that file or the model directory), or of a
  // chat_template.jinja beside it.
  static ChatTemplate load(const std::string& path);
  // Recognizes the family of a Jinja template; `source` names it in messages.
  static ChatTemplate from_jinja(const std::string& jinja, const std::string& source, const std::string& bos_token);

  // The token that ends a turn: generation stops there.
  std::string end_of_turn() const;
};

// The prompt text for `messages` as the template renders it (tokenize it without adding special tokens). With
// `add_generation_prompt`, it ends with the header that opens the assistant's reply.
std::string apply_chat_template(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

}  // namespace npusim
