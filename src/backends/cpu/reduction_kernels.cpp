// Reductions of float tensors over one block of adjacent dims (the common case: the last dims, or one middle dim):
// sum, mean, amax, amin. The input is viewed as [outer, reduced, inner]; sums accumulate in double like the
// reference. Other dim sets and integer inputs run on the fallback.
#include <cmath>
#include <limits>

#include "backends/cpu/kernels.h"
#include "ops/op_util.h"

namespace npusim::cpu {

namespace {

enum class Reduce { Sum, Mean, Max, Min };

struct Block {
  int64_t outer = 1, reduced = 1, inner = 1;
};

// The [outer, reduced, inner] view when the reduced dims (size-1 dims aside) are adjacent.
std::optional<Block> reduction_block(const Attrs& attrs, const Shape& shape) {
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(shape.size(), false);
  const std::vector<int64_t> dims = attrs.get_ints("dim", {});
  if (dims.empty()) std::fill(reduced.begin(), reduced.end(), true);
  for (int64_t d : dims) reduced[static_cast<size_t>(ops::normalize_dim(d, rank))] = true;
  Block block;
  int stage = 0;  // 0: before the reduced dims, 1: inside them, 2: after
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (reduced[d]) {
      if (stage == 2) return std::nullopt;
      stage = 1;
      block.reduced *= shape[d];
    } else {
      if (stage == 1) stage = 2;
      (stage == 0 ? block.outer : block.inner) *= shape[d];
    }
  }
  return block;
}

float reduce_line(Reduce kind, const float* x, int64_t n, int64_t stride) {
  switch (kind) {
    case Reduce::Sum:
    case Reduce::Mean: {
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += x[i * stride];
      return static_cast<float>(kind == Reduce::Mean ? sum / static_cast<double>(n) : sum);
    }
    case Reduce::Max:
    case Reduce::Min: {
      float best = x[0];
      for (int64_t i = 1; i < n && !std::isnan(best); ++i) {
        const float v = x[i * stride];
        if (std::isnan(v) || (kind == Reduce::Max ? v > best : v < best)) best = v;
      }
      return best;
    }
  }
  return 0.0f;
}

KernelFactory reduction(Reduce kind) {
  return [kind](const KernelContext& ctx) -> std::optional<Kernel> {
    if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1) return std::nullopt;
    const Buffer in = ctx.inputs[0], out = ctx.outputs[0];
    if (!is_floating(in.meta.dtype) || !is_floating(out.meta.dtype) || in.meta.shape.empty()) return std::nullopt;
    const std::optional<Block> block = reduction_block(ctx.node.attrs, in.meta.shape);
    if (!block || block->outer * block->inner != out.numel()) return std::nullopt;
    if (block->reduced == 0 && (kind == Reduce::Max || kind == Reduce::Min)) return std::nullopt;
    const Block b = *block;
    // One [reduced, inner] slab per outer index, converted to fp32 unless stored so.
    const int64_t slab = in.elem == Elem::F32 ? 0 : b.reduced * b.inner;
    if (slab > (int64_t{1} << 22)) return std::nullopt;
    ctx.scratch.reserve_per_worker(floats_bytes(slab + b.inner));
    Kernel kernel;
    kernel.run = [=, pool = &ctx.pool, scratch = &ctx.scratch] {
      auto range = [&](int64_t begin, int64_t end, int worker) {
        float* converted = scratch->worker_as<float>(worker);
        float* results = converted + slab;
        for (int64_t o = begin; o < end; ++o) {
          const int64_t count = b.reduced * b.inner;
          const float* x =
              float_data(in.data + static_cast<size_t>(o * count) * elem_size(in.elem), in.elem, count, converted);
          for (int64_t i = 0; i < b.inner; ++i)
            results[i] =
                b.reduced == 0 ? (kind == Reduce::Mean ? NAN : 0.0f) : reduce_line(kind, x + i, b.reduced, b.inner);
          from_float(results, out.data + static_cast<size_t>(o * b.inner) * elem_size(out.elem), out.elem, b.inner);
        }
      };
      if (b.outer * b.reduced * b.inner < (int64_t{1} << 15))
        range(0, b.outer, 0);
      else
        pool->parallel_for(b.outer, 1, range);
    };
    return kernel;
  };
}

}  // namespace

void add_reduction_kernels(KernelTable& table) {
  table.add("sum", reduction(Reduce::Sum));
  table.add("mean", reduction(Reduce::Mean));
  table.add("amax", reduction(Reduce::Max));
  table.add("amin", reduction(Reduce::Min));
}

}  // namespace npusim::cpu
