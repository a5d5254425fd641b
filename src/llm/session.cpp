#include "llm/session.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "compiler/compile.h"
#include "core/mapped_file.h"
#include "ir/torch_ir_reader.h"
#include "llm/native_builder.h"
#include "runtime/backend.h"
#include "runtime/reference_executor.h"

namespace npusim {

namespace {

constexpr int64_t kDefaultContext = 4096;

Tensor int64_tensor(Shape shape, const std::vector<int64_t>& values) {
  Tensor tensor(DType::Int64, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.mutable_data<int64_t>());
  return tensor;
}

std::vector<int64_t> consecutive(int64_t start, int64_t count) {
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = start + i;
  return values;
}

// Row `row` of logits [1, rows, V] as floats.
std::vector<float> logits_row(const Tensor& logits, int64_t row) {
  const Tensor values = logits.to(DType::Float32);
  const int64_t vocab = values.shape().back();
  const float* begin = values.data<float>() + row * vocab;
  return {begin, begin + vocab};
}

DType default_dtype(const ModelDir& model) {
  const DType stored = model.weight_dtype();
  return stored == DType::BFloat16 || stored == DType::Float16 ? stored : DType::Float32;
}

// Binds weights for several programs of one session so that they share memory: a tensor that must be converted
// to the storage dtype is converted once. Mapped tensors already in that dtype are used as they are, or copied
// once into memory of the process when `resident` (the CPU backend: decoding reads every weight per token, and
// reads them faster from there than through the file mapping). A mapped tensor copied or converted gives its pages
// back.
class SharedWeights {
 public:
  SharedWeights(const WeightStore& store, DType storage, bool resident)
      : store_(store), storage_(storage), resident_(resident) {}

  std::vector<std::pair<ValueId, Tensor>> bind(const Graph& graph) {
    std::vector<std::pair<ValueId, Tensor>> tensors = store_.bind(graph).tensors;
    for (auto& [id, tensor] : tensors) {
      const Value& value = graph.value(id);
      const bool constant = graph.constants.count(value.weight_key) || graph.constants.count(value.name);
      if (constant || value.transform || !is_floating(tensor.dtype())) continue;
      const bool convert = tensor.dtype() != storage_, copy = resident_ && tensor.borrowed();
      if (!convert && !copy) continue;
      auto [it, inserted] = converted_.try_emplace(tensor.bytes());
      if (inserted) {
        it->second = convert ? tensor.to(storage_, TensorMemory::Streamed) : tensor.clone(TensorMemory::Streamed);
        MappedFile::release_pages(tensor.bytes(), tensor.nbytes());  // every program binds the copy
      }
      tensor = it->second;
    }
    return tensors;
  }

 private:
  const WeightStore& store_;
  DType storage_;
  bool resident_;
  std::map<const std::byte*, Tensor> converted_;
};

std::unique_ptr<Backend> make_session_backend(const SessionOptions& options, DType dtype) {
  return make_backend(options.backend, BackendOptions{.threads = options.threads,
                                                      .weights = options.quantize,
                                                      .quantization_group = options.quantization_group,
                                                      .pack_cache = {},
                                                      .compact_bf16 = compact_weights(options, dtype)});
}

// The CPU backend reads float weights in place; int8 quantization, compact weights and other backends make their
// own copies.
bool resident_weights(const SessionOptions& options, DType dtype) {
  return options.backend == "cpu" && options.quantize == WeightQuantization::None && !compact_weights(options, dtype);
}

// ", int8 weights" and the like, for describe().
std::string quantization_note(const SessionOptions& options, DType dtype) {
  if (compact_weights(options, dtype)) return ", bf16 linear weights in 12 bits (lossless)";
  if (options.quantize != WeightQuantization::Int8) return "";
  return options.quantization_group > 0
             ? ", int8 linear weights in groups of " + std::to_string(options.quantization_group)
             : ", int8 linear weights";
}

}  // namespace

bool compact_weights(const SessionOptions& options, DType dtype) {
  return options.backend == "cpu" && options.compact_bf16 && options.quantize == WeightQuantization::None &&
         dtype == DType::BFloat16;
}

class Session::Engine {
 public:
  virtual ~Engine() = default;
  // Runs `tokens` at cache positions start.. and returns the logits after the last one.
  virtual std::vector<float> forward(std::span<const int32_t> tokens, int64_t start) = 0;
  virtual void prepare(int64_t) {}
  virtual Tensor cache(int64_t index) const = 0;
  virtual int64_t cache_count() const = 0;
  virtual int64_t context() const = 0;
  virtual int64_t vocab() const = 0;
  virtual DType dtype() const = 0;
  virtual std::string describe() const = 0;
  void set_profiling(bool on) {
    profiling_ = on;
    for (PreparedProgram* program : programs()) program->set_profiling(on);
  }
  std::vector<KernelTiming> last_timings() const {
    return last_run_ ? last_run_->last_timings() : std::vector<KernelTiming>{};
  }

 protected:
  virtual std::vector<PreparedProgram*> programs() const = 0;
  // Runs a program, with the profiling asked for, and remembers it for last_timings().
  NamedTensors run_program(PreparedProgram& program, const std::map<std::string, Tensor>& inputs) {
    program.set_profiling(profiling_);
    last_run_ = &program;
    return program.run(inputs);
  }

 private:
  bool profiling_ = false;
  const PreparedProgram* last_run_ = nullptr;
};

namespace {

// ---- the native builder's graphs ----

class NativeEngine final : public Session::Engine {
 public:
  NativeEngine(const ModelDir& model, const SessionOptions& options, DType dtype)
      : config_(model.config()),
        dtype_(dtype),
        chunk_(options.prefill_chunk),
        backend_(make_session_backend(options, dtype)),
        weights_(model.weights(), dtype, resident_weights(options, dtype)),
        note_(quantization_note(options, dtype)) {
    check_native_support(config_);
    const int64_t limit = config_.max_position_embeddings;
    if (options.context > 0 && limit > 0 && options.context > limit)
      fail("a context of " + std::to_string(options.context) + " positions exceeds the model's " +
           "max_position_embeddings (" + std::to_string(limit) + ", " + config_.source + ")");
    context_ = options.context > 0 ? options.context : limit > 0 ? std::min(kDefaultContext, limit) : kDefaultContext;
    if (chunk_ < 1) fail("the prefill chunk must be at least 1 token, got " + std::to_string(chunk_));
    chunk_ = std::min(chunk_, context_);
    program(1);  // the decode step; also checks every weight now
  }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t start) override {
    std::vector<float> logits;
    for (size_t done = 0; done < tokens.size();) {
      const int64_t size = step_size(static_cast<int64_t>(tokens.size() - done));
      logits = run_step(tokens.subspan(done, static_cast<size_t>(size)), start + static_cast<int64_t>(done));
      done += static_cast<size_t>(size);
    }
    return logits;
  }

  void prepare(int64_t tokens) override {
    for (int64_t done = 0; done < tokens;) {
      const int64_t size = step_size(tokens - done);
      program(size);
      done += size;
    }
  }

  Tensor cache(int64_t index) const override { return programs_.at(1)->read_state("kv_" + std::to_string(index)); }
  std::vector<PreparedProgram*> programs() const override {
    std::vector<PreparedProgram*> all;
    for (const auto& [tokens, program] : programs_) all.push_back(program.get());
    return all;
  }
  int64_t cache_count() const override { return 2 * config_.num_hidden_layers; }
  int64_t context() const override { return context_; }
  int64_t vocab() const override { return config_.vocab_size; }
  DType dtype() const override { return dtype_; }
  std::string describe() const override {
    return "native " + config_.model_type + " graph, " + std::string(dtype_name(dtype_)) + ", context " +
           std::to_string(context_) + ", prefill chunks up to " + std::to_string(chunk_) + " tokens" + note_;
  }

 private:
  // The whole chunk when that many tokens remain, else the largest power of two that fits: no padding.
  int64_t step_size(int64_t remaining) const {
    if (remaining >= chunk_) return chunk_;
    int64_t size = 1;
    while (size * 2 <= remaining) size *= 2;
    return size;
  }

  PreparedProgram& program(int64_t tokens) {
    auto it = programs_.find(tokens);
    if (it != programs_.end()) return *it->second;
    const Graph graph = build_native_graph(config_, {.tokens = tokens, .context = context_});
    compiler::CompileOptions options;
    options.compute_dtype = dtype_;
    const Program compiled = compiler::compile_graph(graph, options);
    const PreparedProgram* owner = programs_.empty() ? nullptr : programs_.begin()->second.get();
    std::unique_ptr<PreparedProgram> prepared =
        backend_->prepare_with_state(compiled, weights_.bind(compiled.graph), native_cache_pairs(config_), owner);
    return *programs_.emplace(tokens, std::move(prepared)).first->second;
  }

  std::vector<float> run_step(std::span<const int32_t> tokens, int64_t start) {
    const auto count = static_cast<int64_t>(tokens.size());
    std::map<std::string, Tensor> inputs;
    inputs["input_ids"] = int64_tensor({1, count}, {tokens.begin(), tokens.end()});
    inputs["position_ids"] = int64_tensor({1, count}, consecutive(start, count));
    inputs["cache_position"] = int64_tensor({count}, consecutive(start, count));
    if (count > 1) inputs["attention_mask"] = causal_chunk_mask(start, count, context_);
    const NamedTensors outputs = run_program(program(count), inputs);
    return logits_row(outputs.at(0).second, 0);
  }

  ModelConfig config_;
  DType dtype_;
  int64_t context_ = 0;
  int64_t chunk_ = 0;
  std::unique_ptr<Backend> backend_;
  SharedWeights weights_;
  std::string note_;
  std::map<int64_t, std::unique_ptr<PreparedProgram>> programs_;  // by tokens per step
};

// ---- exported torch_ir graphs ----

constexpr const char* kStepInputs[] = {"input_ids", "attention_mask", "position_ids", "cache_position"};

void expect_shape(const Value& value, const Shape& expected, const std::string& file) {
  if (value.meta.shape != expected)
    fail(file + ": input '" + value.name + "' has shape " + shape_string(value.meta.shape) + ", expected " +
         shape_string(expected));
}

// The first four inputs must be the step inputs, in order, with `tokens` positions.
void check_step_inputs(const Graph& graph, const std::string& file, size_t caches) {
  if (graph.inputs.size() != 4 + caches)
    fail(file + ": expected the inputs input_ids, attention_mask, position_ids, cache_position" +
         (caches ? ", kv_0..kv_" + std::to_string(caches - 1) : std::string()) + ", got " +
         std::to_string(graph.inputs.size()) + " inputs");
  for (size_t i = 0; i < 4; ++i)
    if (graph.value(graph.inputs[i]).name != kStepInputs[i])
      fail(file + ": input " + std::to_string(i) + " is '" + graph.value(graph.inputs[i]).name + "', expected '" +
           kStepInputs[i] + "'");
}

class ExportedEngine final : public Session::Engine {
 public:
  ExportedEngine(const ModelDir& model, const SessionOptions& options, DType dtype)
      : dtype_(dtype),
        backend_(make_session_backend(options, dtype)),
        weights_(model.weights(), dtype, resident_weights(options, dtype)),
        note_(quantization_note(options, dtype)) {
    if (options.decode_ir.empty()) fail("--prefill-ir needs --decode-ir (the decode step that uses the cache)");
    prepare_decode(options.decode_ir);
    if (options.context > context_)
      fail(options.decode_ir + ": its static cache holds " + std::to_string(context_) + " positions; --ctx " +
           std::to_string(options.context) + " does not fit");
    if (options.context > 0) context_ = options.context;
    if (!options.prefill_ir.empty()) prepare_prefill(options.prefill_ir);
  }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t start) override {
    std::vector<float> logits;
    size_t done = 0;
    if (start == 0 && prefill_ && tokens.size() > 1) {
      done = std::min(tokens.size(), static_cast<size_t>(prefill_length_));
      logits = run_prefill(tokens.first(done));
    }
    for (; done < tokens.size(); ++done) logits = run_decode(tokens[done], start + static_cast<int64_t>(done));
    return logits;
  }

  Tensor cache(int64_t index) const override {
    return decode_->read_state(cache_pairs_.at(static_cast<size_t>(index)).first);
  }
  std::vector<PreparedProgram*> programs() const override {
    std::vector<PreparedProgram*> all{decode_.get()};
    if (prefill_) all.push_back(prefill_.get());
    return all;
  }
  int64_t cache_count() const override { return static_cast<int64_t>(cache_pairs_.size()); }
  int64_t context() const override { return context_; }
  int64_t vocab() const override { return vocab_; }
  DType dtype() const override { return dtype_; }
  std::string describe() const override {
    return "exported graphs (" + (prefill_ ? "prefill of " + std::to_string(prefill_length_) + " tokens, " : "") +
           "decode against a cache of " + std::to_string(cache_shape_[2]) + "), " + std::string(dtype_name(dtype_)) +
           ", context " + std::to_string(context_) + note_;
  }

 private:
  Program compile(const std::string& file) const {
    Graph graph = read_torch_ir(file);
    check_supported(graph);
    compiler::CompileOptions options;
    options.compute_dtype = dtype_;
    return compiler::compile_graph(std::move(graph), options);
  }

  void prepare_decode(const std::string& file) {
    const Program compiled = compile(file);
    const Graph& graph = compiled.graph;
    if (graph.inputs.size() < 6 || graph.outputs.size() != graph.inputs.size() - 3)
      fail(file +
           ": a decode graph takes input_ids, attention_mask, position_ids, cache_position and the caches "
           "kv_0..kv_{2L-1}, and returns the logits then the updated caches");
    const size_t caches = graph.inputs.size() - 4;
    check_step_inputs(graph, file, caches);
    cache_shape_ = graph.value(graph.inputs[4]).meta.shape;
    if (cache_shape_.size() != 4 || cache_shape_[0] != 1)
      fail(file + ": cache 'kv_0' has shape " + shape_string(cache_shape_) + ", expected [1, heads, positions, dim]");
    context_ = cache_shape_[2];
    expect_shape(graph.value(graph.inputs[0]), {1, 1}, file);
    expect_shape(graph.value(graph.inputs[1]), {1, 1, 1, context_}, file);
    expect_shape(graph.value(graph.inputs[2]), {1, 1}, file);
    expect_shape(graph.value(graph.inputs[3]), {1}, file);
    for (size_t i = 0; i < caches; ++i) {
      const Value& input = graph.value(graph.inputs[4 + i]);
      expect_shape(input, cache_shape_, file);
      cache_pairs_.emplace_back(input.name, graph.value(graph.outputs[1 + i]).name);
    }
    const Shape& logits = graph.value(graph.outputs[0]).meta.shape;
    if (logits.size() != 3 || logits[1] != 1)
      fail(file + ": the first output (logits) has shape " + shape_string(logits) + ", expected [1, 1, vocab]");
    vocab_ = logits[2];
    decode_ = backend_->prepare_with_state(compiled, weights_.bind(compiled.graph), cache_pairs_);
  }

  void prepare_prefill(const std::string& file) {
    const Program compiled = compile(file);
    const Graph& graph = compiled.graph;
    check_step_inputs(graph, file, 0);
    prefill_length_ = graph.value(graph.inputs[0]).meta.shape.back();
    for (size_t i = 0; i < 4; ++i)
      expect_shape(graph.value(graph.inputs[i]), i == 3 ? Shape{prefill_length_} : Shape{1, prefill_length_}, file);
    if (graph.outputs.size() != 1 + cache_pairs_.size())
      fail(file + ": expected the logits and " + std::to_string(cache_pairs_.size()) +
           " key/value outputs (as many as the decode graph's caches), got " + std::to_string(graph.outputs.size()) +
           " outputs");
    Shape rows = cache_shape_;
    rows[2] = prefill_length_;
    for (size_t i = 1; i < graph.outputs.size(); ++i)
      if (graph.value(graph.outputs[i]).meta.shape != rows)
        fail(file + ": output " + std::to_string(i) + " ('" + graph.value(graph.outputs[i]).name + "') has shape " +
             shape_string(graph.value(graph.outputs[i]).meta.shape) + ", expected " + shape_string(rows));
    if (prefill_length_ > cache_shape_[2])
      fail(file + ": its " + std::to_string(prefill_length_) + " tokens do not fit the decode cache of " +
           std::to_string(cache_shape_[2]));
    prefill_ = backend_->prepare(compiled, weights_.bind(compiled.graph));
  }

  // The first tokens, right-padded to the prefill length; the keys and values of the real ones become the decode
  // graph's cache.
  std::vector<float> run_prefill(std::span<const int32_t> tokens) {
    const auto count = static_cast<int64_t>(tokens.size());
    std::vector<int64_t> ids(static_cast<size_t>(prefill_length_), 0), mask(static_cast<size_t>(prefill_length_), 0);
    for (int64_t i = 0; i < count; ++i) {
      ids[static_cast<size_t>(i)] = tokens[static_cast<size_t>(i)];
      mask[static_cast<size_t>(i)] = 1;
    }
    const std::vector<int64_t> positions = consecutive(0, prefill_length_);
    const NamedTensors outputs =
        run_program(*prefill_, {{"input_ids", int64_tensor({1, prefill_length_}, ids)},
                                {"attention_mask", int64_tensor({1, prefill_length_}, mask)},
                                {"position_ids", int64_tensor({1, prefill_length_}, positions)},
                                {"cache_position", int64_tensor({prefill_length_}, positions)}});
    for (size_t i = 0; i < cache_pairs_.size(); ++i)
      decode_->write_state(cache_pairs_[i].first, rows_into_cache(outputs.at(1 + i).second, count));
    return logits_row(outputs.at(0).second, count - 1);
  }

  // The first `count` positions of keys or values [1, H, T, D] placed in a zeroed cache [1, H, C, D].
  Tensor rows_into_cache(const Tensor& rows, int64_t count) const {
    const Tensor source = rows.to(DType::Float32);
    Tensor cache(DType::Float32, cache_shape_);
    const int64_t heads = cache_shape_[1], positions = cache_shape_[2], dim = cache_shape_[3];
    const int64_t source_positions = source.shape()[2];
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(cache.mutable_data<float>() + h * positions * dim, source.data<float>() + h * source_positions * dim,
                  static_cast<size_t>(count * dim) * sizeof(float));
    return cache;
  }

  std::vector<float> run_decode(int32_t token, int64_t position) {
    Tensor mask(DType::Float32, {1, 1, 1, cache_shape_[2]});
    for (int64_t j = position + 1; j < cache_shape_[2]; ++j)
      mask.mutable_data<float>()[j] = -std::numeric_limits<float>::infinity();
    const std::map<std::string, Tensor> inputs{{"input_ids", int64_tensor({1, 1}, {token})},
                                               {"attention_mask", mask},
                                               {"position_ids", int64_tensor({1, 1}, {position})},
                                               {"cache_position", int64_tensor({1}, {position})}};
    const NamedTensors outputs = run_program(*decode_, inputs);
    return logits_row(outputs.at(0).second, 0);
  }

  DType dtype_;
  std::unique_ptr<Backend> backend_;
  SharedWeights weights_;
  std::string note_;
  std::unique_ptr<PreparedProgram> decode_, prefill_;
  std::vector<std::pair<std::string, std::string>> cache_pairs_;  // decode input -> output
  Shape cache_shape_;
  int64_t context_ = 0;
  int64_t prefill_length_ = 0;
  int64_t vocab_ = 0;
};

}  // namespace

Session::Session(const ModelDir& model, const SessionOptions& options) {
  const DType dtype = options.dtype.value_or(default_dtype(model));
  if (dtype != DType::Float32 && dtype != DType::BFloat16 && dtype != DType::Float16)
    fail("the session dtype must be float32, bfloat16 or float16, got " + std::string(dtype_name(dtype)));
  if (options.context < 0) fail("the context must be positive, got " + std::to_string(options.context));
  if (options.quantization_group < 0 || options.quantization_group % 8 != 0)
    fail("the int8 quantization group must be a multiple of 8 (0: one scale per output channel), got " +
         std::to_string(options.quantization_group));
  if (!options.prefill_ir.empty() || !options.decode_ir.empty())
    engine_ = std::make_unique<ExportedEngine>(model, options, dtype);
  else
    engine_ = std::make_unique<NativeEngine>(model, options, dtype);
}

Session::~Session() = default;

int64_t Session::context() const { return engine_->context(); }
int64_t Session::vocab_size() const { return engine_->vocab(); }
DType Session::dtype() const { return engine_->dtype(); }
std::string Session::describe() const { return engine_->describe(); }
Tensor Session::cache(int64_t index) const {
  if (index < 0 || index >= cache_count())
    fail("cache " + std::to_string(index) + " does not exist (the session keeps " + std::to_string(cache_count()) +
         ")");
  return engine_->cache(index);
}
int64_t Session::cache_count() const { return engine_->cache_count(); }
void Session::set_profiling(bool on) { engine_->set_profiling(on); }
std::vector<KernelTiming> Session::last_timings() const { return engine_->last_timings(); }

std::vector<float> Session::feed(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to feed: no tokens");
  const auto count = static_cast<int64_t>(tokens.size());
  if (position_ + count > context())
    fail(std::to_string(count) + " more tokens do not fit: " + std::to_string(position_) + " of the " +
         std::to_string(context()) + " context positions are used (raise --ctx or shorten the prompt)");
  for (int32_t token : tokens)
    if (token < 0 || token >= vocab_size())
      fail("token id " + std::to_string(token) + " is outside the vocabulary (0.." + std::to_string(vocab_size() - 1) +
           ")");
  std::vector<float> logits = engine_->forward(tokens, position_);
  position_ += count;
  return logits;
}

void Session::prepare(int64_t tokens) { engine_->prepare(std::min(tokens, context())); }

void Session::rewind(int64_t position) {
  if (position < 0 || position > position_)
    fail("cannot rewind to position " + std::to_string(position) + ": the context holds " + std::to_string(position_) +
         " tokens");
  position_ = position;
}

}  // namespace npusim
