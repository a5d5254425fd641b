#pragma once
// Byte pair encoding over the bytes of one pre-tokenized piece: start from one token per byte, then apply the
// lowest-ranked merge present until none applies.
#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace npusim {

class BytePairEncoder {
 public:
  BytePairEncoder() { byte_ids_.fill(-1); }

  // The token of the single byte `byte` (-1: none; such bytes are dropped, as Hugging Face does without an
  // unknown token).
  void set_byte_id(uint8_t byte, int32_t id) { byte_ids_[byte] = id; }
  int32_t byte_id(uint8_t byte) const { return byte_ids_[byte]; }
  // Adds the next merge, ranked after the ones before it. Returns false when the pair already has a merge (the
  // earlier one keeps its rank).
  bool add_merge(int32_t left, int32_t right, int32_t merged);
  size_t merge_count() const { return merges_.size(); }

  void encode(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* find(int32_t left, int32_t right) const {
    const auto it = merges_.find(key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::array<int32_t, 256> byte_ids_;
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace npusim
