#include "core/tokenizer/tokenizer_json_export.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/tokenizer/hf_tokenizer.h"
#include "core/tokenizer/llama2c_tokenizer.h"
#include "core/tokenizer/tokenizer_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

using testing_util::Concat;
using testing_util::ModelPath;
using testing_util::ReadGolden;

struct Pair {
  std::unique_ptr<Tokenizer> llama2c;
  std::unique_ptr<Tokenizer> hf;
};

Pair LoadBoth(const std::string& path, int32_t vocab_size) {
  Pair pair;
  auto llama2c = LoadLlama2cTokenizer(path, vocab_size);
  EXPECT_TRUE(llama2c.ok()) << llama2c.status();
  auto json = ExportLlama2cTokenizerJson(path, vocab_size);
  EXPECT_TRUE(json.ok()) << json.status();
  if (!llama2c.ok() || !json.ok()) return pair;
  auto hf = ParseHfTokenizerJson(*json);
  EXPECT_TRUE(hf.ok()) << hf.status();
  if (!hf.ok()) return pair;
  pair.llama2c = std::move(llama2c).value();
  pair.hf = std::move(hf).value();
  return pair;
}

TEST(ExportLlama2cTokenizerJson, WritesTheLlama2Layout) {
  auto json = ExportLlama2cTokenizerJson(ModelPath("stories260K", "tokenizer.bin"), 512);
  ASSERT_TRUE(json.ok()) << json.status();
  const nlohmann::json root = nlohmann::json::parse(*json);
  EXPECT_EQ(root["model"]["vocab"].size(), 512u);
  EXPECT_EQ(root["model"]["vocab"]["<s>"], 1);
  EXPECT_EQ(root["model"]["vocab"]["<0x0A>"], 3 + 10);
  EXPECT_EQ(root["model"]["vocab"]["\xE2\x96\x81t"], 259);  // " t"
  EXPECT_EQ(root["added_tokens"].size(), 3u);
  EXPECT_EQ(root["post_processor"]["special_tokens"]["<s>"]["ids"][0], 1);
  EXPECT_EQ(root["decoder"]["decoders"].size(), 4u);
  // The best-scored piece " t" (259) comes first; " the" (-6) has two splits, by left id.
  const auto& merges = root["model"]["merges"];
  ASSERT_GE(merges.size(), 10u);
  EXPECT_EQ(merges[0], "\xE2\x96\x81 t");
  std::vector<std::string> the_splits;
  for (const auto& m : merges) {
    const std::string s = m.get<std::string>();
    const std::string joined = s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1);
    if (joined == "\xE2\x96\x81the") the_splits.push_back(s);
  }
  EXPECT_EQ(the_splits, (std::vector<std::string>{"\xE2\x96\x81t he", "\xE2\x96\x81th e"}));
}

TEST(ExportLlama2cTokenizerJson, EncodesAndDecodesTheGoldenCasesLikeLlama2c) {
  for (const char* model : {"stories260K", "stories12L"}) {
    Pair pair = LoadBoth(ModelPath(model, "tokenizer.bin"), 512);
    ASSERT_NE(pair.hf, nullptr);
    EXPECT_EQ(pair.hf->vocab_size(), 512);
    EXPECT_EQ(pair.hf->bos_id(), 1);
    EXPECT_EQ(pair.hf->eos_ids(), std::vector<int32_t>{2});
    for (const auto& golden : ReadGolden(model)) {
      SCOPED_TRACE(golden.prompt);
      EXPECT_EQ(*pair.hf->Encode(golden.prompt, true), golden.prompt_ids);
      EXPECT_EQ(*pair.llama2c->Encode(golden.prompt, true), golden.prompt_ids);
      const std::vector<int32_t> all = Concat(golden.prompt_ids, golden.completion_ids);
      EXPECT_EQ(pair.hf->Decode(all), pair.llama2c->Decode(all));
      EXPECT_EQ(pair.hf->Decode(all), golden.prompt + golden.completion_text);
      IncrementalDetokenizer hf(*pair.hf, golden.prompt_ids.back());
      IncrementalDetokenizer llama2c(*pair.llama2c, golden.prompt_ids.back());
      for (const int32_t id : golden.completion_ids) EXPECT_EQ(hf.Push(id), llama2c.Push(id));
      EXPECT_EQ(hf.Flush(), llama2c.Flush());
    }
  }
}

TEST(ExportLlama2cTokenizerJson, EncodesRandomTextLikeLlama2c) {
  // Random text built from pieces of the vocabulary, spaces, punctuation and code points that
  // need byte fallback; in particular the pieces whose merges tie (" the", " her", "ked", ...).
  Pair pair = LoadBoth(ModelPath("stories260K", "tokenizer.bin"), 512);
  ASSERT_NE(pair.hf, nullptr);
  std::vector<std::string> atoms = {" ", "  ", "\n", ".", ",", "\"", "'", "!", "?", "-",
                                    "\xC3\xA9", "\xE2\x98\x95", "\xF0\x9F\x91\x8B", "1", "0",
                                    " the", " her", "her", "ver", "ked", "end", "ent", " had",
                                    "ved", "out", " st", " on", " he", "there", "other"};
  for (int32_t id = 259; id < 512; ++id) {
    std::string piece = pair.llama2c->TokenBytes(-1, id);
    if (!piece.empty()) atoms.push_back(piece);
  }
  std::mt19937 rng(1234);
  int compared = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    auto expected = pair.llama2c->Encode(text, true);
    auto got = pair.hf->Encode(text, true);
    ASSERT_TRUE(expected.ok() && got.ok());
    EXPECT_EQ(*got, *expected) << "text: \"" << text << "\"";
    EXPECT_EQ(pair.hf->Decode(*got), text);
    ++compared;
  }
  EXPECT_EQ(compared, 3000);
}

// Writes a llama2.c tokenizer.bin with <unk>, <s>, </s>, the byte fallbacks, then `extra`.
std::string WriteBin(const std::string& name,
                     const std::vector<std::pair<float, std::string>>& extra) {
  std::string bytes;
  auto put_int = [&](int32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
  auto put_token = [&](float score, const std::string& piece) {
    bytes.append(reinterpret_cast<const char*>(&score), 4);
    put_int(static_cast<int32_t>(piece.size()));
    bytes += piece;
  };
  put_int(16);
  put_token(0, "<unk>");
  put_token(0, "\n<s>\n");
  put_token(0, "\n</s>\n");
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    put_token(0, piece);
  }
  for (const auto& [score, piece] : extra) put_token(score, piece);
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(ExportLlama2cTokenizerJson, TiesBetweenDifferentPieces) {
  // ids: " "=259 a=260 b=261 ab=262 ba=263 aba=264; "ab" and "ba" share a score.
  const std::string path = WriteBin(
      "ties.bin", {{-1, " "}, {-1, "a"}, {-1, "b"}, {-5, "ab"}, {-5, "ba"}, {-6, "aba"}});
  Pair pair = LoadBoth(path, 265);
  ASSERT_NE(pair.hf, nullptr);
  // Non-overlapping or left-first ties agree.
  for (const std::string text : {"aba", "ab ba", "abab", "a b"}) {
    EXPECT_EQ(*pair.hf->Encode(text, false), *pair.llama2c->Encode(text, false)) << text;
  }
  // The documented limit: in "bab" the tied candidates "ba" (left) and "ab" (right) overlap.
  // llama2.c merges the leftmost; BPE the lower rank, and "ab" (lower id) ranks first.
  EXPECT_EQ(*pair.llama2c->Encode("bab", false), (std::vector<int32_t>{259, 263, 261}));
  EXPECT_EQ(*pair.hf->Encode("bab", false), (std::vector<int32_t>{259, 261, 262}));
}

TEST(ExportLlama2cTokenizerJson, TiesBetweenSplitsOfOnePiece) {
  // "abc" (-9) splits as a+bc and ab+c, with the same score; a sequence only ever offers one of
  // them at a place, so the order between them does not matter.
  const std::string path = WriteBin(
      "splits.bin", {{-1, " "}, {-1, "a"}, {-1, "b"}, {-1, "c"}, {-2, "ab"}, {-3, "bc"},
                     {-9, "abc"}, {-1e10f, "ca"}, {std::nanf(""), "cc"}});
  Pair pair = LoadBoth(path, 268);
  ASSERT_NE(pair.hf, nullptr);
  for (const std::string text : {"abc", "bc", "abcabc", "cabc", "cca", "aabcc", "ab c"}) {
    EXPECT_EQ(*pair.hf->Encode(text, false), *pair.llama2c->Encode(text, false)) << text;
  }
}

TEST(ExportLlama2cTokenizerJson, RejectsWhatTokenizerJsonCannotHold) {
  auto not_utf8 = ExportLlama2cTokenizerJson(WriteBin("bad_utf8.bin", {{-1, "\xFF"}}), 260);
  ASSERT_FALSE(not_utf8.ok());
  EXPECT_NE(not_utf8.status().message().find("token 259 is not valid UTF-8"), std::string::npos)
      << not_utf8.status();
  auto duplicate = ExportLlama2cTokenizerJson(WriteBin("dup.bin", {{-1, "x"}, {-2, "x"}}), 261);
  ASSERT_FALSE(duplicate.ok());
  EXPECT_NE(duplicate.status().message().find("token 260 duplicates token 259"),
            std::string::npos)
      << duplicate.status();
  auto metaspace =
      ExportLlama2cTokenizerJson(WriteBin("meta.bin", {{-1, "\xE2\x96\x81"}}), 260);
  EXPECT_FALSE(metaspace.ok());
  EXPECT_FALSE(ExportLlama2cTokenizerJson("/nonexistent/tokenizer.bin", 512).ok());
}

}  // namespace
}  // namespace estuary
