#include "backends/cpu/strided_loop.h"

namespace npusim::cpu {

std::optional<StridedLoop> make_loop(const Shape& shape, std::span<const std::vector<int64_t>> strides,
                                     std::span<const int64_t> bases) {
  if (strides.size() > static_cast<size_t>(kMaxLoopOperands)) return std::nullopt;
  StridedLoop loop;
  loop.operands = static_cast<int>(strides.size());
  loop.numel = shape_numel(shape);
  for (size_t k = 0; k < bases.size() && k < strides.size(); ++k) loop.base[k] = bases[k];
  int rank = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // contributes nothing to any offset
    // Merge into the previous dim when every operand steps over it exactly as one longer dim would.
    bool mergeable = rank > 0;
    for (size_t k = 0; mergeable && k < strides.size(); ++k)
      mergeable = loop.strides[k][rank - 1] == strides[k][d] * shape[d];
    if (mergeable) {
      loop.dims[rank - 1] *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) loop.strides[k][rank - 1] = strides[k][d];
      continue;
    }
    if (rank == kMaxLoopRank) return std::nullopt;
    loop.dims[rank] = shape[d];
    for (size_t k = 0; k < strides.size(); ++k) loop.strides[k][rank] = strides[k][d];
    ++rank;
  }
  if (rank == 0) {  // a single element
    loop.dims[0] = 1;
    rank = 1;
  }
  loop.rank = rank;
  return loop;
}

}  // namespace npusim::cpu
