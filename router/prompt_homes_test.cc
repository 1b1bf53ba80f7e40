// PromptHomes: a recorded request's decode worker is found for the same prompt only, until its
// time runs out or newer entries push it out.
#include "router/prompt_homes.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace estuary::router {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(PromptHomesTest, FindsTheWorkerForTheSamePromptOnly) {
  PromptHomes homes(8, absl::Seconds(60));
  const std::vector<int32_t> prompt = {1, 5, 9};
  homes.Record("a", "decode-0", prompt, kStart);
  EXPECT_EQ(homes.Find("a", prompt, kStart).value_or(""), "decode-0");
  EXPECT_FALSE(homes.Find("a", std::vector<int32_t>{1, 5}, kStart).has_value());
  EXPECT_FALSE(homes.Find("b", prompt, kStart).has_value());
  homes.Record("a", "decode-1", prompt, kStart + absl::Seconds(1));  // a retry elsewhere
  EXPECT_EQ(homes.Find("a", prompt, kStart + absl::Seconds(2)).value_or(""), "decode-1");
}

TEST(PromptHomesTest, EntriesExpireAndTheTableIsBounded) {
  PromptHomes homes(2, absl::Seconds(10));
  const std::vector<int32_t> prompt = {1, 2};
  homes.Record("old", "d", prompt, kStart);
  EXPECT_FALSE(homes.Find("old", prompt, kStart + absl::Seconds(11)).has_value());
  for (int i = 0; i < 3; ++i) homes.Record(absl::StrCat("r", i), "d", prompt, kStart);
  EXPECT_FALSE(homes.Find("r0", prompt, kStart).has_value());  // pushed out
  EXPECT_TRUE(homes.Find("r1", prompt, kStart).has_value());
  EXPECT_TRUE(homes.Find("r2", prompt, kStart).has_value());
}

}  // namespace
}  // namespace estuary::router
