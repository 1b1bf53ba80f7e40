#include "core/kvcache/prefix_hash.h"

namespace estuary {
namespace {

// xxHash64 primes and round/avalanche steps: every input bit affects every output bit.
constexpr uint64_t kPrime1 = 0x9e3779b185ebca87ull;
constexpr uint64_t kPrime2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kPrime3 = 0x165667b19e3779f9ull;
constexpr uint64_t kPrime4 = 0x85ebca77c2b2ae63ull;

constexpr uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

constexpr uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = Rotl(acc, 31);
  return acc * kPrime1;
}

constexpr uint64_t Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t HashPageTokens(uint64_t parent_hash, absl::Span<const int32_t> block_tokens) {
  uint64_t h = Round(kPrime4, parent_hash);
  h = Round(h, static_cast<uint64_t>(block_tokens.size()));
  size_t i = 0;
  // Two token ids per 64-bit round.
  for (; i + 2 <= block_tokens.size(); i += 2) {
    const uint64_t word = static_cast<uint64_t>(static_cast<uint32_t>(block_tokens[i])) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(block_tokens[i + 1])) << 32);
    h = Round(h, word);
  }
  if (i < block_tokens.size()) {
    h = Round(h, static_cast<uint64_t>(static_cast<uint32_t>(block_tokens[i])) | (1ull << 63));
  }
  return Avalanche(h);
}

}  // namespace estuary
