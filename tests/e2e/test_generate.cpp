// Generation end to end on the qwen_tiny fixture: the native builder and the exported graphs against the Hugging
// Face reference (greedy tokens, decode-step logits and caches), against each other, chunked prefill against
// one full prefill on the reference path, the KV cache kept in place between runs, seeds, bad model directories,
// and the `npusim generate` command.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "compiler/compile.h"
#include "e2e_util.h"
#include "ir/torch_ir_reader.h"
#include "llm/chat_template.h"
#include "llm/model_dir.h"
#include "llm/native_builder.h"
#include "llm/sampler.h"
#include "llm/session.h"
#include "llm/tokenizer.h"
#include "llm/utf8_stream.h"
#include "runtime/compare.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"

namespace npusim {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = test::kFixtures + "/qwen_tiny";
constexpr int64_t kContext = 64;  // the exported decode graph's static cache

// A model directory as users have it, assembled from the fixture files.
std::string make_model_dir(const std::string& name, bool with_weights = true, bool with_config = true) {
  const std::string dir = test::work_dir("generate/" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  if (with_config) fs::copy_file(kTiny + "/config.json", dir + "/config.json");
  if (with_weights) fs::copy_file(kTiny + "/model.safetensors", dir + "/model.safetensors");
  return dir;
}

const ModelDir& tiny() {
  static const ModelDir model = ModelDir::open(make_model_dir("qwen_tiny"));
  return model;
}

struct Greedy {
  std::vector<int32_t> prompt, continuation;
};

const Greedy& greedy_reference() {
  static const Greedy greedy = [] {
    std::ifstream in(kTiny + "/greedy.json");
    const nlohmann::json json = nlohmann::json::parse(in);
    Greedy g;
    g.prompt = json.at("prompt").get<std::vector<int32_t>>();
    const auto all = json.at("greedy").get<std::vector<int32_t>>();
    g.continuation.assign(all.begin() + static_cast<std::ptrdiff_t>(g.prompt.size()), all.end());
    return g;
  }();
  return greedy;
}

SessionOptions native_options(int64_t chunk = 128) {
  return {.context = kContext, .prefill_chunk = chunk, .dtype = DType::Float32};
}

SessionOptions exported_options() {
  return {.dtype = DType::Float32, .prefill_ir = kTiny + "/prefill_ir.json", .decode_ir = kTiny + "/decode_ir.json"};
}

std::vector<int32_t> greedy_tokens(Session& session, std::span<const int32_t> prompt, size_t count) {
  std::vector<float> logits = session.feed(prompt);
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < count; ++i) {
    tokens.push_back(argmax(logits));
    if (i + 1 < count) logits = session.feed(std::span<const int32_t>(&tokens.back(), 1));
  }
  return tokens;
}

Tensor row_tensor(const std::vector<float>& values) {
  Tensor t(DType::Float32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

// Row `row` of logits [1, rows, V].
Tensor logits_row(const Tensor& logits, int64_t row) {
  const int64_t vocab = logits.shape().back();
  const float* begin = logits.to(DType::Float32).data<float>() + row * vocab;
  return row_tensor({begin, begin + vocab});
}

void expect_close(const Tensor& actual, const Tensor& expected, double tolerance, const std::string& what) {
  const Comparison c = compare_tensors(actual.reshaped(expected.shape()), expected);
  EXPECT_LT(c.max_abs_diff, tolerance) << what << ": " << c.summary();
}

Tensor int64_tensor(Shape shape, const std::vector<int64_t>& values) {
  Tensor t(DType::Int64, std::move(shape));
  std::copy(values.begin(), values.end(), t.mutable_data<int64_t>());
  return t;
}

std::vector<int64_t> iota(int64_t start, int64_t count) {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(start + i);
  return values;
}

// ---- greedy continuation ----

TEST(Generate, NativeGreedyContinuationMatchesHuggingFace) {
  Session session(tiny(), native_options());
  EXPECT_EQ(greedy_tokens(session, greedy_reference().prompt, 8), greedy_reference().continuation);
  EXPECT_EQ(session.position(), 16 + 7);
}

TEST(Generate, ExportedGreedyContinuationMatchesHuggingFace) {
  Session session(tiny(), exported_options());
  EXPECT_EQ(session.context(), kContext);
  EXPECT_EQ(greedy_tokens(session, greedy_reference().prompt, 8), greedy_reference().continuation);
}

TEST(Generate, NativePrefillLogitsMatchHuggingFace) {
  const SafetensorsFile reference = SafetensorsFile::open(kTiny + "/reference.safetensors");
  const Tensor expected = reference.get("logits");
  Session session(tiny(), native_options(4));
  const std::vector<int32_t>& prompt = greedy_reference().prompt;
  // One token at a time through the chunks: the logits after each prefix are the reference's row.
  for (size_t i = 0; i < prompt.size(); i += 4) {
    const std::vector<float> logits = session.feed(std::span(prompt).subspan(i, 4));
    expect_close(row_tensor(logits), logits_row(expected, static_cast<int64_t>(i + 3)), 1e-4,
                 "row " + std::to_string(i + 3));
  }
}

// ---- one decode step against the fixture, with the cache kept on the backend ----

struct DecodeCase {
  SafetensorsFile reference = SafetensorsFile::open(kTiny + "/decode_reference.safetensors");
};

std::unique_ptr<PreparedProgram> prepare_with_state(const Graph& graph,
                                                    const std::vector<std::pair<std::string, std::string>>& pairs) {
  const Program program = compiler::compile_graph(graph, {});
  cpu::CpuBackend backend;
  std::unique_ptr<PreparedProgram> prepared = backend.prepare(program, tiny().weights().bind(program.graph).tensors);
  prepared->bind_state(pairs);
  return prepared;
}

void check_decode_step(const Graph& graph, const std::vector<std::pair<std::string, std::string>>& pairs) {
  const DecodeCase c;
  std::unique_ptr<PreparedProgram> prepared = prepare_with_state(graph, pairs);
  std::map<std::string, Tensor> inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = c.reference.get(graph.value(id).name);
  const NamedTensors outputs = prepared->run(inputs);
  ASSERT_EQ(outputs.size(), 1u) << "state outputs are not returned";
  expect_close(outputs[0].second, c.reference.get("out_0"), 1e-4, "logits");
  for (size_t i = 0; i < pairs.size(); ++i)
    expect_close(prepared->read_state(pairs[i].first), c.reference.get("out_" + std::to_string(i + 1)), 1e-5,
                 "cache " + pairs[i].first);

  // A second step without the caches as inputs continues from the state the first one left.
  const Graph exported = read_torch_ir(kTiny + "/decode_ir.json");
  std::map<std::string, Tensor> next{{"input_ids", int64_tensor({1, 1}, {9})},
                                     {"position_ids", int64_tensor({1, 1}, {6})},
                                     {"cache_position", int64_tensor({1}, {6})}};
  std::map<std::string, Tensor> full = next;
  Tensor mask(DType::Float32, {1, 1, 1, kContext});
  for (int64_t j = 7; j < kContext; ++j) mask.mutable_data<float>()[j] = -INFINITY;
  full["attention_mask"] = mask;
  if (graph.find_value("attention_mask")) next["attention_mask"] = mask;
  for (size_t i = 0; i < pairs.size(); ++i)
    full["kv_" + std::to_string(i)] = c.reference.get("out_" + std::to_string(i + 1));
  const NamedTensors expected = ReferenceExecutor(exported, tiny().weights().bind(exported).tensors).run(full);
  const NamedTensors second = prepared->run(next);
  expect_close(second[0].second, expected[0].second, 1e-4, "second step logits");
  for (size_t i = 0; i < pairs.size(); ++i)
    expect_close(prepared->read_state(pairs[i].first), expected[1 + i].second, 1e-5, "second step " + pairs[i].first);
}

TEST(DecodeStep, NativeGraphMatchesFixtureAndKeepsItsCache) {
  const Graph graph = build_native_graph(tiny().config(), {.tokens = 1, .context = kContext});
  check_decode_step(graph, native_cache_pairs(tiny().config()));
}

TEST(DecodeStep, ExportedGraphMatchesFixtureAndKeepsItsCache) {
  const Graph graph = read_torch_ir(kTiny + "/decode_ir.json");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t i = 0; i < 4; ++i)
    pairs.emplace_back(graph.value(graph.inputs[4 + i]).name, graph.value(graph.outputs[1 + i]).name);
  check_decode_step(graph, pairs);
}

// ---- the two ways agree; chunks agree with one full prefill ----

TEST(Generate, NativeAndExportedGraphsAgree) {
  // 5 tokens: the exported prefill pads them; 21 tokens: its 16 and then decode steps.
  for (size_t length : {5u, 21u}) {
    std::vector<int32_t> prompt = greedy_reference().prompt;
    for (int32_t extra : {17, 250, 3, 499, 64}) prompt.push_back(extra);
    prompt.resize(length);
    Session native(tiny(), native_options(8));
    Session exported(tiny(), exported_options());
    std::vector<float> a = native.feed(prompt), b = exported.feed(prompt);
    for (int step = 0; step < 4; ++step) {
      expect_close(row_tensor(a), row_tensor(b), 1e-4,
                   "length " + std::to_string(length) + " step " + std::to_string(step));
      const int32_t token = argmax(a);
      ASSERT_EQ(token, argmax(b));
      a = native.feed(std::span<const int32_t>(&token, 1));
      b = exported.feed(std::span<const int32_t>(&token, 1));
    }
    ASSERT_EQ(native.cache_count(), exported.cache_count());
    for (int64_t i = 0; i < native.cache_count(); ++i)
      expect_close(native.cache(i), exported.cache(i), 1e-5, "cache " + std::to_string(i));
  }
}

TEST(Generate, ChunkedPrefillEqualsOneFullPrefillOnTheReferencePath) {
  const std::vector<int32_t>& prompt = greedy_reference().prompt;
  const auto length = static_cast<int64_t>(prompt.size());
  Session chunked(tiny(), native_options(6));  // chunks of 6, 6 and 4
  const std::vector<float> logits = chunked.feed(prompt);

  const Graph full = build_native_graph(tiny().config(), {.tokens = length, .context = kContext, .all_logits = true});
  std::map<std::string, Tensor> inputs{{"input_ids", int64_tensor({1, length}, {prompt.begin(), prompt.end()})},
                                       {"position_ids", int64_tensor({1, length}, iota(0, length))},
                                       {"cache_position", int64_tensor({length}, iota(0, length))},
                                       {"attention_mask", causal_chunk_mask(0, length, kContext)}};
  for (int64_t i = 0; i < chunked.cache_count(); ++i)
    inputs["kv_" + std::to_string(i)] = Tensor(DType::Float32, {1, 2, kContext, 16});
  const NamedTensors expected = ReferenceExecutor(full, tiny().weights().bind(full).tensors).run(inputs);

  expect_close(row_tensor(logits), logits_row(expected[0].second, length - 1), 1e-4, "last logits");
  for (int64_t i = 0; i < chunked.cache_count(); ++i)
    expect_close(chunked.cache(i), expected[1 + static_cast<size_t>(i)].second, 1e-5, "cache " + std::to_string(i));
  // The full prefill on the reference path is Hugging Face's prefill.
  const Tensor hf = SafetensorsFile::open(kTiny + "/reference.safetensors").get("logits");
  expect_close(expected[0].second, hf, 1e-4, "reference-path logits");
}

TEST(Generate, RewindReplaysTheSameLogits) {
  Session session(tiny(), native_options(4));
  const std::vector<int32_t>& prompt = greedy_reference().prompt;
  const std::vector<float> first = session.feed(prompt);
  session.feed(std::vector<int32_t>{1, 2, 3});
  session.rewind(10);
  EXPECT_EQ(session.position(), 10);
  const std::vector<float> again = session.feed(std::span(prompt).subspan(10));
  expect_close(row_tensor(again), row_tensor(first), 1e-6, "after rewind");
  EXPECT_THROW(session.rewind(17), Error);
}

// ---- sampling ----

std::vector<int32_t> sampled(Session& session, uint64_t seed) {
  session.rewind(0);
  Sampler sampler({.temperature = 1.5, .top_k = 50, .top_p = 0.95, .seed = seed});
  std::vector<int32_t> history = greedy_reference().prompt;
  std::vector<float> logits = session.feed(history);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) {
    tokens.push_back(sampler.sample(logits, history));
    history.push_back(tokens.back());
    logits = session.feed(std::span<const int32_t>(&tokens.back(), 1));
  }
  return tokens;
}

TEST(Generate, SameSeedSameTokens) {
  Session session(tiny(), native_options());
  const std::vector<int32_t> a = sampled(session, 7);
  EXPECT_EQ(sampled(session, 7), a);
  EXPECT_NE(sampled(session, 8), a);
}

// ---- limits and bad model directories ----

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

void expect_error(const std::function<void()>& action, const std::vector<std::string>& parts) {
  const std::string message = error_of(action);
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

TEST(Generate, PromptsLongerThanTheContextAreAClearError) {
  Session session(tiny(), {.context = 8, .dtype = DType::Float32});
  expect_error([&] { session.feed(greedy_reference().prompt); }, {"16 more tokens do not fit", "8 context", "--ctx"});
  EXPECT_EQ(session.position(), 0);
  expect_error([&] { Session(tiny(), {.context = 1000}); }, {"max_position_embeddings (256"});
  expect_error([&] { Session(tiny(), {.context = 100, .prefill_ir = "", .decode_ir = kTiny + "/decode_ir.json"}); },
               {"holds 64 positions"});
  expect_error([&] { session.feed(std::vector<int32_t>{512}); }, {"token id 512 is outside the vocabulary"});
}

void write_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(kTiny + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  edit(config);
  std::ofstream(dir + "/config.json") << config.dump(1);
}

TEST(ModelDirectory, MissingFilesAreNamed) {
  expect_error([] { ModelDir::open(test::work_dir("generate") + "/does_not_exist"); }, {"no such model directory"});
  const std::string no_config = make_model_dir("no_config", true, false);
  expect_error([&] { ModelDir::open(no_config); }, {no_config, "no config.json"});
  const std::string no_weights = make_model_dir("no_weights", false, true);
  expect_error([&] { ModelDir::open(no_weights); }, {no_weights, "neither model.safetensors nor"});
  const std::string missing_shard = make_model_dir("missing_shard", false, true);
  std::ofstream(missing_shard + "/model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})";
  expect_error([&] { ModelDir::open(missing_shard); }, {"shard 'model-00002-of-00002.safetensors'", "missing"});
}

TEST(ModelDirectory, ShardsListedByTheIndexWork) {
  const std::string dir = make_model_dir("sharded", false, true);
  const SafetensorsFile whole = SafetensorsFile::open(kTiny + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> first, second;
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& name : whole.names()) {
    const bool early = name.find("layers.1.") == std::string::npos;
    (early ? first : second).emplace_back(name, whole.get(name));
    map[name] = early ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  const ModelDir model = ModelDir::open(dir);
  EXPECT_EQ(model.weight_files().size(), 2u);
  Session session(model, native_options());
  EXPECT_EQ(greedy_tokens(session, greedy_reference().prompt, 8), greedy_reference().continuation);
}

TEST(ModelDirectory, WrongShapesMissingTensorsAndUnknownArchitecturesAreClearErrors) {
  const std::string shapes = make_model_dir("wrong_shapes");
  write_config(shapes, [](nlohmann::json& c) { c["intermediate_size"] = 100; });
  expect_error([&] { Session(ModelDir::open(shapes), native_options()); },
               {"mlp.gate_proj.weight", "[176, 64]", "[100, 64]"});

  const std::string unknown = make_model_dir("unknown_architecture");
  write_config(unknown, [](nlohmann::json& c) { c["architectures"] = {"GPT2LMHeadModel"}; });
  expect_error([&] { Session(ModelDir::open(unknown), native_options()); },
               {"unknown architecture GPT2LMHeadModel", "Qwen2ForCausalLM"});
  write_config(unknown, [](nlohmann::json& c) { c["model_type"] = "gpt_neox"; });
  expect_error([&] { Session(ModelDir::open(unknown), native_options()); }, {"unknown model_type 'gpt_neox'"});

  const std::string missing = make_model_dir("missing_tensor", false, true);
  const SafetensorsFile whole = SafetensorsFile::open(kTiny + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : whole.names())
    if (name != "model.layers.1.mlp.up_proj.weight") tensors.emplace_back(name, whole.get(name));
  write_safetensors(missing + "/model.safetensors", tensors);
  expect_error([&] { Session(ModelDir::open(missing), native_options()); },
               {"model.layers.1.mlp.up_proj.weight", "not found"});
}

// ---- the command ----

std::string join_ids(const std::vector<int32_t>& ids, const char* separator) {
  std::string text;
  for (int32_t id : ids) text += (text.empty() ? "" : separator) + std::to_string(id);
  return text;
}

// stdout of the command; stderr goes to `stderr_text`.
test::CommandResult run_generate(const std::string& options, std::string& stderr_text) {
  const std::string err = test::work_dir("generate") + "/stderr.txt";
  const test::CommandResult result = test::run_command("{ " + test::cli() + " generate --model " + tiny().path() + " " +
                                                       options + " 2>" + err + "; }");
  std::ifstream in(err);
  stderr_text.assign(std::istreambuf_iterator<char>(in), {});
  return result;
}

TEST(GenerateCommand, StreamsGreedyIdsAndReportsSpeedAndMemory) {
  const std::string expected = join_ids(greedy_reference().continuation, " ") + "\n";
  for (const std::string graphs :
       {std::string(), " --prefill-ir " + kTiny + "/prefill_ir.json --decode-ir " + kTiny + "/decode_ir.json"}) {
    std::string err;
    const test::CommandResult result =
        run_generate("--prompt-ids " + join_ids(greedy_reference().prompt, ",") + " --ids -n 8 --greedy" + graphs, err);
    EXPECT_EQ(result.exit_code, 0) << result.output << err;
    EXPECT_EQ(result.output, expected) << err;
    for (const char* part : {"prompt:", "tokens/s", "time to first token", "peak memory", "16 tokens"})
      EXPECT_NE(err.find(part), std::string::npos) << err;
  }
}

TEST(GenerateCommand, SeedsAndErrors) {
  const std::string prompt = "--prompt-ids " + join_ids(greedy_reference().prompt, ",") + " --ids -n 6 ";
  std::string err;
  const std::string a = run_generate(prompt + "--temperature 1.2 --seed 5", err).output;
  EXPECT_EQ(run_generate(prompt + "--temperature 1.2 --seed 5", err).output, a);
  EXPECT_EQ(std::count(a.begin(), a.end(), ' '), 5) << a;

  test::CommandResult result = run_generate(prompt + "--ctx 8", err);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(err.find("the prompt has 16 tokens but the context holds 8"), std::string::npos) << err;
  result = run_generate("--prompt hello", err);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(err.find("--prompt-ids"), std::string::npos) << err;
  result = run_generate(prompt + "--top-p 2", err);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(err.find("top-p must be in (0, 1]"), std::string::npos) << err;
  result = run_generate("--prompt-ids 1,x,3 --ids", err);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(err.find("'x' is not a token id"), std::string::npos) << err;
}

// ---- text: a byte-level tokenizer over the tiny model's ids, with the ChatML specials and Qwen2.5's template ----

// GPT-2's byte-level spelling of one byte (printable Latin-1 stands for itself, the rest for U+0100 + rank).
std::string byte_spelling(int byte) {
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  char32_t code = static_cast<char32_t>(byte);
  if (!printable(byte)) {
    int rank = 0;
    for (int b = 0; b < byte; ++b) rank += printable(b) ? 0 : 1;
    code = 0x100 + static_cast<char32_t>(rank);
  }
  std::string out;
  append_utf8(out, code);
  return out;
}

const ModelDir& tiny_with_text() {
  static const ModelDir model = [] {
    const std::string dir = make_model_dir("qwen_tiny_text");
    nlohmann::json vocab = nlohmann::json::object();
    for (int byte = 0; byte < 256; ++byte) vocab[byte_spelling(byte)] = byte;
    nlohmann::json added = nlohmann::json::array();
    const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; ++i)
      added.push_back({{"id", 300 + i},
                       {"content", specials[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}};
    const nlohmann::json tokenizer = {
        {"version", "1.0"},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}}},
        {"post_processor", byte_level},
        {"decoder", byte_level},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", vocab},
          {"merges", nlohmann::json::array()}}}};
    std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
    std::ifstream jinja(test::kData + "/tokenizer/templates/qwen2_5.jinja");
    const std::string chat_template(std::istreambuf_iterator<char>(jinja), {});
    std::ofstream(dir + "/tokenizer_config.json") << nlohmann::json{
        {"chat_template", chat_template},
        {"eos_token", "<|im_end|>"},
        {"pad_token", "<|endoftext|>"},
        {"bos_token", nullptr}}.dump();
    return ModelDir::open(dir);
  }();
  return model;
}

// The greedy text the command should print: tokens up to the end-of-sequence token, special ones left out.
std::string greedy_text(const std::vector<int32_t>& prompt, size_t count) {
  const Tokenizer tokenizer = Tokenizer::load(tiny_with_text().path());
  Session session(tiny_with_text(), {.context = 256, .dtype = DType::Float32});
  std::vector<int32_t> tokens;
  std::vector<float> logits = session.feed(prompt);
  for (size_t i = 0; i < count; ++i) {
    const int32_t token = argmax(logits);
    if (token == *tokenizer.eos_token_id()) break;
    tokens.push_back(token);
    logits = session.feed(std::span<const int32_t>(&token, 1));
  }
  return tokenizer.decode(tokens, true);
}

test::CommandResult run_text(const std::string& command, const std::string& options, std::string& stderr_text) {
  const std::string err = test::work_dir("generate") + "/stderr_text.txt";
  const test::CommandResult result = test::run_command("{ " + test::cli() + " " + command + " --model " +
                                                       tiny_with_text().path() + " " + options + " 2>" + err + "; }");
  std::ifstream in(err);
  stderr_text.assign(std::istreambuf_iterator<char>(in), {});
  return result;
}

int64_t prompt_tokens_reported(const std::string& stderr_text) {
  const size_t at = stderr_text.find("prompt:");
  return at == std::string::npos ? -1 : std::stoll(stderr_text.substr(at + 7));
}

TEST(GenerateCommand, TextPromptsStreamDecodedTextAndStopStringsCutIt) {
  const Tokenizer tokenizer = Tokenizer::load(tiny_with_text().path());
  const std::string prompt = "Hello, tiny model!";
  const std::string expected = greedy_text(tokenizer.encode(prompt, true), 24);
  ASSERT_FALSE(expected.empty());
  std::string err;
  test::CommandResult result = run_text("generate", "--prompt '" + prompt + "' -n 24 --greedy", err);
  EXPECT_EQ(result.exit_code, 0) << err;
  EXPECT_EQ(result.output, expected + "\n") << err;
  EXPECT_EQ(prompt_tokens_reported(err), static_cast<int64_t>(prompt.size())) << err;  // one token per byte

  // A stop string: the first whole character from the middle of the text; the output ends before it.
  size_t middle = expected.size() / 2;
  while (middle > 0 && (static_cast<unsigned char>(expected[middle]) & 0xC0) == 0x80) --middle;
  char32_t code = 0;
  const size_t length = std::max<size_t>(1, decode_utf8(expected, middle, code));
  const std::string stop = expected.substr(middle, length);
  const std::string quoted = stop == "'" ? "\"'\"" : "'" + stop + "'";
  result = run_text("generate", "--prompt '" + prompt + "' -n 24 --greedy --stop " + quoted, err);
  EXPECT_EQ(result.exit_code, 0) << err;
  EXPECT_EQ(result.output, expected.substr(0, expected.find(stop)) + "\n") << err;
}

TEST(GenerateCommand, ChatTemplatesAndTheChatKeepTheirCache) {
  const Tokenizer tokenizer = Tokenizer::load(tiny_with_text().path());
  const ChatTemplate chat = ChatTemplate::load(tiny_with_text().path());
  const auto rendered = [&](const std::vector<ChatMessage>& messages) {
    return tokenizer.encode(apply_chat_template(chat, messages, true), false);
  };
  const std::vector<int32_t> first = rendered({{"user", "hi"}});
  std::string err;
  test::CommandResult result = run_text("generate", "--chat --prompt hi -n 4 --greedy", err);
  EXPECT_EQ(result.exit_code, 0) << err;
  EXPECT_EQ(result.output, greedy_text(first, 4) + "\n");
  EXPECT_EQ(prompt_tokens_reported(err), static_cast<int64_t>(first.size())) << err;

  // Two turns: the second feeds only what follows the conversation already in the cache.
  result = run_text("chat", "-n 4 --greedy < /dev/null", err);
  EXPECT_EQ(result.exit_code, 0) << err;
  const std::string input = test::work_dir("generate") + "/chat_input.txt";
  std::ofstream(input) << "hi\nwho are you?\n";
  result = run_text("chat", "-n 4 --greedy < " + input, err);
  EXPECT_EQ(result.exit_code, 0) << err;
  const std::string reply = greedy_text(first, 4);
  EXPECT_EQ(result.output.substr(0, reply.size() + 1), reply + "\n") << result.output;
  const std::vector<int32_t> second = rendered({{"user", "hi"}, {"assistant", reply}, {"user", "who are you?"}});
  const int64_t fed = prompt_tokens_reported(err);
  EXPECT_GT(fed, static_cast<int64_t>(second.size() - first.size())) << err;
  EXPECT_LT(fed, static_cast<int64_t>(first.size() + second.size())) << err;
}

}  // namespace
}  // namespace npusim
