#include "llm/tokenizer_bpe.h"

#include <algorithm>

namespace npusim {
namespace {

struct Symbol {
  int32_t id;  // -1 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

// A merge seen between symbol `left` and its right neighbour; it is stale once either side has changed.
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t left_id;
  int32_t right_id;
  int32_t merged;
};

// Orders the heap so that the lowest rank, then the leftmost position, comes out first.
bool later(const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; }

}  // namespace

bool BytePairEncoder::add_merge(int32_t left, int32_t right, int32_t merged) {
  return merges_.emplace(key(left, right), Merge{static_cast<int32_t>(merges_.size()), merged}).second;
}

void BytePairEncoder::encode(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  auto consider = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const Merge* merge = find(symbols[left].id, symbols[right].id)) {
      heap.push_back({merge->rank, left, symbols[left].id, symbols[right].id, merge->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate candidate = heap.back();
    heap.pop_back();
    Symbol& left = symbols[candidate.left];
    if (left.id != candidate.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Token ids only ever grow into longer tokens, so equal ids mean the pair is still there.
    if (right.id != candidate.right_id) continue;
    left.id = candidate.merged;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = candidate.left;
    right.id = -1;
    if (left.prev >= 0) consider(left.prev);
    consider(candidate.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace npusim
