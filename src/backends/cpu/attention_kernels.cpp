#include "backends/cpu/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "backends/cpu/gemv.h"
#include "backends/cpu/vector_math.h"

namespace npusim::cpu {

namespace {

struct DecodePlan {
  Buffer q, k, v, out, positions;
  int64_t q_heads = 0, kv_heads = 0, group = 0;  // group: query heads per key/value head
  int64_t source = 0, embed = 0, value_embed = 0;
  int64_t heads_per_item = 0;  // query heads one worker takes together (at most kGemvMaxRows)
  float scale = 1.0f;
};

GemvWeightType cache_type(Elem elem) {
  return elem == Elem::BF16 ? GemvWeightType::BF16 : elem == Elem::F16 ? GemvWeightType::F16 : GemvWeightType::F32;
}

int64_t scratch_floats(const DecodePlan& p) {
  return p.heads_per_item * (p.embed + p.source + p.value_embed) + p.value_embed + 64;
}

void softmax_rows(float* scores, int64_t rows, int64_t count) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * count;
    const float largest = *std::max_element(s, s + count);
    double sum = 0.0;
    if (!vector_exp_shifted(s, count, largest, sum))
      for (int64_t j = 0; j < count; ++j) sum += (s[j] = std::exp(s[j] - largest));
    const auto inverse = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < count; ++j) s[j] *= inverse;
  }
}

// Query heads [first, first + count), all of key/value head first / group, over cache positions [0, reads).
void attend(const DecodePlan& p, int64_t first, int64_t count, int64_t reads, float* scratch) {
  const int64_t E = p.embed, Ev = p.value_embed, kv = first / p.group;
  float* q = scratch;
  float* scores = q + count * E;
  float* sums = scores + count * reads;
  float* value_row = sums + count * Ev;
  to_float(p.q.data + static_cast<size_t>(first * E) * elem_size(p.q.elem), p.q.elem, q, count * E);
  for (int64_t i = 0; i < count * E; ++i) q[i] *= p.scale;
  std::fill_n(sums, count * Ev, 0.0f);
  if (reads > 0) {
    const std::byte* keys = p.k.data + static_cast<size_t>(kv * p.source * E) * elem_size(p.k.elem);
    const GemvProblem products{.m = count,
                               .x = q,
                               .ldx = E,
                               .weight = {.type = cache_type(p.k.elem), .values = keys, .n = reads, .k = E},
                               .y = reinterpret_cast<std::byte*>(scores),
                               .ldy = reads};
    gemv_columns(products, 0, reads);
    softmax_rows(scores, count, reads);
    const std::byte* values = p.v.data + static_cast<size_t>(kv * p.source * Ev) * elem_size(p.v.elem);
    for (int64_t j = 0; j < reads; ++j) {
      const float* row =
          float_data(values + static_cast<size_t>(j * Ev) * elem_size(p.v.elem), p.v.elem, Ev, value_row);
      for (int64_t h = 0; h < count; ++h) {
        const float weight = scores[h * reads + j];
        float* sum = sums + h * Ev;
        for (int64_t d = 0; d < Ev; ++d) sum[d] += weight * row[d];
      }
    }
  }
  from_float(sums, p.out.data + static_cast<size_t>(first * Ev) * elem_size(p.out.elem), p.out.elem, count * Ev);
}

void run_decode(const DecodePlan& p, ThreadPool& pool, const ScratchSpace& scratch) {
  const int64_t* positions = p.positions.as<const int64_t>();
  const int64_t last = *std::max_element(positions, positions + p.positions.numel());
  const int64_t reads = std::clamp<int64_t>(last + 1, 0, p.source);
  const int64_t items_per_kv = (p.group + p.heads_per_item - 1) / p.heads_per_item;
  pool.parallel_for(p.kv_heads * items_per_kv, 1, [&](int64_t begin, int64_t end, int worker) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t kv = item / items_per_kv, part = item % items_per_kv;
      const int64_t first = part * p.heads_per_item;
      attend(p, kv * p.group + first, std::min(p.heads_per_item, p.group - first), reads,
             scratch.worker_as<float>(worker));
    }
  });
}

bool floats(const Buffer& b) { return is_float_elem(b.elem); }

}  // namespace

std::optional<Kernel> decode_attention(const KernelContext& ctx) {
  const Attrs& attrs = ctx.node.attrs;
  if (ctx.node.op != "attention" || ctx.inputs.size() != 4 || ctx.outputs.size() != 1) return std::nullopt;
  if (attrs.get_bool("has_mask", false) || !attrs.get_bool("has_cache_position", false) ||
      attrs.get_bool("is_causal", false))
    return std::nullopt;
  DecodePlan p;
  p.q = ctx.inputs[0];
  p.k = ctx.inputs[1];
  p.v = ctx.inputs[2];
  p.positions = ctx.inputs[3];
  p.out = ctx.outputs[0];
  if (!floats(p.q) || !floats(p.k) || !floats(p.v) || !floats(p.out) || p.positions.elem != Elem::I64 ||
      p.positions.numel() < 1)
    return std::nullopt;
  const Shape &q = p.q.meta.shape, &k = p.k.meta.shape, &v = p.v.meta.shape;
  if (q.size() != 4 || k.size() != 4 || v.size() != 4 || q[0] != 1 || k[0] != 1 || v[0] != 1 || q[2] != 1)
    return std::nullopt;
  p.q_heads = q[1];
  p.kv_heads = k[1];
  p.embed = q[3];
  p.source = k[2];
  p.value_embed = v[3];
  if (p.kv_heads < 1 || v[1] != p.kv_heads || p.q_heads % p.kv_heads != 0 || k[3] != p.embed || v[2] != p.source ||
      p.out.numel() != p.q_heads * p.value_embed || p.embed < 1)
    return std::nullopt;
  p.group = p.q_heads / p.kv_heads;
  p.scale = static_cast<float>(attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(p.embed))
                                                      : attrs.get_float("scale"));
  // Enough items for every worker, each reading its key/value head once for as many query heads as fit.
  const int64_t splits = std::clamp<int64_t>((ctx.pool.size() + p.kv_heads - 1) / p.kv_heads, 1, p.group);
  p.heads_per_item = std::min<int64_t>(kGemvMaxRows, (p.group + splits - 1) / splits);
  ctx.scratch.reserve_per_worker(floats_bytes(scratch_floats(p)));
  Kernel kernel;
  kernel.run = [plan = std::make_shared<const DecodePlan>(p), pool = &ctx.pool, scratch = &ctx.scratch] {
    run_decode(*plan, *pool, *scratch);
  };
  return kernel;
}

}  // namespace npusim::cpu
