// Tests of Tokenizer::Decode, IncrementalDetokenizer and SanitizeUtf8, on a fake tokenizer whose
// tokens are arbitrary byte strings.

#include "core/tokenizer/tokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace estuary {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

class FakeTokenizer final : public Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const override { return -1; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const override {
    return absl::UnimplementedError("fake");
  }
  std::string TokenBytes(int32_t, int32_t id) const override {
    return id >= 0 && id < vocab_size() ? tokens_[id] : std::string();
  }

 private:
  std::vector<std::string> tokens_;
};

TEST(SanitizeUtf8, KeepsValidText) {
  const std::string text = "plain ASCII, caf\xC3\xA9, \xE2\x98\x95, \xF0\x9F\x91\x8B";
  EXPECT_EQ(SanitizeUtf8(text), text);
  EXPECT_EQ(SanitizeUtf8(""), "");
  EXPECT_EQ(SanitizeUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(SanitizeUtf8, ReplacesMaximalSubparts) {
  // One U+FFFD per maximal subpart, as Python's and WHATWG's decoders do.
  EXPECT_EQ(SanitizeUtf8("\x80"), kFffd);                                // lone continuation
  EXPECT_EQ(SanitizeUtf8("a\xE2\x82"), "a" + kFffd);                     // truncated at end
  EXPECT_EQ(SanitizeUtf8("\xE2\x82" "A"), kFffd + "A");                  // cut by ASCII
  EXPECT_EQ(SanitizeUtf8("\xC0\x80"), kFffd + kFffd);                    // overlong
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);        // surrogate
  EXPECT_EQ(SanitizeUtf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x91"), kFffd);                        // 3 of 4 bytes
  EXPECT_EQ(SanitizeUtf8("\xFF" "b"), kFffd + "b");
}

TEST(Decode, SanitizesTheWholeSequence) {
  FakeTokenizer tokenizer({"he", "llo", "\xE2", "\x82", "\xAC", "\xFF"});
  EXPECT_EQ(tokenizer.Decode({0, 1}), "hello");
  EXPECT_EQ(tokenizer.Decode({2, 3, 4}), "\xE2\x82\xAC");
  EXPECT_EQ(tokenizer.Decode({2, 0}), kFffd + "he");
  EXPECT_EQ(tokenizer.Decode({5, 99, -1}), kFffd);  // unknown ids contribute nothing
}

TEST(IncrementalDetokenizer, HoldsBackAnIncompleteCodePoint) {
  // "€" is E2 82 AC; each byte is its own token, as byte-fallback tokens are.
  FakeTokenizer tokenizer({"a", "\xE2", "\x82", "\xAC", "b"});
  IncrementalDetokenizer detokenizer(tokenizer);
  EXPECT_EQ(detokenizer.Push(0), "a");
  EXPECT_EQ(detokenizer.Push(1), "");
  EXPECT_EQ(detokenizer.Push(2), "");
  EXPECT_EQ(detokenizer.Push(3), "\xE2\x82\xAC");
  EXPECT_EQ(detokenizer.Push(4), "b");
  EXPECT_EQ(detokenizer.Flush(), "");
}

TEST(IncrementalDetokenizer, FlushReplacesLeftovers) {
  FakeTokenizer tokenizer({"a", "\xE2", "\x82"});
  IncrementalDetokenizer detokenizer(tokenizer);
  EXPECT_EQ(detokenizer.Push(0), "a");
  EXPECT_EQ(detokenizer.Push(1), "");
  EXPECT_EQ(detokenizer.Push(2), "");
  EXPECT_EQ(detokenizer.Flush(), kFffd);
  EXPECT_EQ(detokenizer.Flush(), "");
}

TEST(IncrementalDetokenizer, EmitsInvalidBytesAtOnce) {
  FakeTokenizer tokenizer({"\xE2", "x", "\x80"});
  IncrementalDetokenizer detokenizer(tokenizer);
  EXPECT_EQ(detokenizer.Push(0), "");
  EXPECT_EQ(detokenizer.Push(1), kFffd + "x");  // the cut sequence can no longer complete
  EXPECT_EQ(detokenizer.Push(2), kFffd);        // a lone continuation byte never becomes valid
}

TEST(IncrementalDetokenizer, MatchesDecodeOnRandomByteTokens) {
  // Tokens are random fragments of valid and invalid UTF-8.
  std::vector<std::string> tokens = {"a",    "\xC3", "\xA9", "\xE2", "\x82", "\xAC", "\xF0",
                                     "\x9F", "\x91", "\x8B", "\xFF", "\xED", "\xA0", " ",
                                     "\xC3\xA9", "\xE2\x82", "\x82\xAC"};
  FakeTokenizer tokenizer(tokens);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> ids(rng() % 12);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % tokens.size());
    IncrementalDetokenizer detokenizer(tokenizer);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = detokenizer.Push(id);
      EXPECT_EQ(SanitizeUtf8(piece), piece);  // every emitted piece is whole, valid UTF-8
      streamed += piece;
    }
    streamed += detokenizer.Flush();
    EXPECT_EQ(streamed, tokenizer.Decode(ids));
  }
}

}  // namespace
}  // namespace estuary
