#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>

#include "backends/cpu/kernels.h"
#include "backends/cpu/pack_cache.h"
#include "backends/cpu/packed_gemm.h"
#include "compiler/graph_edit.h"
#include "npusim/op_registry.h"
#include "runtime/state_pairs.h"
#include "runtime/weight_transforms.h"

namespace npusim::cpu {

namespace {

using compiler::Placement;

DType storage_dtype(Elem elem) {
  switch (elem) {
    case Elem::F32:
      return DType::Float32;
    case Elem::F16:
      return DType::Float16;
    case Elem::BF16:
      return DType::BFloat16;
    case Elem::I64:
      return DType::Int64;
    case Elem::Bool:
      return DType::Bool;
  }
  return DType::Float32;
}

// A weight in its storage form; a tensor already stored that way is shared, not copied.
Tensor to_storage_tensor(const Tensor& tensor, Elem elem) {
  const DType target = storage_dtype(elem);
  if (tensor.dtype() == target) return tensor;
  Tensor out(target, tensor.shape());
  tensor_to_storage(tensor, out.mutable_bytes(), elem);
  return out;
}

std::string node_label(const Node& node) { return node.name + " (" + node.op + ")"; }

bool ranges_overlap(const Buffer& a, const Buffer& b) {
  if (a.bytes() == 0 || b.bytes() == 0) return false;
  return a.data < b.data + b.bytes() && b.data < a.data + a.bytes();
}

// The reference implementation on copies converted to the reference domain, results converted back.
Kernel fallback_kernel(const KernelContext& ctx) {
  struct State {
    const Node* node;
    std::vector<Buffer> inputs, outputs;
    std::vector<TensorMeta> output_metas;
  };
  auto state = std::make_shared<State>(State{&ctx.node, ctx.inputs, ctx.outputs, {}});
  for (const Buffer& out : ctx.outputs) state->output_metas.push_back(out.meta);
  Kernel kernel;
  kernel.run = [state] {
    std::vector<Tensor> inputs;
    inputs.reserve(state->inputs.size());
    for (const Buffer& in : state->inputs) inputs.push_back(storage_to_tensor(in.data, in.elem, in.meta.shape));
    const std::vector<Tensor> results = state->node->def->reference(state->node->attrs, inputs, state->output_metas);
    if (results.size() != state->outputs.size())
      fail("the reference produced " + std::to_string(results.size()) + " outputs, expected " +
           std::to_string(state->outputs.size()));
    for (size_t i = 0; i < results.size(); ++i) {
      const Buffer& out = state->outputs[i];
      if (results[i].shape() != out.meta.shape)
        fail("the reference output " + std::to_string(i) + " has shape " + shape_string(results[i].shape()) +
             ", expected " + shape_string(out.meta.shape));
      tensor_to_storage(results[i], out.data, out.elem);
    }
  };
  share_all_inputs(kernel, ctx);  // every input is copied before any output is written
  return kernel;
}

struct PreparedKernel {
  const Node* node;
  Kernel kernel;
  bool fallback = false;
};

class CpuPreparedProgram final : public PreparedProgram {
 public:
  CpuPreparedProgram(const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights,
                     const CpuOptions& options, const std::vector<std::pair<std::string, std::string>>& state = {},
                     const PreparedProgram* share_state_with = nullptr)
      : graph_(program.graph),
        plan_(program.plan),
        floats_(float_storage(program.compute_dtype)),
        pool_(options.threads),
        poison_(options.poison_memory),
        options_(options) {
    const auto start = std::chrono::steady_clock::now();
    check_supported(graph_);
    if (plan_.values.size() != graph_.values.size())
      fail(graph_.source + ": the memory plan covers " + std::to_string(plan_.values.size()) +
           " values, the graph has " + std::to_string(graph_.values.size()));
    elems_ = value_storage_elems(graph_, floats_);
    if (!options.pack_cache.empty()) open_pack_cache(program, weights);
    bind_weights(weights);
    state_.add(resolve_state(state, share_state_with));
    place_values();
    build_kernels();
    check_state_in_place();
    scratch_.allocate(pool_.size());
    prefault_run_memory();
    for (const PreparedKernel& k : kernels_) timings_.push_back({k.node->name, k.node->op, 0.0});
    count_prepare_cost(start);
  }

  NamedTensors run(const std::map<std::string, Tensor>& inputs) override {
    if (!state_.empty()) {
      if (poison_) poison();
      copy_inputs_keeping_state(inputs);
    } else {
      const std::vector<Tensor> ordered = check_inputs(graph_, inputs);
      if (poison_) poison();
      for (size_t i = 0; i < ordered.size(); ++i) {
        const Buffer in = buffer(graph_.inputs[i]);
        tensor_to_storage(ordered[i], in.data, in.elem);
      }
    }
    size_t current = 0;
    try {
      for (; current < kernels_.size(); ++current) {
        if (!profiling_) {
          kernels_[current].kernel.run();
          continue;
        }
        const auto start = std::chrono::steady_clock::now();
        kernels_[current].kernel.run();
        timings_[current].milliseconds =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      }
    } catch (const Error& error) {
      const Node& node = *kernels_[current].node;
      fail(graph_.source + ": node '" + node.name + "' (" + node.source_op + "): " + error.what());
    }
    NamedTensors outputs;
    for (ValueId id : graph_.outputs) {
      if (state_.of_output(id)) continue;
      const Buffer out = buffer(id);
      outputs.emplace_back(graph_.value(id).name, storage_to_tensor(out.data, out.elem, out.meta.shape));
    }
    return outputs;
  }

  // The memory a run writes, mapped now, in pieces over the pool: the first run then pays no page faults that later
  // runs do not.
  void prefault_run_memory() {
    static constexpr size_t kPiece = size_t{2} << 20;
    std::vector<std::pair<std::byte*, size_t>> pieces;
    const auto add = [&pieces](const AlignedBuffer& buffer) {
      if (buffer.size() < kPiece) return;  // a heap block, written when it was zeroed
      for (size_t at = 0; at < buffer.size(); at += kPiece)
        pieces.emplace_back(buffer.data() + at, std::min(kPiece, buffer.size() - at));
    };
    add(arena_);
    add(scratch_.buffer());
    for (const AlignedBuffer& buffer : owned_) add(buffer);
    pool_.parallel_for(static_cast<int64_t>(pieces.size()), 1, [&pieces](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i)
        prefault(pieces[static_cast<size_t>(i)].first, pieces[static_cast<size_t>(i)].second);
    });
  }

  void poison() {
    for (const AlignedBuffer* buffer : {static_cast<const AlignedBuffer*>(&arena_), &scratch_.buffer()})
      std::memset(buffer->data(), 0xff, buffer->size());
    for (const AlignedBuffer& buffer : owned_) std::memset(buffer.data(), 0xff, buffer.size());
  }

  int64_t planned_bytes() const override { return plan_.arena_bytes + plan_.persistent_bytes; }
  int64_t allocated_bytes() const override {
    return static_cast<int64_t>(arena_.size() + owned_bytes_ + packed_weights_->used_bytes() +
                                scratch_.allocated_bytes() + state_bytes_);
  }
  PrepareCost prepare_cost() const override { return prepare_cost_; }
  std::vector<std::string> keep_packed_weights() override {
    if (!unkept_packed_weights_) return {};
    unkept_packed_weights_ = false;
    return {pack_cache_->save(pack_key_, *packed_weights_, pool_)};
  }
  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<KernelTiming> last_timings() const override { return timings_; }
  std::vector<std::string> fallback_nodes() const override {
    std::vector<std::string> nodes;
    for (const PreparedKernel& k : kernels_)
      if (k.fallback) nodes.push_back(node_label(*k.node));
    return nodes;
  }

 private:
  // ---- weights ----

  // Every weight in storage form, except BatchNorm-folded weights that only convolutions read: those stay their
  // (often mapped) source with a factor per output channel, which the convolution applies while it packs, so the
  // weight is copied once and the folded copy never exists.
  void bind_weights(const std::vector<std::pair<ValueId, Tensor>>& binding) {
    const std::vector<bool> foldable = foldable_while_packing();
    ResolveOptions options;
    options.threads = pool_.size();
    options.leave_derived = [&foldable](ValueId id) { return foldable[static_cast<size_t>(id)]; };
    weights_ = resolve_weights(graph_, binding, options);
    row_scales_.assign(graph_.values.size(), {});
    for (size_t i = 0; i < weights_.size(); ++i)
      if (foldable[i] && !weights_[i].defined()) keep_source_with_scales(static_cast<ValueId>(i));
    for (size_t i = 0; i < weights_.size(); ++i)
      if (weights_[i].defined()) weights_[i] = to_storage_tensor(weights_[i], elem_of(static_cast<ValueId>(i)));
  }

  // By ValueId: a folded fp32 convolution weight (bn_fold_weight) that no other node or graph output reads.
  std::vector<bool> foldable_while_packing() const {
    std::vector<bool> foldable(graph_.values.size(), false);
    for (ValueId id : graph_.weights) {
      const Value& value = graph_.value(id);
      foldable[static_cast<size_t>(id)] =
          value.transform && value.transform->kind == "bn_fold_weight" && elem_of(id) == Elem::F32;
    }
    for (ValueId id : graph_.outputs) foldable[static_cast<size_t>(id)] = false;
    for (const Node& node : graph_.nodes) {
      const bool conv =
          node.op == "conv2d" || node.op == "conv1d" || node.op == "convolution" || node.op == "fused_conv2d";
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (!conv || i != 1) foldable[static_cast<size_t>(node.inputs[i])] = false;
    }
    return foldable;
  }

  // The folded weight `id` as its fp32 source and the factors of its output channels (computed now when the source
  // is stored otherwise).
  void keep_source_with_scales(ValueId id) {
    const Value& value = graph_.value(id);
    const WeightTransform& transform = *value.transform;
    std::vector<Tensor> sources;
    for (int32_t source : transform.sources)
      sources.push_back(source < 0 ? Tensor() : weights_[static_cast<size_t>(source)]);
    const Tensor& source = sources.at(0);
    if (source.dtype() != DType::Float32 || source.shape() != value.meta.shape) {
      weights_[static_cast<size_t>(id)] = apply_weight_transform(transform, sources, value.name, pool_.size());
      return;
    }
    row_scales_[static_cast<size_t>(id)] = bn_fold_scales(transform, sources, value.meta.shape.at(0), value.name);
    weights_[static_cast<size_t>(id)] = source;
  }

  // Computes the folded weight `id` kept as its source (for a kernel that cannot apply the factors itself).
  void materialize_scaled_weight(ValueId id) {
    const auto index = static_cast<size_t>(id);
    weights_[index] = scale_rows(weights_[index], row_scales_[index], pool_.size());
    row_scales_[index].clear();
    addresses_[index] = const_cast<std::byte*>(weights_[index].bytes());
  }

  bool reads_scaled_weight(const Node& node) const {
    return std::any_of(node.inputs.begin(), node.inputs.end(),
                       [this](ValueId id) { return !row_scales_[static_cast<size_t>(id)].empty(); });
  }

  // ---- buffers ----

  Elem elem_of(ValueId id) const { return elems_[static_cast<size_t>(id)]; }

  size_t storage_bytes(ValueId id) const {
    return static_cast<size_t>(shape_numel(graph_.value(id).meta.shape)) * elem_size(elem_of(id));
  }

  std::byte* own_buffer(size_t bytes) {
    owned_.emplace_back(bytes);
    owned_bytes_ += owned_.back().size();
    return owned_.back().data();
  }

  void place_values() {
    arena_ = AlignedBuffer(static_cast<size_t>(std::max<int64_t>(plan_.arena_bytes, 0)));
    addresses_.assign(graph_.values.size(), nullptr);
    view_of_.assign(graph_.values.size(), kNoValue);
    // Values left over from rewritten nodes have no producer and need no memory.
    std::vector<bool> live(graph_.values.size(), false);
    for (ValueId id : graph_.inputs) live[static_cast<size_t>(id)] = true;
    for (const Node& node : graph_.nodes)
      for (ValueId id : node.outputs) live[static_cast<size_t>(id)] = true;
    for (size_t i = 0; i < graph_.values.size(); ++i) {
      const auto id = static_cast<ValueId>(i);
      const Value& value = graph_.value(id);
      const compiler::BufferAssignment& assignment = plan_.values[i];
      const size_t bytes = storage_bytes(id);
      if (value.kind == ValueKind::Weight) {
        if (weights_[i].defined()) addresses_[i] = const_cast<std::byte*>(weights_[i].bytes());
        continue;
      }
      if (!live[i]) continue;
      if (const StateSlot* slot = state_.of_value(id)) {
        addresses_[i] = slot->memory->data();
        continue;
      }
      switch (assignment.placement) {
        case Placement::Arena:
          // A slot smaller than the value as stored here (integers are int64 here) gets its own buffer instead.
          if (assignment.offset >= 0 && static_cast<int64_t>(bytes) <= assignment.bytes &&
              assignment.offset + assignment.bytes <= plan_.arena_bytes)
            addresses_[i] = arena_.data() + assignment.offset;
          else
            addresses_[i] = own_buffer(bytes);
          break;
        case Placement::View:
          if (valid_view(id, assignment.alias_of)) {
            view_of_[i] = assignment.alias_of;
            break;
          }
          addresses_[i] = own_buffer(bytes);
          break;
        case Placement::Persistent:
        case Placement::None:
          addresses_[i] = own_buffer(std::max(bytes, static_cast<size_t>(std::max<int64_t>(assignment.bytes, 0))));
          break;
      }
    }
  }

  bool valid_view(ValueId id, ValueId root) const {
    if (root < 0 || static_cast<size_t>(root) >= graph_.values.size() || root == id) return false;
    return storage_bytes(root) == storage_bytes(id) && elem_of(root) == elem_of(id);
  }

  ValueId root_of(ValueId id) const {
    for (size_t steps = 0; view_of_[static_cast<size_t>(id)] != kNoValue; ++steps) {
      if (steps > graph_.values.size())
        fail(graph_.source + ": the memory plan's views of '" + graph_.value(id).name + "' form a cycle");
      id = view_of_[static_cast<size_t>(id)];
    }
    return id;
  }

  Buffer buffer(ValueId id) const {
    const Value& value = graph_.value(id);
    return Buffer{addresses_[static_cast<size_t>(root_of(id))], elem_of(id), value.meta};
  }

  // ---- kernels ----

  KernelContext context_for(const Node& node) {
    KernelContext ctx{node, {}, {}, pool_, scratch_, &options_, {}, {}};
    for (ValueId id : node.inputs) {
      ctx.inputs.push_back(buffer(id));
      ctx.constant_inputs.push_back(graph_.value(id).kind == ValueKind::Weight);
    }
    if (reads_scaled_weight(node))
      for (ValueId id : node.inputs) {
        const std::vector<double>& scales = row_scales_[static_cast<size_t>(id)];
        ctx.row_scales.push_back(scales.empty() ? nullptr : scales.data());
      }
    for (ValueId id : node.outputs) ctx.outputs.push_back(buffer(id));
    return ctx;
  }

  // The op's kernel, or the fallback when there is none for this case. A factory that rejects the node's
  // attributes leaves the verdict to the reference, which reports it with the node's name when the node runs.
  PreparedKernel make_kernel(const KernelContext& ctx) {
    if (const KernelFactory* factory = kernel_table().find(ctx.node.op)) {
      try {
        if (std::optional<Kernel> kernel = (*factory)(ctx)) return {&ctx.node, std::move(*kernel), false};
      } catch (const Error&) {
      }
    }
    return {&ctx.node, fallback_kernel(ctx), true};
  }

  // Outputs whose memory the kernel cannot share as planned: overlapping another output, overlapping an input
  // other than element by element, or lying in a weight that the kernel would overwrite.
  std::vector<size_t> conflicting_outputs(const KernelContext& ctx, const Kernel& kernel) const {
    std::vector<size_t> conflicts;
    for (size_t o = 0; o < ctx.outputs.size(); ++o) {
      const Buffer& out = ctx.outputs[o];
      bool conflict = !kernel.writes_nothing && graph_.value(root_of(ctx.node.outputs[o])).kind == ValueKind::Weight &&
                      out.bytes() > 0;
      for (size_t p = 0; p < ctx.outputs.size() && !conflict; ++p)
        conflict = p != o && ranges_overlap(out, ctx.outputs[p]);
      for (size_t i = 0; i < ctx.inputs.size() && !conflict; ++i) {
        const Buffer& in = ctx.inputs[i];
        if (!ranges_overlap(out, in)) continue;
        const bool same = out.data == in.data && out.bytes() == in.bytes() && out.elem == in.elem;
        const bool shareable = std::find(kernel.shareable_inputs.begin(), kernel.shareable_inputs.end(), i) !=
                               kernel.shareable_inputs.end();
        conflict = !(same && (shareable || kernel.writes_nothing));
      }
      if (conflict) conflicts.push_back(o);
    }
    return conflicts;
  }

  void build_kernels() {
    std::string note;
    packed_weights_ = pack_cache_ ? pack_cache_->arena_for(pack_key_, pool_, note) : std::make_shared<ZeroedArena>();
    if (!note.empty()) prepare_cost_.notes.push_back(note);
    {
      PackingArenaScope packing(packed_weights_);
      const auto make = [&](const Node& node) {
        packing.set_owner(node.name);  // a kernel made again asks for the same packed blocks
        return make_kernel(context_for(node));
      };
      for (const Node& node : graph_.nodes) {
        PreparedKernel prepared = make(node);
        if (!prepared.kernel.applies_row_scales && reads_scaled_weight(node)) {
          for (ValueId id : node.inputs)
            if (!row_scales_[static_cast<size_t>(id)].empty()) materialize_scaled_weight(id);
          prepared = make(node);
        }
        const std::vector<size_t> conflicts = conflicting_outputs(context_for(node), prepared.kernel);
        if (!conflicts.empty()) {
          for (size_t o : conflicts) {
            const ValueId id = node.outputs[o];
            view_of_[static_cast<size_t>(id)] = kNoValue;
            addresses_[static_cast<size_t>(id)] = own_buffer(storage_bytes(id));
          }
          prepared = make(node);
        }
        kernels_.push_back(std::move(prepared));
      }
    }
    packed_weights_->advise_huge_pages();  // written now: the kernel may merge their pages in the background
    unkept_packed_weights_ = false;
    if (pack_cache_ && packed_weights_->used_bytes() > 0) {
      if (packed_weights_->written_bytes() < packed_weights_->used_bytes())
        unkept_packed_weights_ = true;  // for keep_packed_weights
      else
        prepare_cost_.notes.push_back("mapped " + pack_cache_->file_for(pack_key_));
    }
  }

  // Keys this program's packed weights for the files in options_.pack_cache.
  void open_pack_cache(const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights) {
    if (build_id().empty()) {
      prepare_cost_.notes.push_back("packed weights are not kept in " + options_.pack_cache +
                                    ": this build carries no build id to tell its packing from another's");
      return;
    }
    const std::string packing_options = "weights " + std::to_string(static_cast<int>(options_.weights)) + ", group " +
                                        std::to_string(options_.quantization_group);
    pack_key_ = pack_key(write_program_bytes(program), packing_options, weights, pool_);
    pack_cache_.emplace(options_.pack_cache);
  }

  // ---- state kept between runs (see PreparedProgram::bind_state) ----

 public:
  void bind_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                  const PreparedProgram* share_with) override {
    std::vector<StateSlot> slots = resolve_state(input_output_pairs, share_with);
    for (StateSlot& slot : slots) {
      for (ValueId id : {slot.input, slot.output}) {
        release_owned(addresses_[static_cast<size_t>(id)]);
        addresses_[static_cast<size_t>(id)] = slot.memory->data();
      }
    }
    state_.add(std::move(slots));
    const auto start = std::chrono::steady_clock::now();
    kernels_.clear();
    timings_.clear();
    build_kernels();  // in a new arena: the old kernels' packed weights go with them
    scratch_.allocate(pool_.size());
    prefault_run_memory();
    for (const PreparedKernel& k : kernels_) timings_.push_back({k.node->name, k.node->op, 0.0});
    check_state_in_place();
    count_prepare_cost(start);
  }

  void write_state(const std::string& input, const Tensor& value) override {
    const StateSlot* slot = state_.of_input(input);
    if (!slot) fail(graph_.source + ": no state is kept for input '" + input + "'");
    const Value& meta = graph_.value(slot->input);
    if (value.shape() != meta.meta.shape || reference_dtype(value.dtype()) != reference_dtype(meta.meta.dtype))
      fail(graph_.source + ": state '" + input + "' is " + shape_string(meta.meta.shape) + " " +
           std::string(dtype_name(meta.meta.dtype)) + ", got " + shape_string(value.shape()) + " " +
           std::string(dtype_name(value.dtype())));
    tensor_to_storage(value.to_reference(), slot->memory->data(), elem_of(slot->input));
  }

  Tensor read_state(const std::string& input) const override {
    const StateSlot* slot = state_.of_input(input);
    if (!slot) fail(graph_.source + ": no state is kept for input '" + input + "'");
    return storage_to_tensor(slot->memory->data(), elem_of(slot->input), graph_.value(slot->input).meta.shape);
  }

 private:
  using StateSlot = npusim::StateSlot<AlignedBuffer>;

  // Checks the pairs and gives each its memory: the shared program's for the same input, else a new buffer.
  std::vector<StateSlot> resolve_state(const std::vector<std::pair<std::string, std::string>>& input_output_pairs,
                                       const PreparedProgram* share_with) {
    const auto* other = dynamic_cast<const CpuPreparedProgram*>(share_with);
    if (share_with && !other) fail(graph_.source + ": state can only be shared with a program of the CPU backend");
    return state_.resolve(
        graph_, plan_, input_output_pairs, other ? &other->state_ : nullptr,
        [this](ValueId input, ValueId output) { return elem_of(input) == elem_of(output); },
        [this](ValueId id) { return storage_bytes(id); },
        [this](const StateSlot& slot) {
          auto memory = std::make_shared<AlignedBuffer>(storage_bytes(slot.input));
          state_bytes_ += memory->size();
          return memory;
        });
  }

  void check_state_in_place() const {
    for (const StateSlot& slot : state_.all())
      if (addresses_[static_cast<size_t>(slot.output)] != slot.memory->data())
        fail(graph_.source + ": the kernel of node '" +
             graph_.nodes[static_cast<size_t>(graph_.value(slot.output).producer)].name + "' cannot update state '" +
             slot.input_name + "' in place");
  }

  // Frees the persistent buffer a state value had before it moved to the shared state memory.
  void release_owned(std::byte* address) {
    // Moving the other buffers keeps their memory where it is.
    auto it = std::find_if(owned_.begin(), owned_.end(),
                           [address](const AlignedBuffer& owned) { return address && owned.data() == address; });
    if (it == owned_.end()) return;
    owned_bytes_ -= it->size();
    owned_.erase(it);
  }

  // Inputs as check_inputs takes them, except that state inputs may be left out (the state stays as it is).
  void copy_inputs_keeping_state(const std::map<std::string, Tensor>& inputs) {
    for (const auto& [name, tensor] : inputs) find_graph_io(graph_, graph_.inputs, name, "input");
    for (ValueId id : graph_.inputs) {
      const Tensor* tensor = checked_input(graph_, inputs, id, state_.of_input(graph_.value(id).name) != nullptr);
      if (!tensor) continue;
      const Buffer in = buffer(id);
      tensor_to_storage(tensor->to_reference(), in.data, in.elem);
    }
  }

  // Adds the time since `start` (a prepare, or a rebuild for bound state) to this program's prepare cost.
  void count_prepare_cost(std::chrono::steady_clock::time_point start) {
    prepare_cost_.milliseconds +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    prepare_cost_.packed_bytes = static_cast<int64_t>(packed_weights_->used_bytes());
    prepare_cost_.mapped_bytes = static_cast<int64_t>(packed_weights_->written_bytes());
  }

  StateSlots<AlignedBuffer> state_;
  size_t state_bytes_ = 0;  // state memory this program allocated (not counting memory shared from another)

  Graph graph_;
  compiler::MemoryPlan plan_;
  Elem floats_;
  ThreadPool pool_;
  ScratchSpace scratch_;
  AlignedBuffer arena_;
  std::vector<AlignedBuffer> owned_;  // persistent buffers, outputs nobody reads, values moved out of the arena
  size_t owned_bytes_ = 0;
  std::vector<Elem> elems_;      // by ValueId: how each value is stored
  std::vector<Tensor> weights_;  // by ValueId, in storage form
  // By ValueId: for a folded weight kept as its source (weights_), the factor of each output channel; else empty.
  std::vector<std::vector<double>> row_scales_;
  std::vector<std::byte*> addresses_;  // by ValueId; unused for views
  std::vector<ValueId> view_of_;       // by ValueId: the value a view aliases, or kNoValue
  std::vector<PreparedKernel> kernels_;
  // The weights the kernels pack at prepare time (each packed matrix keeps it alive).
  std::shared_ptr<ZeroedArena> packed_weights_ = std::make_shared<ZeroedArena>();
  std::optional<PackCache> pack_cache_;  // with options_.pack_cache
  bool unkept_packed_weights_ = false;   // packed here, not yet written to pack_cache_
  PackKey pack_key_;
  PrepareCost prepare_cost_;
  std::vector<KernelTiming> timings_;
  bool profiling_ = false;
  bool poison_ = false;
  CpuOptions options_;
};

}  // namespace

BackendCapabilities CpuBackend::capabilities() const {
  BackendCapabilities caps;
  caps.name = "cpu";
  caps.compute_dtypes = {DType::Float32, DType::Float16, DType::BFloat16};
  caps.ops = kernel_table().ops();
  caps.reference_fallback = true;
  return caps;
}

std::unique_ptr<PreparedProgram> CpuBackend::prepare(const Program& program,
                                                     const std::vector<std::pair<ValueId, Tensor>>& weights) {
  return std::make_unique<CpuPreparedProgram>(program, weights, options_);
}

std::unique_ptr<PreparedProgram> CpuBackend::prepare_with_state(
    const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights,
    const std::vector<std::pair<std::string, std::string>>& state, const PreparedProgram* share_with) {
  return std::make_unique<CpuPreparedProgram>(program, weights, options_, state, share_with);
}

}  // namespace npusim::cpu
