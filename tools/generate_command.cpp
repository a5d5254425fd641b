// npusim generate / npusim chat: text generation from a Hugging Face model directory.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "llm/chat_template.h"
#include "llm/model_dir.h"
#include "llm/sampler.h"
#include "llm/session.h"
#include "llm/tokenizer.h"
#include "loading.h"

namespace npusim::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

const std::vector<OptionSpec> kModelOptions = {
    {"model", true, "DIR: Hugging Face model directory (config.json, model.safetensors or shards, tokenizer.json)"},
    {"ctx", true, "N: context positions of the KV cache (default min(4096, max_position_embeddings))"},
    {"dtype", true, "float32|bfloat16|float16: storage of weights, activations and cache (default: the checkpoint's)"},
    {"threads", true, "N: CPU threads counting the caller (default: one per hardware thread)"},
    {"quantize", true, "none|int8: linear weights quantized to int8 at load, with fp32 scales (default none)"},
    {"quantize-group", true,
     "N: with --quantize int8, one scale per N input values, a multiple of 8 (default: "
     "one per output channel)"},
    {"compact-bf16", true,
     "on|off: CPU backend, bf16 weights not quantized: linear weights kept in 12 bits per value without loss "
     "(default on)"},
    {"prefill-chunk", true, "N: the largest prefill step of the native graph (default 128)"},
    {"target", true, "NAME|FILE.json: the target whose backend runs the model: cpu (default) or cuda"},
    {"prefill-ir", true, "FILE: exported torch_ir prefill graph (with --decode-ir) instead of the native builder"},
    {"decode-ir", true, "FILE: exported torch_ir decode graph with a static KV cache"},
};

const std::vector<OptionSpec> kSamplingOptions = {
    {"n", true, "N: generate at most N new tokens (also -n; default 128)"},
    {"greedy", false, "always take the most likely token (the same as --temperature 0)"},
    {"temperature", true, "T: sampling temperature; 0 is greedy (default: generation_config.json, else greedy)"},
    {"top-k", true, "K: sample among the K most likely tokens (0: off)"},
    {"top-p", true, "P: sample among the most likely tokens that cover probability P (1: off)"},
    {"min-p", true, "P: drop tokens less likely than P times the most likely one (0: off)"},
    {"repeat-penalty", true, "R: repetition penalty on tokens already in the context (1: off)"},
    {"seed", true, "S: random seed, for reproducible sampling (default: random)"},
    {"stop", true, "STRING: stop when the text contains STRING (may be given several times)"},
};

const std::vector<OptionSpec> kGenerateOnlyOptions = {
    {"prompt", true, "TEXT: the prompt (needs tokenizer.json)"},
    {"prompt-ids", true, "1,2,3: the prompt as token ids (no tokenizer needed)"},
    {"ids", false, "print token ids instead of text"},
    {"chat", false, "wrap the prompt in the model's chat template as one user message"},
    {"system", true, "TEXT: with --chat, the system message"},
    {"help", false, "show this help"},
};

const std::vector<OptionSpec> kChatOnlyOptions = {
    {"system", true, "TEXT: the system message"},
    {"help", false, "show this help"},
};

// `-n N` as the other options spell it.
std::vector<std::string> with_long_names(std::vector<std::string> argv) {
  for (std::string& arg : argv)
    if (arg == "-n") arg = "--n";
  return argv;
}

double number_option(const Args& args, const std::string& command, const std::string& name, double fallback) {
  const auto text = args.value(name);
  if (!text) return fallback;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text->size())
    fail("npusim " + command + ": option '--" + name + "' needs a number, got '" + *text + "'");
  return value;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string current;
  const auto flush = [&] {
    if (current.empty()) return;
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(current, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != current.size() || value < 0 || value > INT32_MAX)
      fail("--prompt-ids: '" + current + "' is not a token id (expected ids like 1,2,3)");
    ids.push_back(static_cast<int32_t>(value));
    current.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\t' || c == '\n')
      flush();
    else
      current += c;
  }
  flush();
  if (ids.empty()) fail("--prompt-ids: no token ids given");
  return ids;
}

// Defaults from generation_config.json, then the command line. Sampling options given without a temperature
// sample at temperature 1 when the defaults are greedy.
SamplingOptions sampling_options(const Args& args, const std::string& command, const ModelDir& model) {
  SamplingOptions options;
  if (const auto& generation = model.generation_config()) {
    if (generation->do_sample.value_or(false)) options.temperature = generation->temperature.value_or(1.0);
    options.top_k = generation->top_k.value_or(0);
    options.top_p = generation->top_p.value_or(1.0);
    options.min_p = generation->min_p.value_or(0.0);
    options.repetition_penalty = generation->repetition_penalty.value_or(1.0);
  }
  const bool asks_sampling = args.value("top-k") || args.value("top-p") || args.value("min-p") || args.value("seed");
  if (asks_sampling && options.greedy()) options.temperature = 1.0;
  options.temperature = number_option(args, command, "temperature", options.temperature);
  if (args.flag("greedy")) options.temperature = 0.0;
  options.top_k = args.integer("top-k", options.top_k, 0, int64_t{1} << 31);
  options.top_p = number_option(args, command, "top-p", options.top_p);
  options.min_p = number_option(args, command, "min-p", options.min_p);
  options.repetition_penalty = number_option(args, command, "repeat-penalty", options.repetition_penalty);
  if (args.value("seed"))
    options.seed = static_cast<uint64_t>(args.integer("seed", 0, 0, INT64_MAX));
  else
    options.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  check_sampling_options(options);
  return options;
}

// Holds back text that may be the start of a stop string, and cuts the text where one appears.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  }

  // The text that can be shown now; sets `stopped` when a stop string appeared (the text ends before it).
  std::string push(const std::string& text, bool& stopped) {
    pending_ += text;
    size_t cut = std::string::npos;
    for (const std::string& stop : stops_) cut = std::min(cut, pending_.find(stop));
    if (cut != std::string::npos) {
      stopped = true;
      std::string shown = pending_.substr(0, cut);
      pending_.clear();
      return shown;
    }
    size_t hold = 0;
    for (const std::string& stop : stops_)
      for (size_t length = std::min(stop.size() - 1, pending_.size()); length > hold; --length)
        if (pending_.compare(pending_.size() - length, length, stop, 0, length) == 0) {
          hold = length;
          break;
        }
    std::string shown = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return shown;
  }

  std::string finish() { return std::exchange(pending_, {}); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;
  int64_t generated = 0;
  int64_t decode_steps = 0;
  double decode_seconds = 0;
  double first_token_seconds = 0;
};

struct GenerationRequest {
  int64_t max_tokens = 128;
  std::vector<int32_t> stop_tokens;
  bool print_ids = false;
  std::vector<std::string> stop_strings;
};

// Feeds `prompt`, then samples, streams and feeds tokens until a stop token, a stop string, the token limit or
// the end of the context. Appends what entered the cache to `context_tokens` and returns the generated text.
std::string generate(Session& session, Sampler& sampler, const std::optional<Tokenizer>& tokenizer,
                     std::span<const int32_t> prompt, const GenerationRequest& request,
                     std::vector<int32_t>& context_tokens, GenerationStats& stats) {
  const auto start = Clock::now();
  std::vector<float> logits = session.feed(prompt);
  stats.prompt_tokens += static_cast<int64_t>(prompt.size());
  stats.prompt_seconds += seconds_since(start);
  context_tokens.insert(context_tokens.end(), prompt.begin(), prompt.end());

  std::optional<TokenStreamDecoder> decoder;
  if (tokenizer) decoder.emplace(*tokenizer, true);
  StopMatcher stops(request.stop_strings);
  std::string text;
  const auto emit = [&](const std::string& piece) {
    text += piece;
    if (!request.print_ids && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  for (int64_t i = 0; i < request.max_tokens; ++i) {
    const int32_t token = sampler.sample(logits, context_tokens);
    if (i == 0) stats.first_token_seconds = seconds_since(start);
    if (std::find(request.stop_tokens.begin(), request.stop_tokens.end(), token) != request.stop_tokens.end()) break;
    ++stats.generated;
    if (request.print_ids) {
      std::printf("%s%d", i ? " " : "", token);
      std::fflush(stdout);
    }
    bool stopped = false;
    if (decoder) emit(stops.push(decoder->push(token), stopped));
    if (stopped) break;
    if (i + 1 == request.max_tokens) break;
    if (session.position() >= session.context()) {
      std::fprintf(stderr, "\n[the context of %lld tokens is full]\n", static_cast<long long>(session.context()));
      break;
    }
    const auto step = Clock::now();
    logits = session.feed(std::span<const int32_t>(&token, 1));
    stats.decode_seconds += seconds_since(step);
    ++stats.decode_steps;
    context_tokens.push_back(token);
  }
  if (decoder) {
    bool stopped = false;
    emit(stops.push(decoder->finish(), stopped));
    emit(stops.finish());
  }
  if (request.print_ids) std::printf("\n");
  std::fflush(stdout);
  return text;
}

void print_stats(const GenerationStats& stats) {
  const auto rate = [](double count, double seconds) { return seconds > 0 ? count / seconds : 0.0; };
  std::fprintf(stderr, "\nprompt:     %6lld tokens in %9.1f ms, %9.2f tokens/s\n",
               static_cast<long long>(stats.prompt_tokens), stats.prompt_seconds * 1e3,
               rate(static_cast<double>(stats.prompt_tokens), stats.prompt_seconds));
  std::fprintf(stderr, "generation: %6lld tokens, %6lld decode steps in %9.1f ms, %9.2f tokens/s\n",
               static_cast<long long>(stats.generated), static_cast<long long>(stats.decode_steps),
               stats.decode_seconds * 1e3, rate(static_cast<double>(stats.decode_steps), stats.decode_seconds));
  std::fprintf(stderr, "time to first token: %.1f ms\n", stats.first_token_seconds * 1e3);
  std::fprintf(stderr, "peak memory: %.1f MB\n", peak_memory_mb());
}

std::optional<Tokenizer> load_tokenizer(const ModelDir& model) {
  if (!model.has_tokenizer()) return std::nullopt;
  return Tokenizer::load(model.path());
}

// End-of-sequence ids of the model, the tokenizer's, and the chat template's end of turn.
std::vector<int32_t> stop_tokens(const ModelDir& model, const std::optional<Tokenizer>& tokenizer,
                                 const std::optional<ChatTemplate>& chat) {
  std::vector<int32_t> ids;
  for (int64_t id : model.eos_token_ids()) ids.push_back(static_cast<int32_t>(id));
  if (tokenizer) {
    if (const auto eos = tokenizer->eos_token_id()) ids.push_back(*eos);
    if (chat)
      if (const auto end = tokenizer->token_id(chat->end_of_turn())) ids.push_back(*end);
  }
  return ids;
}

void require_model(const Args& args, const std::string& command) {
  if (!args.value("model")) fail("npusim " + command + ": --model DIR is required (see npusim " + command + " --help)");
  if (!args.positionals().empty())
    fail("npusim " + command + ": unexpected argument '" + args.positionals().front() + "'");
}

}  // namespace

int generate_command(const std::vector<std::string>& argv) {
  const Args args("generate", join({kModelOptions, kSamplingOptions, kGenerateOnlyOptions}), with_long_names(argv));
  if (args.flag("help")) {
    std::printf("usage: npusim generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]\n%s",
                args.usage().c_str());
    return 0;
  }
  require_model(args, "generate");
  if (args.value("prompt").has_value() == args.value("prompt-ids").has_value())
    fail("npusim generate: give the prompt as --prompt TEXT or as --prompt-ids 1,2,3 (one of them)");
  const ModelDir model = ModelDir::open(*args.value("model"));
  const std::optional<Tokenizer> tokenizer = load_tokenizer(model);
  if (!tokenizer && args.value("prompt"))
    fail(model.path() + ": no tokenizer.json, so --prompt TEXT cannot be encoded; give --prompt-ids 1,2,3");
  if (!tokenizer && !args.flag("ids"))
    fail(model.path() + ": no tokenizer.json, so the output cannot be decoded to text; add --ids to print token ids");
  if (!tokenizer && !args.values("stop").empty())
    fail(model.path() + ": no tokenizer.json, so --stop STRING cannot be matched against the text");
  if (args.flag("chat") && !args.value("prompt")) fail("npusim generate: --chat takes the prompt as --prompt TEXT");
  if (args.value("system") && !args.flag("chat")) fail("npusim generate: --system goes with --chat");

  std::optional<ChatTemplate> chat;
  std::vector<int32_t> prompt;
  if (const auto ids = args.value("prompt-ids")) {
    prompt = parse_ids(*ids);
  } else if (args.flag("chat")) {
    chat = ChatTemplate::load(model.path());
    std::vector<ChatMessage> messages;
    if (const auto system = args.value("system")) messages.push_back({"system", *system});
    messages.push_back({"user", *args.value("prompt")});
    prompt = tokenizer->encode(apply_chat_template(*chat, messages, true), false);
  } else {
    prompt = tokenizer->encode(*args.value("prompt"), true);
  }
  if (prompt.empty()) fail("npusim generate: the prompt encodes to no tokens");

  GenerationRequest request;
  request.max_tokens = args.integer("n", 128, 0, int64_t{1} << 30);
  request.print_ids = args.flag("ids");
  request.stop_strings = args.values("stop");
  request.stop_tokens = stop_tokens(model, tokenizer, chat);
  Sampler sampler(sampling_options(args, "generate", model));

  Session session(model, session_options(args));
  std::fprintf(stderr, "npusim: %s\n", session.describe().c_str());
  if (static_cast<int64_t>(prompt.size()) > session.context())
    fail("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
         std::to_string(session.context()) + " (--ctx; at most max_position_embeddings " +
         std::to_string(model.config().max_position_embeddings) + ")");
  session.prepare(static_cast<int64_t>(prompt.size()));
  GenerationStats stats;
  std::vector<int32_t> context_tokens;
  if (request.max_tokens == 0) {
    const auto start = Clock::now();
    session.feed(prompt);
    stats.prompt_tokens = static_cast<int64_t>(prompt.size());
    stats.prompt_seconds = seconds_since(start);
  } else {
    generate(session, sampler, tokenizer, prompt, request, context_tokens, stats);
  }
  if (!request.print_ids) std::printf("\n");
  print_stats(stats);
  return 0;
}

int chat_command(const std::vector<std::string>& argv) {
  const Args args("chat", join({kModelOptions, kSamplingOptions, kChatOnlyOptions}), with_long_names(argv));
  if (args.flag("help")) {
    std::printf(
        "usage: npusim chat --model DIR [options]\n"
        "Type a message and press enter; /reset starts a new conversation, /exit (or end of input) quits.\n%s",
        args.usage().c_str());
    return 0;
  }
  require_model(args, "chat");
  const ModelDir model = ModelDir::open(*args.value("model"));
  const std::optional<Tokenizer> tokenizer = load_tokenizer(model);
  if (!tokenizer) fail(model.path() + ": npusim chat needs tokenizer.json and tokenizer_config.json");
  const std::optional<ChatTemplate> chat = ChatTemplate::load(model.path());

  GenerationRequest request;
  request.max_tokens = args.integer("n", 1024, 1, int64_t{1} << 30);
  request.stop_strings = args.values("stop");
  request.stop_tokens = stop_tokens(model, tokenizer, chat);
  Sampler sampler(sampling_options(args, "chat", model));
  Session session(model, session_options(args));
  std::fprintf(stderr, "npusim: %s\n", session.describe().c_str());

  std::vector<ChatMessage> messages;
  if (const auto system = args.value("system")) messages.push_back({"system", *system});
  const size_t first_turn = messages.size();
  std::vector<int32_t> context_tokens;  // what the cache holds, in order
  GenerationStats total;
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages.resize(first_turn);
      context_tokens.clear();
      session.rewind(0);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    const std::vector<int32_t> prompt = tokenizer->encode(apply_chat_template(*chat, messages, true), false);
    // The conversation so far is in the cache already: feed only what follows the common prefix.
    size_t common = 0;
    while (common < prompt.size() && common < context_tokens.size() && prompt[common] == context_tokens[common])
      ++common;
    if (common == prompt.size()) --common;  // a step needs at least one new token
    if (static_cast<int64_t>(prompt.size()) > session.context()) {
      std::fprintf(stderr, "error: the conversation (%zu tokens) no longer fits the context of %lld; /reset\n",
                   prompt.size(), static_cast<long long>(session.context()));
      messages.pop_back();
      continue;
    }
    session.rewind(static_cast<int64_t>(common));
    context_tokens.resize(common);
    session.prepare(static_cast<int64_t>(prompt.size() - common));
    GenerationStats stats;
    const std::string reply =
        generate(session, sampler, tokenizer, std::span(prompt).subspan(common), request, context_tokens, stats);
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", reply});
    total.prompt_tokens += stats.prompt_tokens;
    total.prompt_seconds += stats.prompt_seconds;
    total.generated += stats.generated;
    total.decode_steps += stats.decode_steps;
    total.decode_seconds += stats.decode_seconds;
    total.first_token_seconds = stats.first_token_seconds;
  }
  print_stats(total);
  return 0;
}

}  // namespace npusim::cli
