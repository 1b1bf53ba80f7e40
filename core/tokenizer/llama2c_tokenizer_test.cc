#include "core/tokenizer/llama2c_tokenizer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer_test_util.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using testing_util::Concat;
using testing_util::ModelPath;
using testing_util::ReadGolden;

constexpr int32_t kStoriesVocab = 512;

std::unique_ptr<Tokenizer> LoadStories() {
  auto tokenizer = LoadLlama2cTokenizer(ModelPath("stories260K", "tokenizer.bin"), kStoriesVocab);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// Little-endian builder of tokenizer.bin contents.
struct BinWriter {
  std::string bytes;
  void Int(int32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); }
  void Float(float v) { bytes.append(reinterpret_cast<const char*>(&v), 4); }
  void Token(float score, const std::string& piece) {
    Float(score);
    Int(static_cast<int32_t>(piece.size()));
    bytes += piece;
  }
};

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(Llama2cTokenizer, EncodesEveryGoldenPrompt) {
  for (const char* model : {"stories260K", "stories12L"}) {
    auto tokenizer = LoadLlama2cTokenizer(ModelPath(model, "tokenizer.bin"), kStoriesVocab);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const auto cases = ReadGolden(model);
    ASSERT_GE(cases.size(), 6u) << model;
    for (const auto& golden : cases) {
      auto ids = (*tokenizer)->Encode(golden.prompt, /*add_bos=*/true);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, golden.prompt_ids) << model << ": " << golden.prompt;
    }
  }
}

TEST(Llama2cTokenizer, DecodesEveryGoldenCompletion) {
  for (const char* model : {"stories260K", "stories12L"}) {
    auto tokenizer = LoadLlama2cTokenizer(ModelPath(model, "tokenizer.bin"), kStoriesVocab);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    for (const auto& golden : ReadGolden(model)) {
      // Whole sequence: the prompt comes back (BOS strips the dummy-prefix space).
      EXPECT_EQ((*tokenizer)->Decode(Concat(golden.prompt_ids, golden.completion_ids)),
                golden.prompt + golden.completion_text);
      // Streaming, continuing after the prompt.
      IncrementalDetokenizer detokenizer(**tokenizer, golden.prompt_ids.back());
      std::string streamed;
      for (const int32_t id : golden.completion_ids) streamed += detokenizer.Push(id);
      streamed += detokenizer.Flush();
      EXPECT_EQ(streamed, golden.completion_text) << model << ": " << golden.prompt;
    }
  }
}

TEST(Llama2cTokenizer, SpecialIdsAndRules) {
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int32_t>{2});
  // Empty text: BOS only, no dummy prefix.
  EXPECT_EQ(*tokenizer->Encode("", true), std::vector<int32_t>{1});
  EXPECT_EQ(*tokenizer->Encode("", false), std::vector<int32_t>{});
  // Specials contribute nothing; unknown ids too.
  EXPECT_EQ(tokenizer->TokenBytes(-1, 0), "");
  EXPECT_EQ(tokenizer->TokenBytes(-1, 1), "");
  EXPECT_EQ(tokenizer->TokenBytes(-1, 2), "");
  EXPECT_EQ(tokenizer->TokenBytes(-1, 512), "");
  EXPECT_EQ(tokenizer->TokenBytes(-1, -5), "");
  // Byte fallback: id = byte + 3. The leading space is stripped only after BOS.
  EXPECT_EQ(tokenizer->TokenBytes(-1, 3 + 0xE2), "\xE2");
  EXPECT_EQ(tokenizer->TokenBytes(-1, 403), " Once");
  EXPECT_EQ(tokenizer->TokenBytes(1, 403), "Once");
  // Oversized text is refused.
  auto huge = tokenizer->Encode(std::string(kMaxEncodeTextBytes + 1, 'a'), true);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Llama2cTokenizer, StreamsByteFallbackCodePoints) {
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  // "☕" (E2 98 95) is not a piece: it encodes as three byte-fallback ids.
  auto ids = tokenizer->Encode("\xE2\x98\x95", false);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 4u);  // dummy prefix + 3 bytes
  EXPECT_EQ((*ids)[1], 3 + 0xE2);
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.Push((*ids)[0]), " ");
  EXPECT_EQ(detokenizer.Push((*ids)[1]), "");  // held back: half a code point
  EXPECT_EQ(detokenizer.Push((*ids)[2]), "");
  EXPECT_EQ(detokenizer.Push((*ids)[3]), "\xE2\x98\x95");
  EXPECT_EQ(detokenizer.Flush(), "");
}

TEST(Llama2cTokenizer, RoundTripsText) {
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string text :
       {"Hello world", "  two leading spaces", "tabs\tand\nnewlines\n", "Caf\xC3\xA9 \xE2\x98\x95",
        "emoji \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD!", "<s> is just text here", "x"}) {
    auto ids = tokenizer->Encode(text, true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(tokenizer->Decode(*ids), text);
  }
}

TEST(Llama2cTokenizer, InvalidUtf8IsEncodedAsBytes) {
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text("a\xFF\x80\x80\x80\x80z\0", 8);
  auto ids = tokenizer->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  std::string bytes;
  for (const int32_t id : *ids) bytes += tokenizer->TokenBytes(-1, id);
  EXPECT_EQ(bytes, " " + text);
}

// A minimal valid tokenizer.bin: <unk>, <s>, </s>, 256 byte pieces, then `extra` pieces.
std::string MinimalBin(int32_t max_len, const std::vector<std::pair<float, std::string>>& extra) {
  BinWriter w;
  w.Int(max_len);
  w.Token(0, "<unk>");
  w.Token(0, "\n<s>\n");
  w.Token(0, "\n</s>\n");
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    w.Token(0, piece);
  }
  for (const auto& [score, piece] : extra) w.Token(score, piece);
  return w.bytes;
}

TEST(Llama2cTokenizer, SyntheticVocabularyMergesByScore) {
  const std::string path = WriteTemp(
      "merge.bin", MinimalBin(8, {{-1, " "}, {-1, "a"}, {-1, "b"}, {-3, "ab"}, {-2, "ba"},
                                  {-4, "aba"}, {-1e10f, "bb"}, {std::nanf(""), "aa"}}));
  auto tokenizer = LoadLlama2cTokenizer(path, 267);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // ids: " "=259 a=260 b=261 ab=262 ba=263 aba=264 bb=265 aa=266
  // "aba": ba (-2) beats ab (-3): [ ][a][ba]; then nothing (a+ba = aba, -4) -> [ ][aba].
  EXPECT_EQ(*(*tokenizer)->Encode("aba", false), (std::vector<int32_t>{259, 264}));
  // Scores at or below -1e10, and NaN, never merge (llama2.c's strict comparison).
  EXPECT_EQ(*(*tokenizer)->Encode("bb", false), (std::vector<int32_t>{259, 261, 261}));
  EXPECT_EQ(*(*tokenizer)->Encode("aa", false), (std::vector<int32_t>{259, 260, 260}));
}

TEST(Llama2cTokenizer, NamedErrorsForBadFiles) {
  const std::string valid = MinimalBin(8, {});
  struct Case {
    const char* name;
    std::string contents;
    const char* expected;  // substring of the error
  };
  std::string negative_length = valid;
  std::string too_long = valid;
  {
    // Token 5's length field sits after 4 header bytes and 5 tokens.
    size_t offset = 4;
    for (int id = 0; id < 5; ++id) {
      int32_t length;
      std::memcpy(&length, valid.data() + offset + 4, 4);
      offset += 8 + length;
    }
    const int32_t minus_one = -1;
    const int32_t huge = 1 << 30;
    std::memcpy(&negative_length[offset + 4], &minus_one, 4);
    std::memcpy(&too_long[offset + 4], &huge, 4);
  }
  BinWriter huge_max;
  huge_max.Int(1 << 30);
  huge_max.bytes += std::string(156, '\0');
  std::vector<Case> cases = {
      {"empty.bin", "", "max_token_length"},
      {"header.bin", valid.substr(0, 4), "too short"},
      {"bytes.bin", valid.substr(0, valid.size() - 3), "token 258 bytes"},
      {"length.bin", valid.substr(0, valid.size() - 10), "token 258 length"},
      {"negative.bin", negative_length, "token 5 length -1"},
      {"toolong.bin", too_long, "token 5 length 1073741824"},
      {"hugemax.bin", huge_max.bytes, "max_token_length 1073741824"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteTemp(c.name, c.contents);
    const auto start = std::chrono::steady_clock::now();
    auto tokenizer = LoadLlama2cTokenizer(path, 259);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(tokenizer.ok()) << c.name;
    EXPECT_NE(tokenizer.status().message().find(path), std::string::npos)
        << tokenizer.status();
    EXPECT_NE(tokenizer.status().message().find(c.expected), std::string::npos)
        << c.name << ": " << tokenizer.status();
    EXPECT_LT(elapsed, std::chrono::milliseconds(100)) << c.name;
  }
  // A 160-byte file cannot claim 4M tokens; the vocab size itself is bounded.
  const std::string small = WriteTemp("small.bin", huge_max.bytes);
  EXPECT_FALSE(LoadLlama2cTokenizer(small, 4 << 20).ok());
  EXPECT_FALSE(LoadLlama2cTokenizer(small, (4 << 20) + 1).ok());
  EXPECT_FALSE(LoadLlama2cTokenizer(WriteTemp("ok.bin", valid), 100).ok());
  EXPECT_TRUE(LoadLlama2cTokenizer(WriteTemp("ok.bin", valid), 259).ok());
  auto missing = LoadLlama2cTokenizer(::testing::TempDir() + "/does-not-exist.bin", 512);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace estuary
