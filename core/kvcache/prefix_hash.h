#pragma once
// Prefix hashing for KV-page reuse (design §4). Each FULL page of a sequence is named by a hash
// chain over token ids: the hash of page i covers the hash of page i-1 and the block_size token
// ids of page i, so equal hashes mean (up to a 64-bit collision) an equal token prefix ending at
// that page's last token. Pages that are not full are never hashed.
//
// The hash is deterministic across processes and machines (no per-process seed, unlike
// absl::Hash), so a prefill worker and a decode worker name the same prefix the same way.

#include <cstdint>

#include "absl/types/span.h"

namespace estuary {

// The parent hash of a sequence's first page.
inline constexpr uint64_t kPrefixHashSeed = 0x6a09e667f3bcc908ull;

// Hash of one page: mixes `parent_hash` with the page's token ids (in order) and their count.
// Pure function; thread-safe.
uint64_t HashPageTokens(uint64_t parent_hash, absl::Span<const int32_t> block_tokens);

}  // namespace estuary
