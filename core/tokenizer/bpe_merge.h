#pragma once
// The merge loop shared by both BPE flavours: repeatedly merge the adjacent pair with the lowest
// priority value, the leftmost one on ties, until no adjacent pair can merge. llama2.c's encoder
// uses priority = -score (highest score first); tokenizer.json BPE uses priority = merge rank.
// O(n log n) with a heap and lazy invalidation, so it is fine for whole-text "words" too.
// Stateless; thread-safe.

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"

namespace estuary {

struct MergeCandidate {
  double priority = 0;  // lower merges first
  int32_t merged_id = -1;
};

// Returns true and fills `*out` when the pair (left, right) can merge.
using MergeLookup = absl::FunctionRef<bool(int32_t left, int32_t right, MergeCandidate* out)>;

// Merges `ids` in place.
void ApplyMerges(std::vector<int32_t>* ids, MergeLookup lookup);

}  // namespace estuary
