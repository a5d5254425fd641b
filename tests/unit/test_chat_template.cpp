#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "llm/chat_template.h"
#include "npusim/error.h"
#include "work_dir.h"

using namespace npusim;
using Json = nlohmann::json;
using Messages = std::vector<ChatMessage>;

namespace {

const std::string kTemplates = NPUSIM_TEST_DATA "/tokenizer/templates/";
const std::string kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
const std::string kBos = "<|begin_of_text|>";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

ChatTemplate template_file(const std::string& name, const std::string& bos = "") {
  return ChatTemplate::from_jinja(read_text(kTemplates + name), name, bos);
}

std::string temp_dir() { return npusim::test::fresh_work_dir("chat"); }

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

void expect_error(const std::function<void()>& action, const std::vector<std::string>& parts) {
  try {
    action();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in: " << message;
  }
}

std::string chatml(const std::string& role, const std::string& content) {
  return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}

std::string llama(const std::string& role, const std::string& content) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>";
}

const std::string kLlamaAssistant = "<|start_header_id|>assistant<|end_header_id|>\n\n";

// ---------------------------------------------------------------------------------------------------------------
// Recognizing the families

TEST(ChatTemplateTest, RecognizesQwenTemplates) {
  const ChatTemplate qwen2 = template_file("qwen2.jinja");
  EXPECT_EQ(qwen2.format, ChatFormat::ChatML);
  EXPECT_EQ(qwen2.default_system_prompt, "You are a helpful assistant.");
  EXPECT_FALSE(qwen2.wraps_tool_responses);
  EXPECT_FALSE(qwen2.separates_reasoning);

  const ChatTemplate qwen25 = template_file("qwen2_5.jinja");
  EXPECT_EQ(qwen25.format, ChatFormat::ChatML);
  EXPECT_EQ(qwen25.default_system_prompt, kQwenSystem);
  EXPECT_TRUE(qwen25.wraps_tool_responses);
  EXPECT_FALSE(qwen25.separates_reasoning);
  EXPECT_EQ(qwen25.end_of_turn(), "<|im_end|>");

  const ChatTemplate qwen3 = template_file("qwen3.jinja");
  EXPECT_EQ(qwen3.format, ChatFormat::ChatML);
  EXPECT_EQ(qwen3.default_system_prompt, std::nullopt);
  EXPECT_TRUE(qwen3.wraps_tool_responses);
  EXPECT_TRUE(qwen3.separates_reasoning);
  EXPECT_TRUE(qwen3.enable_thinking);
}

TEST(ChatTemplateTest, RecognizesLlama3Templates) {
  const ChatTemplate llama30 = template_file("llama3.jinja", kBos);
  EXPECT_EQ(llama30.format, ChatFormat::Llama3);
  EXPECT_FALSE(llama30.dated_system_header);
  EXPECT_EQ(llama30.end_of_turn(), "<|eot_id|>");

  const ChatTemplate llama31 = template_file("llama3_1.jinja", kBos);
  EXPECT_EQ(llama31.format, ChatFormat::Llama3);
  EXPECT_TRUE(llama31.dated_system_header);
  EXPECT_EQ(llama31.knowledge_cutoff, "December 2023");
  EXPECT_EQ(llama31.date_string, "26 Jul 2024");

  // Llama 3.2 asks for today's date, as transformers renders it.
  const ChatTemplate llama32 = template_file("llama3_2.jinja", kBos);
  EXPECT_TRUE(llama32.dated_system_header);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char today[64];
  std::strftime(today, sizeof(today), "%d %b %Y", &local);
  EXPECT_EQ(llama32.date_string, today);
}

TEST(ChatTemplateTest, UnknownTemplatesAreRefusedWithTheirSource) {
  expect_error([] { ChatTemplate::from_jinja("{{ messages[0]['content'] }}", "model/tokenizer_config.json", ""); },
               {"model/tokenizer_config.json", "chat_template", "ChatML", "Llama 3"});
  expect_error([] { ChatTemplate::from_jinja("[INST] {{ m }} [/INST]", "x.jinja", ""); }, {"x.jinja", "[INST]"});
  expect_error([] { template_file("llama3.jinja", ""); }, {"llama3.jinja", "bos_token"});
}

// ---------------------------------------------------------------------------------------------------------------
// ChatML

TEST(ChatTemplateTest, Qwen25AddsItsDefaultSystemPrompt) {
  const ChatTemplate qwen = template_file("qwen2_5.jinja");
  EXPECT_EQ(apply_chat_template(qwen, {{"user", "Hi"}}, true),
            chatml("system", kQwenSystem) + chatml("user", "Hi") + "<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(qwen, {{"user", "Hi"}}, false), chatml("system", kQwenSystem) + chatml("user", "Hi"));
  EXPECT_EQ(apply_chat_template(qwen, {{"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hello."}}, false),
            chatml("system", "Be terse.") + chatml("user", "Hi") + chatml("assistant", "Hello."));
  // A later system message is an ordinary turn; contents are kept verbatim.
  EXPECT_EQ(apply_chat_template(qwen, {{"user", " a \n"}, {"system", "b"}}, false),
            chatml("system", kQwenSystem) + chatml("user", " a \n") + chatml("system", "b"));
  EXPECT_EQ(apply_chat_template(qwen, {}, true), chatml("system", kQwenSystem) + "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen25WrapsConsecutiveToolMessagesInOneUserTurn) {
  const ChatTemplate qwen = template_file("qwen2_5.jinja");
  const Messages messages = {{"user", "weather?"},
                             {"assistant", "checking"},
                             {"tool", "{\"t\": 20}"},
                             {"tool", "{\"h\": 5}"},
                             {"user", "thanks"}};
  EXPECT_EQ(apply_chat_template(qwen, messages, false),
            chatml("system", kQwenSystem) + chatml("user", "weather?") + chatml("assistant", "checking") +
                "<|im_start|>user\n<tool_response>\n{\"t\": 20}\n</tool_response>\n<tool_response>\n{\"h\": 5}\n"
                "</tool_response><|im_end|>\n" +
                chatml("user", "thanks"));
  // Qwen2's template has no tool handling: a tool message is a turn of its own.
  EXPECT_EQ(apply_chat_template(template_file("qwen2.jinja"), {{"tool", "x"}}, false),
            chatml("system", "You are a helpful assistant.") + chatml("tool", "x"));
}

TEST(ChatTemplateTest, Qwen3KeepsReasoningOnlyAfterTheLastQuery) {
  const ChatTemplate qwen = template_file("qwen3.jinja");
  const Messages history = {{"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "Q2"}};
  EXPECT_EQ(apply_chat_template(qwen, history, true),
            chatml("user", "Q1") + chatml("assistant", "A1") + chatml("user", "Q2") + "<|im_start|>assistant\n");
  // The reply to the last query keeps its reasoning, normalized to one block.
  Messages answered = history;
  answered.push_back({"assistant", "<think>r2</think>A2"});
  EXPECT_EQ(apply_chat_template(qwen, answered, false), chatml("user", "Q1") + chatml("assistant", "A1") +
                                                            chatml("user", "Q2") +
                                                            chatml("assistant", "<think>\nr2\n</think>\n\nA2"));
  // The last assistant message gets an (empty) think block even without reasoning.
  EXPECT_EQ(apply_chat_template(qwen, {{"user", "Q"}, {"assistant", "A"}}, false),
            chatml("user", "Q") + chatml("assistant", "<think>\n\n</think>\n\nA"));
  // A user message that only carries tool responses is not a query.
  EXPECT_EQ(apply_chat_template(qwen,
                                {{"user", "Q"},
                                 {"assistant", "<think>a</think>call"},
                                 {"user", "<tool_response>r</tool_response>"},
                                 {"assistant", "<think>b</think>done"}},
                                false),
            chatml("user", "Q") + chatml("assistant", "<think>\na\n</think>\n\ncall") +
                chatml("user", "<tool_response>r</tool_response>") +
                chatml("assistant", "<think>\nb\n</think>\n\ndone"));
  ChatTemplate no_thinking = qwen;
  no_thinking.enable_thinking = false;
  EXPECT_EQ(apply_chat_template(no_thinking, {{"user", "Q"}}, true),
            chatml("user", "Q") + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// ---------------------------------------------------------------------------------------------------------------
// Llama 3

TEST(ChatTemplateTest, Llama30TrimsContentsAndStartsWithBos) {
  const ChatTemplate llama3 = template_file("llama3.jinja", kBos);
  EXPECT_EQ(apply_chat_template(llama3, {{"system", " Be terse. "}, {"user", "\n Hi \t"}}, true),
            kBos + llama("system", "Be terse.") + llama("user", "Hi") + kLlamaAssistant);
  EXPECT_EQ(apply_chat_template(llama3, {}, true), kLlamaAssistant);
}

TEST(ChatTemplateTest, Llama31OpensWithTheDatedSystemHeader) {
  const ChatTemplate llama31 = template_file("llama3_1.jinja", kBos);
  const std::string header = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
  EXPECT_EQ(apply_chat_template(llama31, {{"user", "Hi"}}, true),
            kBos + llama("system", header) + llama("user", "Hi") + kLlamaAssistant);
  EXPECT_EQ(
      apply_chat_template(llama31, {{"system", "  Be terse.\n"}, {"user", "Hi"}, {"assistant", " Hello "}}, false),
      kBos + llama("system", header + "Be terse.") + llama("user", "Hi") + llama("assistant", "Hello"));
  // Tool results go under the ipython header, untrimmed and through tojson (the template's quirk for strings).
  EXPECT_EQ(apply_chat_template(llama31, {{"user", "Hi"}, {"tool", " 4\"2\\\n\x01 "}}, false),
            kBos + llama("system", header) + llama("user", "Hi") + llama("ipython", "\" 4\\\"2\\\\\\n\\u0001 \""));
  ChatTemplate dated = llama31;
  dated.date_string = "01 Jan 2025";
  EXPECT_EQ(apply_chat_template(dated, {}, false),
            kBos + llama("system", "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n"));
}

TEST(ChatTemplateTest, RolesOutsideTheTemplateAreErrors) {
  expect_error(
      [] {
        apply_chat_template(template_file("qwen2_5.jinja"), {{"user", "a"}, {"function", "b"}}, true);
      },
      {"chat message 1", "'function'", "qwen2_5.jinja"});
  expect_error(
      [] {
        apply_chat_template(template_file("llama3_1.jinja", kBos), {{"", "a"}}, true);
      },
      {"chat message 0", "role ''"});
  EXPECT_NO_THROW(apply_chat_template(template_file("llama3_1.jinja", kBos), {{"ipython", "a"}}, true));
}

// ---------------------------------------------------------------------------------------------------------------
// Loading from tokenizer_config.json

TEST(ChatTemplateTest, LoadsFromTokenizerConfig) {
  const std::string dir = temp_dir();
  const Json config = {{"chat_template", read_text(kTemplates + "llama3_1.jinja")},
                       {"bos_token", {{"content", kBos}, {"__type", "AddedToken"}}}};
  write_file(dir, "tokenizer_config.json", config.dump());
  const ChatTemplate loaded = ChatTemplate::load(dir);
  EXPECT_EQ(loaded.format, ChatFormat::Llama3);
  EXPECT_EQ(loaded.bos_token, kBos);
  EXPECT_EQ(loaded.source, dir + "/tokenizer_config.json");
  EXPECT_EQ(ChatTemplate::load(dir + "/tokenizer_config.json").format, ChatFormat::Llama3);
}

TEST(ChatTemplateTest, LoadsTheDefaultOfNamedTemplatesAndChatTemplateJinja) {
  const std::string named = temp_dir();
  write_file(named, "tokenizer_config.json",
             Json{{"chat_template",
                   {{{"name", "tool_use"}, {"template", "x"}},
                    {{"name", "default"}, {"template", read_text(kTemplates + "qwen2_5.jinja")}}}}}
                 .dump());
  EXPECT_EQ(ChatTemplate::load(named).default_system_prompt, kQwenSystem);

  const std::string beside = temp_dir();
  write_file(beside, "tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  write_file(beside, "chat_template.jinja", read_text(kTemplates + "qwen3.jinja"));
  const ChatTemplate from_jinja_file = ChatTemplate::load(beside);
  EXPECT_TRUE(from_jinja_file.separates_reasoning);
  EXPECT_EQ(from_jinja_file.source, beside + "/chat_template.jinja");
}

TEST(ChatTemplateTest, LoadErrorsNameTheFile) {
  const std::string dir = temp_dir();
  expect_error([&] { ChatTemplate::load(dir); }, {dir + "/tokenizer_config.json", "cannot open"});
  write_file(dir, "tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  expect_error([&] { ChatTemplate::load(dir); }, {dir + "/tokenizer_config.json", "no 'chat_template'"});
  write_file(dir, "tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  expect_error([&] { ChatTemplate::load(dir); }, {"chat_template", "'default'", "tool_use"});
  write_file(dir, "tokenizer_config.json", R"({"chat_template": 7})");
  expect_error([&] { ChatTemplate::load(dir); }, {"tokenizer_config.json", "chat_template"});
  write_file(dir, "tokenizer_config.json", R"({"chat_template": "{{ 1 }}"})");
  expect_error([&] { ChatTemplate::load(dir); }, {"tokenizer_config.json", "not a family"});
}

// ---------------------------------------------------------------------------------------------------------------
// The reference: the real templates rendered by jinja2 as transformers does (tests/python/render_chat_template.py)

struct Case {
  std::string template_name;
  Messages messages;
  bool add_generation_prompt;
  bool enable_thinking = true;
};

Json messages_json(const Messages& messages) {
  Json list = Json::array();
  for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
  return list;
}

std::string run_reference(const Json& cases, std::string& errors) {
  const std::string dir = temp_dir();
  const std::string input = write_file(dir, "cases.json", cases.dump());
  const std::string errors_path = dir + "/stderr.txt";
  const std::string command = "/usr/bin/python3 '" + std::string(NPUSIM_PYTHON_DIR) + "/render_chat_template.py' '" +
                              input + "' 2>'" + errors_path + "'";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return "";
  char buffer[65536];
  size_t count = 0;
  while ((count = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, count);
  const int status = pclose(pipe);
  errors = read_text(errors_path);
  return status == 0 ? output : "";
}

TEST(ChatTemplateReferenceTest, MatchesTransformersRendering) {
  const std::vector<Messages> conversations = {
      {{"user", "Hello"}},
      {{"system", "  You are terse.\n"}, {"user", " What is 2+2? "}, {"assistant", "4"}, {"user", "And 3+3?\n"}},
      {{"user", "Q1"},
       {"assistant", "<think>\nr1\n</think>\n\nA1"},
       {"user", "Q2"},
       {"assistant", "<think>r2</think>A2"}},
      {{"user", "Q1"}, {"assistant", "plain"}, {"user", "Q2"}, {"assistant", "\n\n<think>x</think>\n\ny\n"}},
      {{"user", "weather?"},
       {"assistant", "checking"},
       {"tool", "{\"t\": 20}"},
       {"tool", "a\\b\n\tc\x01"},
       {"user", "ok"}},
      {{"user", "Q"}, {"assistant", "<think>a</think>call"}, {"user", "<tool_response>r</tool_response>"}},
      {{"system", "Only system"}},
      {{"user", "\t \u00dcn\u00efc\u00f6d\u00e9 \u65e5\u672c \xF0\x9F\x98\x80 \n\n"}, {"assistant", "\u00a0ok\u3000"}},
      {{"user", "line1\nline2"}, {"assistant", "<|im_end|> inside"}, {"user", "{{ not jinja }} {% raw %}"}},
  };
  const std::string date = "05 Mar 2025";
  std::vector<std::string> names = {"qwen2.jinja",  "qwen2_5.jinja",  "qwen3.jinja",
                                    "llama3.jinja", "llama3_1.jinja", "llama3_2.jinja"};
  std::vector<Case> cases;
  for (const std::string& name : names)
    for (const Messages& conversation : conversations)
      for (const bool generation : {false, true}) cases.push_back({name, conversation, generation});
  cases.push_back({"qwen3.jinja", {{"user", "Q"}}, true, false});

  Json input = Json::array();
  std::vector<std::string> ours;
  for (const Case& c : cases) {
    ChatTemplate chat_template = template_file(c.template_name, kBos);
    Json kwargs = {{"bos_token", kBos}};
    if (c.template_name == "llama3_1.jinja" || c.template_name == "llama3_2.jinja") {
      chat_template.date_string = date;
      kwargs["date_string"] = date;
    }
    if (!c.enable_thinking) {
      chat_template.enable_thinking = false;
      kwargs["enable_thinking"] = false;
    }
    input.push_back({{"template", read_text(kTemplates + c.template_name)},
                     {"messages", messages_json(c.messages)},
                     {"add_generation_prompt", c.add_generation_prompt},
                     {"kwargs", kwargs}});
    ours.push_back(apply_chat_template(chat_template, c.messages, c.add_generation_prompt));
  }
  std::string errors;
  const std::string output = run_reference(input, errors);
  ASSERT_FALSE(output.empty()) << "render_chat_template.py failed (python3-jinja2 comes with scripts/setup.sh):\n"
                               << errors;
  const Json reference = Json::parse(output);
  ASSERT_EQ(reference.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(ours[i], reference[i].get<std::string>())
        << cases[i].template_name << " conversation " << Json(messages_json(cases[i].messages)).dump()
        << " generation prompt " << cases[i].add_generation_prompt;
}

}  // namespace
