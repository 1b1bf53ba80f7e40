// StopMatcher: matches across chunk boundaries, never releases part of a stop string, releases
// held-back text when it turns out not to be one, and picks the earliest of several.

#include "router/stop_matcher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace estuary::router {
namespace {

// Feeds `pieces` one at a time; returns (released text, stopped).
std::pair<std::string, bool> Feed(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) {
    StopMatcher::Result r = matcher.Push(piece);
    out += r.text;
    if (r.stopped) return {out, true};
  }
  out += matcher.Flush();
  return {out, false};
}

TEST(StopMatcherTest, NoStopStringsPassesEverythingAtOnce) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.Push("abc").text, "abc");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, MatchesAcrossChunkBoundaries) {
  StopMatcher matcher({"The End"});
  EXPECT_EQ(matcher.Push("and so. Th").text, "and so. ");  // "Th" may start the stop string
  EXPECT_EQ(matcher.Push("e E").text, "");
  StopMatcher::Result r = matcher.Push("nd!");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.Push("more").text, "");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, OneByteAtATime) {
  StopMatcher matcher({"<|end|>"});
  std::vector<std::string> bytes;
  for (char c : std::string("hello <|en <|end|> world")) bytes.push_back(std::string(1, c));
  const auto [text, stopped] = Feed(matcher, bytes);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "hello <|en ");
}

TEST(StopMatcherTest, ReleasesAFalseStartWhenItDiverges) {
  StopMatcher matcher({"stop"});
  EXPECT_EQ(matcher.Push("a st").text, "a ");
  EXPECT_EQ(matcher.Push("ar").text, "star");
  EXPECT_EQ(matcher.Push("t sto").text, "t ");
  EXPECT_EQ(matcher.Flush(), "sto");  // the end of the stream releases what was held
}

TEST(StopMatcherTest, TheEarliestOfSeveralStopStringsWins) {
  StopMatcher matcher({"world", "lo w"});
  const auto [text, stopped] = Feed(matcher, {"hel", "lo wor", "ld"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "hel");
}

// include_stop_str_in_output: the text ends with the stop string that matched (the longest of
// those matching at the earliest place), across chunk boundaries too.
TEST(StopMatcherTest, IncludingTheMatchEndsTheTextWithIt) {
  StopMatcher matcher({"The End", "The"}, /*include_match=*/true);
  const auto [text, stopped] = Feed(matcher, {"and so. Th", "e E", "nd! more"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "and so. The");  // "The" matched once "The" was there; "The End" not yet
  StopMatcher longest({"ab", "abc"}, /*include_match=*/true);
  StopMatcher::Result r = longest.Push("xxabcyy");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "xxabc");
}

TEST(StopMatcherTest, StopStringInsideOneChunk) {
  StopMatcher matcher({"\n\n"});
  StopMatcher::Result r = matcher.Push("line one\n\nline two");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "line one");
}

TEST(StopMatcherTest, MultiByteCharactersAreNeverSplit) {
  // "é" is C3 A9; the stop string starts with it, so a held-back suffix starts on it.
  StopMatcher matcher({"\xc3\xa9t\xc3\xa9"});
  EXPECT_EQ(matcher.Push("caf\xc3\xa9").text, "caf");
  EXPECT_EQ(matcher.Push(" \xc3\xa9t").text, "\xc3\xa9 ");
  StopMatcher::Result r = matcher.Push("\xc3\xa9!");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcherTest, OverlappingPrefixesHoldTheLongestCandidate) {
  StopMatcher matcher({"aab"});
  EXPECT_EQ(matcher.Push("xaa").text, "x");
  EXPECT_EQ(matcher.Push("a").text, "a");  // "aaa": only the last "aa" can still start "aab"
  StopMatcher::Result r = matcher.Push("b");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

}  // namespace
}  // namespace estuary::router
