#include "core/kvcache/prefix_hash.h"

#include <cstdint>
#include <numeric>
#include <unordered_set>
#include <vector>

#include "gtest/gtest.h"

namespace estuary {
namespace {

std::vector<int32_t> Iota(int n, int32_t start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(PrefixHashTest, DeterministicAcrossCalls) {
  const std::vector<int32_t> block = Iota(16, 100);
  EXPECT_EQ(HashPageTokens(kPrefixHashSeed, block), HashPageTokens(kPrefixHashSeed, block));
}

TEST(PrefixHashTest, DependsOnParentTokensOrderAndLength) {
  const std::vector<int32_t> block = Iota(16, 100);
  const uint64_t h = HashPageTokens(kPrefixHashSeed, block);
  EXPECT_NE(h, HashPageTokens(kPrefixHashSeed + 1, block));

  std::vector<int32_t> changed = block;
  changed[15] += 1;
  EXPECT_NE(h, HashPageTokens(kPrefixHashSeed, changed));

  std::vector<int32_t> swapped = block;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(h, HashPageTokens(kPrefixHashSeed, swapped));

  // A trailing zero token is not the same as no token.
  const std::vector<int32_t> three = {1, 2, 0};
  const std::vector<int32_t> two = {1, 2};
  EXPECT_NE(HashPageTokens(kPrefixHashSeed, three), HashPageTokens(kPrefixHashSeed, two));
}

TEST(PrefixHashTest, NoCollisionsOverManySingleTokenChanges) {
  std::unordered_set<uint64_t> seen;
  std::vector<int32_t> block = Iota(16, 0);
  for (int pos = 0; pos < 16; ++pos) {
    for (int32_t value = 0; value < 2000; ++value) {
      std::vector<int32_t> b = block;
      b[static_cast<size_t>(pos)] = value;
      seen.insert(HashPageTokens(kPrefixHashSeed, b));
    }
  }
  // Every distinct block (the unchanged one appears once per position) hashes differently.
  EXPECT_EQ(seen.size(), 16u * 2000u - 15u);
}

TEST(PrefixHashTest, ChainDiffersWhenAnEarlierBlockDiffers) {
  const std::vector<int32_t> a1 = Iota(16, 0), b1 = Iota(16, 1), second = Iota(16, 500);
  const uint64_t a_first = HashPageTokens(kPrefixHashSeed, a1);
  const uint64_t b_first = HashPageTokens(kPrefixHashSeed, b1);
  EXPECT_NE(a_first, b_first);
  // Same second block, different first block: different chain hash.
  EXPECT_NE(HashPageTokens(a_first, second), HashPageTokens(b_first, second));
}

}  // namespace
}  // namespace estuary
