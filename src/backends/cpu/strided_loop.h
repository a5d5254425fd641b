#pragma once
// Walks a contiguous output in row-major order while following each operand through its own strides
// (broadcasting, transposes, slices). Dims are collapsed at prepare time so that rows are as long as possible.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "npusim/tensor.h"

namespace npusim::cpu {

constexpr int kMaxLoopRank = 8;
constexpr int kMaxLoopOperands = 4;

struct StridedLoop {
  int rank = 1;
  int operands = 0;
  int64_t numel = 0;
  std::array<int64_t, kMaxLoopRank> dims{};
  std::array<std::array<int64_t, kMaxLoopRank>, kMaxLoopOperands> strides{};  // in elements
  std::array<int64_t, kMaxLoopOperands> base{};                               // element offset of index 0

  int64_t inner_stride(int operand) const { return strides[static_cast<size_t>(operand)][rank - 1]; }
};

// Operand k has `strides[k]` (one per dim of `shape`, 0 for broadcast) and starts at `bases[k]`. Nothing when
// the collapsed loop needs more dims or operands than supported.
std::optional<StridedLoop> make_loop(const Shape& shape, std::span<const std::vector<int64_t>> strides,
                                     std::span<const int64_t> bases = {});

// Calls row(position, count, offsets) for consecutive runs of the output range [begin, end) that stay within one
// row of the collapsed loop; offsets[k] is operand k's element offset at `position`, and operand k advances by
// inner_stride(k) per element within the run.
template <typename Row>
void walk(const StridedLoop& loop, int64_t begin, int64_t end, const Row& row) {
  if (begin >= end) return;
  const int last = loop.rank - 1;
  std::array<int64_t, kMaxLoopRank> index{};
  std::array<int64_t, kMaxLoopOperands> offsets = loop.base;
  int64_t rest = begin;
  for (int d = last; d >= 0; --d) {
    index[d] = rest % loop.dims[d];
    rest /= loop.dims[d];
    for (int k = 0; k < loop.operands; ++k) offsets[k] += index[d] * loop.strides[k][d];
  }
  int64_t position = begin;
  while (position < end) {
    const int64_t count = std::min(end - position, loop.dims[last] - index[last]);
    row(position, count, offsets.data());
    position += count;
    index[last] += count;
    for (int k = 0; k < loop.operands; ++k) offsets[k] += count * loop.strides[k][last];
    for (int d = last; d > 0 && index[d] == loop.dims[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
      for (int k = 0; k < loop.operands; ++k) offsets[k] += loop.strides[k][d - 1] - loop.strides[k][d] * loop.dims[d];
    }
  }
}

}  // namespace npusim::cpu
