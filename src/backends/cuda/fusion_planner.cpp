#include "backends/cuda/fusion_planner.h"

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_util.h"
#include "backends/cuda/device_kernels.h"
#include "backends/cuda/pointwise_fusion.h"

namespace npusim::cuda {

namespace {

bool aligned16(const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; }

class FusionPlanner {
 public:
  explicit FusionPlanner(const FusionSite& site) : site_(site), graph_(site.graph), consumers_(consumers_of_values()) {}

  FusionPlan plan() const {
    FusionPlan plan = FusionPlan::none(graph_.nodes.size());
    std::vector<bool>& fused_away = plan.fused_away;
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      if (fused_away[n] || plan.launches[n]) continue;
      std::string label;
      std::optional<Launch> launch = fuse_decode_gemvs(n, fused_away, label);
      if (!launch) launch = fuse_rope_cache(n, fused_away, label);
      if (!launch) launch = fuse_attention_transpose(n, fused_away, label);
      if (!launch) launch = fuse_linear_residual(n, fused_away, label);
      if (!launch) {
        const auto taken = [&](size_t m) { return fused_away[m] || plan.launches[m].has_value(); };
        if (std::optional<PointwiseRun> run = fuse_pointwise_run(site_, n, consumers_, taken)) {
          for (size_t m = n; m < run->last; ++m) fused_away[m] = true;
          plan.launches[run->last] = FusedLaunch{std::move(run->launch), std::move(run->label)};
          continue;
        }
      }
      if (launch) {
        plan.launches[n] = FusedLaunch{std::move(*launch), std::move(label)};
      } else if (auto at_reader = fuse_transpose_into_reader(n, fused_away, plan.launches, label)) {
        fused_away[n] = true;
        plan.launches[at_reader->first] = FusedLaunch{std::move(at_reader->second), std::move(label)};
      }
    }
    return plan;
  }

 private:
  DeviceValue value_at(ValueId id) const { return site_.value_at(id); }
  bool is_state(ValueId id) const { return site_.is_state(id); }

  // ---- decode GEMV fusion ----
  // One-row linears (decode) become fewer launches at prepare time, the graph itself unchanged: linears reading the
  // same row (q/k/v) run as one batched GEMV; a gate and an up projection feeding a silu_mul run as one gated GEMV
  // writing the silu_mul's output; a residual add that is a linear's only consumer is that GEMV's epilogue.

  std::vector<std::vector<size_t>> consumers_of_values() const {
    std::vector<std::vector<size_t>> consumers(graph_.values.size());
    for (size_t n = 0; n < graph_.nodes.size(); ++n)
      for (ValueId id : graph_.nodes[n].inputs) consumers[static_cast<size_t>(id)].push_back(n);
    for (ValueId id : graph_.outputs) consumers[static_cast<size_t>(id)].push_back(graph_.nodes.size());
    return consumers;
  }

  // The only node reading `id` (not a graph output), or nothing.
  std::optional<size_t> sole_consumer(ValueId id) const {
    const auto& readers = consumers_[static_cast<size_t>(id)];
    if (readers.size() != 1 || readers[0] >= graph_.nodes.size()) return std::nullopt;
    return readers[0];
  }

  // A linear the GEMV takes whole: one row of activations, everything in one float storage.
  bool plain_gemv(const Node& node) const {
    if (node.op != "linear" || node.inputs.size() < 2 || node.inputs.size() > 3 || node.outputs.size() != 1)
      return false;
    const DeviceValue x = value_at(node.inputs[0]), w = value_at(node.inputs[1]), y = value_at(node.outputs[0]);
    if (w.meta.shape.size() != 2 || x.meta.shape.empty() || !cpu::is_float_elem(y.elem)) return false;
    const int64_t rows = w.meta.shape[0], k = w.meta.shape[1];
    if (x.numel() != k || y.numel() != rows || rows <= 0 || x.elem != w.elem || w.elem != y.elem) return false;
    if (node.inputs.size() == 3 && value_at(node.inputs[2]).numel() != rows) return false;
    for (ValueId id : node.inputs)
      if (is_state(id)) return false;
    return aligned16(x.data) && aligned16(w.data) && gemv_supports(k, elem_code(y.elem));
  }

  GemvSegment segment_of(const Node& linear) const {
    GemvSegment segment;
    const DeviceValue w = value_at(linear.inputs[1]), y = value_at(linear.outputs[0]);
    segment.w = w.data;
    segment.y = y.data;
    segment.rows = w.meta.shape[0];
    if (linear.inputs.size() == 3) segment.bias = as_operand(value_at(linear.inputs[2]));
    return segment;
  }

  // Folds the residual add that is the linear's only consumer into its segment, launched at node `launch_at`;
  // returns that add's index.
  std::optional<size_t> fold_residual(size_t n, size_t launch_at, GemvSegment& segment) const {
    const Node& linear = graph_.nodes[n];
    const auto add_index = sole_consumer(linear.outputs[0]);
    if (!add_index) return std::nullopt;
    const Node& add = graph_.nodes[*add_index];
    if (add.op != "add" || add.inputs.size() != 2 || add.outputs.size() != 1 ||
        add.attrs.get_float("alpha", 1.0) != 1.0)
      return std::nullopt;
    const ValueId other = add.inputs[0] == linear.outputs[0] ? add.inputs[1] : add.inputs[0];
    if (other == linear.outputs[0] || is_state(other) || is_state(add.outputs[0])) return std::nullopt;
    const Value& residual_value = graph_.value(other);
    if (residual_value.kind == ValueKind::NodeOutput && residual_value.producer >= static_cast<int32_t>(launch_at))
      return std::nullopt;
    const DeviceValue residual = value_at(other), out = value_at(add.outputs[0]), y = value_at(linear.outputs[0]);
    if (residual.numel() != segment.rows || out.numel() != segment.rows || out.elem != y.elem ||
        !cpu::is_float_elem(residual.elem))
      return std::nullopt;
    segment.residual = as_operand(residual);
    segment.y = out.data;
    return add_index;
  }

  // The rms_norm writing `x_id`, when it can run as the prologue of the GEMV launch made of the linears `readers`:
  // they are its only readers, it normalizes the whole row, and its input and weight share the GEMV's storage.
  struct FusedNorm {
    size_t node;
    DeviceValue input;
    GemvNorm norm;
  };
  std::optional<FusedNorm> fusable_norm(ValueId x_id, const std::vector<size_t>& readers, int elem, int64_t k) const {
    const Value& x_value = graph_.value(x_id);
    if (x_value.kind != ValueKind::NodeOutput || is_state(x_id)) return std::nullopt;
    const auto index = static_cast<size_t>(x_value.producer);
    const Node& norm = graph_.nodes[index];
    if (norm.op != "rms_norm" || norm.inputs.size() != 2 || norm.outputs.size() != 1) return std::nullopt;
    for (size_t reader : consumers_[static_cast<size_t>(x_id)])
      if (std::find(readers.begin(), readers.end(), reader) == readers.end()) return std::nullopt;
    int64_t normalized = 1;
    for (int64_t size : norm.attrs.get_ints("normalized_shape")) normalized *= size;
    const DeviceValue input = value_at(norm.inputs[0]), weight = value_at(norm.inputs[1]);
    if (normalized != k || input.numel() != k || weight.numel() != k || elem_code(input.elem) != elem ||
        elem_code(weight.elem) != elem || !aligned16(input.data) || !aligned16(weight.data) || is_state(norm.inputs[0]))
      return std::nullopt;
    GemvNorm fused;
    fused.enabled = true;
    fused.weight = weight.data;
    fused.elem = elem;
    fused.eps = rms_norm_eps(norm, graph_.value(norm.outputs[0]).meta.dtype);
    return FusedNorm{index, input, fused};
  }

  std::optional<Launch> fuse_decode_gemvs(size_t n, std::vector<bool>& fused_away, std::string& label) const {
    const Node& first = graph_.nodes[n];
    if (!plain_gemv(first)) return std::nullopt;
    const ValueId x_id = first.inputs[0];
    const DeviceValue x = value_at(x_id);
    const int64_t k = x.numel();
    const int elem = elem_code(value_at(first.outputs[0]).elem);
    const Node* where_node = &first;

    // Gated: silu_mul(first, other) with both linears read only by it.
    if (const auto gate_reader = sole_consumer(first.outputs[0])) {
      const Node& silu_mul = graph_.nodes[*gate_reader];
      if (silu_mul.op == "silu_mul" && silu_mul.inputs.size() == 2 && silu_mul.inputs[0] == first.outputs[0] &&
          silu_mul.outputs.size() == 1) {
        const ValueId up_id = silu_mul.inputs[1];
        const Value& up_value = graph_.value(up_id);
        const bool up_ok = up_value.kind == ValueKind::NodeOutput && up_value.producer > static_cast<int32_t>(n) &&
                           sole_consumer(up_id) == *gate_reader;
        if (up_ok) {
          const auto up_index = static_cast<size_t>(up_value.producer);
          const Node& up = graph_.nodes[up_index];
          const DeviceValue out = value_at(silu_mul.outputs[0]);
          if (plain_gemv(up) && up.inputs[0] == x_id && elem_code(out.elem) == elem &&
              value_at(up.inputs[1]).meta.shape == value_at(first.inputs[1]).meta.shape &&
              out.numel() == segment_of(first).rows) {
            GemvSegment gate = segment_of(first), up_segment = segment_of(up);
            gate.y = out.data;
            fused_away[up_index] = fused_away[*gate_reader] = true;
            label = "linear+linear+silu_mul";
            DeviceValue input = x;
            GemvNorm norm;
            if (const auto prologue = fusable_norm(x_id, {n, up_index}, elem, k)) {
              fused_away[prologue->node] = true;
              input = prologue->input;
              norm = prologue->norm;
              label = "rms_norm+" + label;
            }
            return [where_node, k, elem, input, gate, up_segment, norm](cudaStream_t stream) {
              check_launch(launch_gemv_gated(stream, k, elem, input.data, gate, up_segment, norm), "launch_gemv_gated",
                           *where_node);
            };
          }
        }
      }
    }

    // Batched: the later linears reading the same row, each with its residual add folded in where it has one.
    std::vector<GemvSegment> segments;
    std::vector<size_t> members, linears;
    for (size_t j = n; j < graph_.nodes.size() && j < n + 16 && segments.size() < kGemvMaxSegments; ++j) {
      const Node& other = graph_.nodes[j];
      if (fused_away[j] || !plain_gemv(other) || other.inputs[0] != x_id) continue;
      if (j != n) {
        if (const auto reader = sole_consumer(other.outputs[0]); reader && graph_.nodes[*reader].op == "silu_mul")
          continue;  // left for its gated pair
      }
      GemvSegment segment = segment_of(other);
      if (const auto add_index = fold_residual(j, n, segment)) members.push_back(*add_index);
      segments.push_back(segment);
      members.push_back(j);
      linears.push_back(j);
    }
    const auto prologue = fusable_norm(x_id, linears, elem, k);
    if (segments.size() == 1 && members.size() == 1 && !prologue) return std::nullopt;  // the plain linear runs
    label = segments.size() > 1 ? "linear x" + std::to_string(segments.size())
                                : (members.size() > 1 ? "linear+add" : "linear");
    for (size_t member : members)
      if (member != n) fused_away[member] = true;
    DeviceValue input = x;
    GemvNorm norm;
    if (prologue) {
      fused_away[prologue->node] = true;
      input = prologue->input;
      norm = prologue->norm;
      label = "rms_norm+" + label;
    }
    return [where_node, k, elem, input, segments, norm](cudaStream_t stream) {
      check_launch(
          launch_gemv_batch(stream, k, elem, input.data, segments.data(), static_cast<int>(segments.size()), norm),
          "launch_gemv_batch", *where_node);
    };
  }

  // ---- rotary embeddings and KV-cache writes ----
  // Consecutive ropes followed by index_copy nodes writing a cache in place run as one launch at the first rope; a
  // rope whose only reader is one of those writes goes straight into the cache.

  // Whether `id` is ready before node `first` runs: not written by node `first` or any later one.
  bool ready_before(ValueId id, size_t first) const {
    const Value& value = graph_.value(id);
    return value.kind != ValueKind::NodeOutput || static_cast<size_t>(value.producer) < first;
  }

  std::optional<Launch> fuse_rope_cache(size_t n, std::vector<bool>& fused_away, std::string& label) const {
    std::vector<size_t> ropes, writes;
    for (size_t j = n; j < graph_.nodes.size() && ropes.size() + writes.size() < kRopeCacheMaxJobs; ++j) {
      const std::string& op = graph_.nodes[j].op;
      if (op == "rope" && writes.empty())
        ropes.push_back(j);
      else if (op == "index_copy" && !ropes.empty())
        writes.push_back(j);
      else
        break;
    }
    if (ropes.empty() || writes.empty()) return std::nullopt;
    RopeCacheBatch batch;
    std::vector<bool> rotated_into_cache(ropes.size(), false);
    for (const size_t w : writes) {
      const Node& write = graph_.nodes[w];
      const std::optional<RopeCacheJob> job = cache_write_job(site_.context_of(w));
      const auto& readers = consumers_[static_cast<size_t>(write.inputs[0])];
      if (!job || readers.size() != 1 || is_state(write.inputs[2]) || !ready_before(write.inputs[0], n) ||
          !ready_before(write.inputs[1], n))
        return std::nullopt;
      const auto rope = std::find_if(ropes.begin(), ropes.end(),
                                     [&](size_t r) { return graph_.nodes[r].outputs[0] == write.inputs[2]; });
      if (rope == ropes.end()) {
        if (!ready_before(write.inputs[2], n)) return std::nullopt;
        batch.jobs[batch.count++] = *job;
        continue;
      }
      if (sole_consumer(write.inputs[2]) != w) return std::nullopt;  // the rope's output is read elsewhere too
      const std::optional<RopeCacheJob> rotated = rope_job(site_.context_of(*rope));
      if (!rotated) return std::nullopt;
      batch.jobs[batch.count++] = rope_into_cache(*rotated, *job);
      rotated_into_cache[static_cast<size_t>(rope - ropes.begin())] = true;
    }
    for (size_t r = 0; r < ropes.size(); ++r) {
      const Node& rope = graph_.nodes[ropes[r]];
      for (ValueId id : rope.inputs)
        if (!ready_before(id, n)) return std::nullopt;
      if (rotated_into_cache[r]) continue;
      for (size_t reader : consumers_[static_cast<size_t>(rope.outputs[0])])
        if (reader <= writes.back()) return std::nullopt;  // read inside the group, before the launch ends
      const std::optional<RopeCacheJob> job = rope_job(site_.context_of(ropes[r]));
      if (!job) return std::nullopt;
      batch.jobs[batch.count++] = *job;
    }
    for (size_t j = n + 1; j <= writes.back(); ++j) fused_away[j] = true;
    label = "rope x" + std::to_string(ropes.size()) + "+index_copy x" + std::to_string(writes.size());
    const Node* where_node = &graph_.nodes[n];
    return [where_node, batch](cudaStream_t stream) {
      check_launch(launch_rope_cache(stream, batch), "launch_rope_cache", *where_node);
    };
  }

  // ---- prefill layout fusion ----
  // The transposes between [tokens, heads] and [heads, tokens] orders around attention (no-ops at one token) fold into
  // the ops beside them: a rope reads its input through the transpose's strides (and writes straight into the KV
  // cache when a cache write is its only reader), a cache write copies from the transpose's input, an attention
  // writes its output in the transposed order.

  // The strides through which a reader of transpose node `n`'s output can read its input instead, when the
  // transpose copies (its output is not a view) and that reader is its only one.
  std::optional<std::pair<size_t, std::vector<int64_t>>> foldable_transpose(size_t n) const {
    const Node& transpose = graph_.nodes[n];
    if (transpose.inputs.size() != 1 || transpose.outputs.size() != 1 || site_.is_view(transpose.outputs[0]) ||
        is_state(transpose.inputs[0]) || is_state(transpose.outputs[0]))
      return std::nullopt;
    const auto reader = sole_consumer(transpose.outputs[0]);
    if (!reader) return std::nullopt;
    const DeviceValue in = value_at(transpose.inputs[0]), out = value_at(transpose.outputs[0]);
    if (in.elem != out.elem) return std::nullopt;
    auto strides = transposed_source_strides(transpose, in.meta.shape);
    if (!strides) return std::nullopt;
    return std::pair{*reader, std::move(*strides)};
  }

  // Transpose node `n` folded into its reader (a rope, or a cache write): the reader's launch, at the reader's place.
  std::optional<std::pair<size_t, Launch>> fuse_transpose_into_reader(
      size_t n, std::vector<bool>& fused_away, const std::vector<std::optional<FusedLaunch>>& fused,
      std::string& label) const {
    const auto foldable = foldable_transpose(n);
    if (!foldable) return std::nullopt;
    const auto& [r, strides] = *foldable;
    if (fused_away[r] || fused[r]) return std::nullopt;
    const Node& reader = graph_.nodes[r];
    const DeviceValue source = value_at(graph_.nodes[n].inputs[0]);
    const ValueId folded = graph_.nodes[n].outputs[0];
    RopeCacheBatch batch;
    if (reader.op == "rope" && reader.inputs.size() == 3 && reader.inputs[0] == folded && reader.inputs[1] != folded &&
        reader.inputs[2] != folded) {
      std::optional<RopeCacheJob> job = rope_job(site_.context_of(r), source, strides);
      if (!job) return std::nullopt;
      label = "transpose+rope";
      if (const auto write = cache_write_reading(reader.outputs[0], r);
          write && !fused_away[*write] && !fused[*write]) {
        if (const std::optional<RopeCacheJob> slot = cache_write_job(site_.context_of(*write))) {
          job = rope_into_cache(*job, *slot);
          fused_away[*write] = true;
          label = "transpose+rope+index_copy";
        }
      }
      batch.jobs[batch.count++] = *job;
    } else if (reader.op == "index_copy" && reader.inputs.size() == 3 && reader.inputs[2] == folded &&
               reader.inputs[0] != folded && reader.inputs[1] != folded) {
      std::optional<RopeCacheJob> job = cache_write_job(site_.context_of(r), source, strides);
      if (!job) return std::nullopt;
      batch.jobs[batch.count++] = *job;
      label = "transpose+index_copy";
    } else {
      return std::nullopt;
    }
    const Node* where_node = &reader;
    return std::pair{r, Launch([where_node, batch](cudaStream_t stream) {
                       check_launch(launch_rope_cache(stream, batch), "launch_rope_cache", *where_node);
                     })};
  }

  // The in-place cache write (index_copy) that is the only reader of `rotated`, rope node `r`'s output, when it can
  // run at the rope's place: its cache and index ready by then and the cache read by nothing else.
  std::optional<size_t> cache_write_reading(ValueId rotated, size_t r) const {
    const auto w = sole_consumer(rotated);
    if (!w) return std::nullopt;
    const Node& write = graph_.nodes[*w];
    if (write.op != "index_copy" || write.inputs.size() != 3 || write.inputs[2] != rotated ||
        consumers_[static_cast<size_t>(write.inputs[0])].size() != 1 || !ready_before(write.inputs[0], r) ||
        !ready_before(write.inputs[1], r))
      return std::nullopt;
    return w;
  }

  // An attention node `n` whose only reader is a transpose to [batch, tokens, heads, features]: the attention writes
  // the transpose's output and the transpose goes.
  std::optional<Launch> fuse_attention_transpose(size_t n, std::vector<bool>& fused_away, std::string& label) const {
    const Node& attention = graph_.nodes[n];
    if (attention.op != "attention" || attention.outputs.size() != 1) return std::nullopt;
    const auto t = sole_consumer(attention.outputs[0]);
    if (!t || graph_.nodes[*t].op != "transpose" || fused_away[*t]) return std::nullopt;
    const Node& transpose = graph_.nodes[*t];
    if (transpose.outputs.size() != 1 || site_.is_view(transpose.outputs[0]) || is_state(transpose.outputs[0]))
      return std::nullopt;
    const Shape& shape = graph_.value(attention.outputs[0]).meta.shape;
    const auto order = transposed_source_strides(transpose, shape);
    if (shape.size() != 4 || !order) return std::nullopt;
    const std::vector<int64_t> heads_inner{shape[1] * shape[2] * shape[3], shape[3], shape[2] * shape[3], 1};
    if (*order != heads_inner) return std::nullopt;  // the transpose of dims 1 and 2
    std::optional<Launch> launch = attention_with_heads_inner(site_.context_of(n), value_at(transpose.outputs[0]));
    if (!launch) return std::nullopt;
    fused_away[*t] = true;
    label = "attention+transpose";
    return launch;
  }

  // A linear of several rows (prefill) whose only reader is a residual add: the GEMM accumulates onto the residual
  // and writes the add's output.
  std::optional<Launch> fuse_linear_residual(size_t n, std::vector<bool>& fused_away, std::string& label) const {
    const Node& linear = graph_.nodes[n];
    if (linear.op != "linear" || linear.outputs.size() != 1) return std::nullopt;
    const auto a = sole_consumer(linear.outputs[0]);
    if (!a || fused_away[*a]) return std::nullopt;
    const Node& add = graph_.nodes[*a];
    if (add.op != "add" || add.inputs.size() != 2 || add.outputs.size() != 1 ||
        add.attrs.get_float("alpha", 1.0) != 1.0)
      return std::nullopt;
    const ValueId other = add.inputs[0] == linear.outputs[0] ? add.inputs[1] : add.inputs[0];
    if (other == linear.outputs[0] || !ready_before(other, n) || is_state(add.outputs[0]) ||
        site_.is_view(add.outputs[0]))
      return std::nullopt;
    std::optional<Launch> launch = linear_with_residual(site_.context_of(n), value_at(other), value_at(add.outputs[0]));
    if (!launch) return std::nullopt;
    fused_away[*a] = true;
    label = "linear+add";
    return launch;
  }

  const FusionSite& site_;
  const Graph& graph_;
  std::vector<std::vector<size_t>> consumers_;  // by value: the nodes reading it (graph outputs as nodes.size())
};

}  // namespace

FusionPlan plan_fusions(const FusionSite& site) { return FusionPlanner(site).plan(); }

}  // namespace npusim::cuda
