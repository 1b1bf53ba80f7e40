#include "core/tokenizer/hf_tokenizer.h"

#include <chrono>
#include <string>
#include <vector>

#include "core/tokenizer/added_token_matcher.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/patterns.h"
#include "core/tokenizer/pcre2_regex.h"
#include "core/tokenizer/tokenizer_json_export.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

using Json = nlohmann::json;

const std::string kSpace = "\xE2\x96\x81";  // "▁"

std::vector<std::string> Split(absl::string_view pattern, std::string_view text) {
  auto regex = Pcre2Regex::Compile(pattern, /*literal=*/false);
  EXPECT_TRUE(regex.ok()) << regex.status();
  std::vector<std::string_view> views;
  EXPECT_TRUE((*regex)->SplitIsolated(text, &views).ok());
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(Pcre2Regex, SplitsLikeLlama3) {
  // The split verified against llama3-tokenizer-js (ecosystem.md 2.4).
  const std::vector<std::string> expected = {
      "Hello", " world", "!", "  \n\n", " ", " multiple", "  ", " spaces",
      " ", "\xC2\xBD", " ", "\xE2\x85\xAB", " ", "123", "45"};
  EXPECT_EQ(Split(kLlama3SplitPattern,
                  "Hello world!  \n\n  multiple   spaces \xC2\xBD \xE2\x85\xAB 12345"),
            expected);
  EXPECT_EQ(Split(kLlama3SplitPattern, "I'm DON'T 'll"),
            (std::vector<std::string>{"I", "'m", " DON", "'T", " '", "ll"}));
}

TEST(Pcre2Regex, HandlesEmptyMatchesAndInvalidUtf8) {
  EXPECT_EQ(Split("x*", "abxxc"), (std::vector<std::string>{"ab", "xx", "c"}));
  EXPECT_EQ(Split(kLlama3SplitPattern, "a\xFF\xFE b"),
            (std::vector<std::string>{"a", "\xFF\xFE", " b"}));
  EXPECT_FALSE(Pcre2Regex::Compile("(", false).ok());
  auto literal = Pcre2Regex::Compile("(", /*literal=*/true);
  ASSERT_TRUE(literal.ok());
  std::vector<std::string_view> views;
  ASSERT_TRUE((*literal)->SplitIsolated("a(b", &views).ok());
  EXPECT_EQ(views, (std::vector<std::string_view>{"a", "(", "b"}));
}

TEST(AddedTokenMatcher, LongestMatchLeftToRight) {
  AddedTokenMatcher matcher;
  matcher.Add("ab", 1);
  matcher.Add("abc", 2);
  matcher.Add("b", 3);
  const auto segments = matcher.Split("xabcab bc");
  std::vector<std::pair<std::string, int32_t>> got;
  for (const auto& s : segments) got.emplace_back(std::string(s.text), s.id);
  EXPECT_EQ(got, (std::vector<std::pair<std::string, int32_t>>{
                     {"x", -1}, {"abc", 2}, {"ab", 1}, {" ", -1}, {"b", 3}, {"c", -1}}));
}

// A small Llama-3-style byte-level tokenizer.json: 256 byte tokens (id = byte), merges for a
// few words, special and non-special added tokens.
std::string ByteLevelJson(bool ignore_merges = false) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<unsigned char>(b))] = b;
  Json merges = Json::array();
  int next = 256;
  auto merge = [&](const std::string& a, const std::string& b) {
    const std::string left = ByteLevelEncode(a), right = ByteLevelEncode(b);
    vocab[left + right] = next++;
    merges.push_back(left + " " + right);
  };
  merge(" ", "w");            // 256
  merge("o", "r");            // 257
  merge(" w", "or");          // 258
  merge("l", "d");            // 259
  merge(" wor", "ld");        // 260
  merge("H", "e");            // 261
  merge("l", "l");            // 262
  merge("He", "ll");          // 263
  merge("Hell", "o");         // 264
  merge("\xF0", "\x9F");      // 265
  merge("\x91", "\x8B");      // 266
  merge("\xF0\x9F", "\x91\x8B");  // 267 "👋"
  merge("\xC3", "\xA9");      // 268 "é"
  Json root = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", 301}, {"content", "<|end_of_text|>"}, {"special", true}},
        {{"id", 302}, {"content", "<|eot_id|>"}, {"special", true}},
        {{"id", 303}, {"content", "<tool>"}, {"special", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", std::string(kLlama3SplitPattern)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<|begin_of_text|>",
           {{"id", "<|begin_of_text|>"}, {"ids", Json::array({300})},
            {"tokens", Json::array({"<|begin_of_text|>"})}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        {"merges", merges}}}};
  return root.dump();
}

std::unique_ptr<Tokenizer> Parse(const std::string& json) {
  auto tokenizer = ParseHfTokenizerJson(json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

TEST(HfByteLevel, EncodesWithMergesAndSpecialTokens) {
  auto tokenizer = Parse(ByteLevelJson());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 304);
  EXPECT_EQ(tokenizer->bos_id(), 300);
  EXPECT_EQ(tokenizer->eos_ids(), (std::vector<int32_t>{301, 302}));
  EXPECT_EQ(*tokenizer->Encode("Hello world", false), (std::vector<int32_t>{264, 260}));
  EXPECT_EQ(*tokenizer->Encode("Hello world", true), (std::vector<int32_t>{300, 264, 260}));
  // No dummy prefix: "world" alone is w + or + ld.
  EXPECT_EQ(*tokenizer->Encode("world", false), (std::vector<int32_t>{'w', 257, 259}));
  EXPECT_EQ(*tokenizer->Encode("\xF0\x9F\x91\x8B", false), (std::vector<int32_t>{267}));
  // Special tokens in the text are matched first and never split.
  EXPECT_EQ(*tokenizer->Encode("<|begin_of_text|>Hello<|eot_id|><tool>", false),
            (std::vector<int32_t>{300, 264, 302, 303}));
  EXPECT_EQ(*tokenizer->Encode("", true), (std::vector<int32_t>{300}));
  auto huge = tokenizer->Encode(std::string(kMaxEncodeTextBytes + 1, 'a'), true);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfByteLevel, RoundTrips) {
  auto tokenizer = Parse(ByteLevelJson());
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string text :
       {"Hello world!", "na\xC3\xAFve caf\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
        "\xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD wave", "\t\n  spaces  \r\n", "x<tool>y", "12345678",
        "it's DON'T"}) {
    auto ids = tokenizer->Encode(text, true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(tokenizer->Decode(*ids), text);
  }
  // Special tokens decode to nothing; the ordinary added token to its content.
  EXPECT_EQ(tokenizer->Decode(*tokenizer->Encode("<|begin_of_text|>Hi<|eot_id|>", false)), "Hi");
}

TEST(HfByteLevel, StreamsSplitCodePoints) {
  auto tokenizer = Parse(ByteLevelJson());
  ASSERT_NE(tokenizer, nullptr);
  // "👋🏽": the modifier F0 9F 8F BD has no merges, so its bytes come one token each.
  auto ids = tokenizer->Encode("\xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{267, 265, 0x8F, 0xBD}));
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.Push(267), "\xF0\x9F\x91\x8B");
  EXPECT_EQ(detokenizer.Push(265), "");
  EXPECT_EQ(detokenizer.Push(0x8F), "");
  EXPECT_EQ(detokenizer.Push(0xBD), "\xF0\x9F\x8F\xBD");
  EXPECT_EQ(detokenizer.Flush(), "");
}

TEST(HfByteLevel, PreTokenizesBeforeMerging) {
  // With one vocab entry per piece and ignore_merges, every Llama 3 piece is one token.
  const std::vector<std::string> pieces = {
      "Hello", " world", "!", "  \n\n", " ", " multiple", "  ", " spaces",
      " ", "\xC2\xBD", " ", "\xE2\x85\xAB", " ", "123", "45"};
  Json root = Json::parse(ByteLevelJson(/*ignore_merges=*/true));
  Json& vocab = root["model"]["vocab"];
  std::vector<int32_t> expected;
  for (const std::string& piece : pieces) {
    const std::string key = ByteLevelEncode(piece);
    if (!vocab.contains(key)) vocab[key] = 400 + static_cast<int>(vocab.size());
    expected.push_back(vocab[key].get<int32_t>());
  }
  auto tokenizer = Parse(root.dump());
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "Hello world!  \n\n  multiple   spaces \xC2\xBD \xE2\x85\xAB 12345";
  EXPECT_EQ(*tokenizer->Encode(text, false), expected);
  EXPECT_EQ(tokenizer->Decode(expected), text);
}

// A tiny SentencePiece-style tokenizer.json; `legacy` uses the Metaspace pre-tokenizer and
// (after ByteFallback) decoder instead of the Prepend/Replace normalizer and the
// Replace/ByteFallback/Fuse/Strip decoder.
std::string SentencePieceJson(bool legacy) {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    vocab[piece] = 3 + b;
  }
  vocab[kSpace] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab[kSpace + "a"] = 262;
  vocab["ab"] = 263;
  vocab[kSpace + "ab"] = 264;
  Json merges = Json::array({Json::array({kSpace, "a"}), Json::array({"a", "b"}),
                             Json::array({kSpace + "a", "b"})});
  Json special = {{"single_word", false}, {"lstrip", false}, {"rstrip", false},
                  {"normalized", false}, {"special", true}};
  Json added = Json::array();
  for (const auto& [id, name] : std::vector<std::pair<int, const char*>>{
           {0, "<unk>"}, {1, "<s>"}, {2, "</s>"}}) {
    Json token = special;
    token["id"] = id;
    token["content"] = name;
    added.push_back(token);
  }
  Json root = {{"added_tokens", added},
               {"model",
                {{"type", "BPE"},
                 {"unk_token", "<unk>"},
                 {"fuse_unk", true},
                 {"byte_fallback", true},
                 {"vocab", vocab},
                 {"merges", merges}}}};
  if (legacy) {
    root["normalizer"] = nullptr;
    root["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSpace},
                             {"add_prefix_space", true}};
    root["decoder"] = {{"type", "Sequence"},
                       {"decoders",
                        {{{"type", "ByteFallback"}},
                         {{"type", "Fuse"}},
                         {{"type", "Metaspace"}, {"replacement", kSpace},
                          {"add_prefix_space", true}}}}};
  } else {
    root["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", kSpace}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}};
    root["decoder"] = {
        {"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  }
  return root.dump();
}

TEST(HfSentencePiece, EncodesAndDecodesBothLayouts) {
  for (const bool legacy : {false, true}) {
    SCOPED_TRACE(legacy ? "Metaspace" : "Prepend/Replace");
    auto tokenizer = Parse(SentencePieceJson(legacy));
    ASSERT_NE(tokenizer, nullptr);
    EXPECT_EQ(tokenizer->bos_id(), 1);  // no TemplateProcessing: the added token "<s>"
    EXPECT_EQ(tokenizer->eos_ids(), std::vector<int32_t>{2});
    EXPECT_EQ(*tokenizer->Encode("ab ab", true), (std::vector<int32_t>{1, 264, 264}));
    EXPECT_EQ(*tokenizer->Encode("ba", false), (std::vector<int32_t>{259, 261, 260}));
    // "é" is not a piece: byte fallback.
    EXPECT_EQ(*tokenizer->Encode("\xC3\xA9", false),
              (std::vector<int32_t>{259, 3 + 0xC3, 3 + 0xA9}));
    for (const std::string text : {"ab ab", "b a  b", "caf\xC3\xA9 \xF0\x9F\x91\x8B"}) {
      EXPECT_EQ(tokenizer->Decode(*tokenizer->Encode(text, true)), text);
    }
    // The leading space is stripped at the start of a text and after BOS only.
    EXPECT_EQ(tokenizer->TokenBytes(-1, 264), "ab");
    EXPECT_EQ(tokenizer->TokenBytes(1, 264), "ab");
    EXPECT_EQ(tokenizer->TokenBytes(260, 264), " ab");
    // Specials are matched in text and contribute nothing.
    EXPECT_EQ(*tokenizer->Encode("a</s>", false), (std::vector<int32_t>{262, 2}));
    EXPECT_EQ(tokenizer->TokenBytes(-1, 2), "");
  }
}

TEST(HfSentencePiece, UnknownCharactersFuse) {
  Json root = Json::parse(SentencePieceJson(false));
  root["model"]["byte_fallback"] = false;
  auto tokenizer = Parse(root.dump());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(*tokenizer->Encode("a\xC3\xA9\xC3\xA9", false), (std::vector<int32_t>{262, 0}));
  root["model"]["fuse_unk"] = false;
  tokenizer = Parse(root.dump());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(*tokenizer->Encode("a\xC3\xA9\xC3\xA9", false), (std::vector<int32_t>{262, 0, 0}));
}

TEST(HfTokenizer, OptionsOverrideSpecialIds) {
  HfTokenizerOptions options;
  options.bos_id = -1;
  options.eos_ids = std::vector<int32_t>{7, 8};
  auto tokenizer = ParseHfTokenizerJson(SentencePieceJson(false), options);
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ((*tokenizer)->bos_id(), -1);
  EXPECT_EQ((*tokenizer)->eos_ids(), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(*(*tokenizer)->Encode("a", true), (std::vector<int32_t>{262}));
}

TEST(MakeByteLevelTokenizerJson, ParsesAndRoundTrips) {
  const std::string json = MakeByteLevelTokenizerJson(512, 300, 301);
  ASSERT_FALSE(json.empty());
  auto tokenizer = Parse(json);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 302);
  EXPECT_EQ(tokenizer->bos_id(), 300);
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int32_t>{301});
  // "the" is t + he (merge 257); " the" is a whole token (258, ignore_merges).
  auto ids = tokenizer->Encode("the the", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{300, 't', 257, 258}));
  for (const std::string text : {"Hello, world!", "caf\xC3\xA9 \xF0\x9F\x91\x8B", " \n\t"}) {
    EXPECT_EQ(tokenizer->Decode(*tokenizer->Encode(text, true)), text);
  }
  // Merges are dropped when their ids would not fit.
  auto small = Parse(MakeByteLevelTokenizerJson(258, 256, 257));
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->vocab_size(), 258);
  EXPECT_EQ(*small->Encode("the", false), (std::vector<int32_t>{'t', 'h', 'e'}));
  // Bad arguments give an empty string, which does not parse.
  EXPECT_EQ(MakeByteLevelTokenizerJson(300, 300, 256), "");
  EXPECT_EQ(MakeByteLevelTokenizerJson(300, 100, 256), "");
  EXPECT_EQ(MakeByteLevelTokenizerJson(300, 256, 256), "");
  EXPECT_FALSE(ParseHfTokenizerJson("").ok());
}

TEST(HfTokenizer, HostileRegexFailsFast) {
  Json root = Json::parse(ByteLevelJson());
  root["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"Regex", "(a|aa)+(a|aa)+$"}}},
                           {"behavior", "Isolated"}};
  auto tokenizer = Parse(root.dump());
  ASSERT_NE(tokenizer, nullptr);
  const auto start = std::chrono::steady_clock::now();
  auto ids = tokenizer->Encode(std::string(64, 'a') + "!", false);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  if (!ids.ok()) {
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kResourceExhausted) << ids.status();
  }
}

struct BadJson {
  std::string json;
  std::string expected;  // substring of the error message
};

std::string WithModel(const std::string& model_body, const std::string& rest = "") {
  return "{" + rest + "\"model\": {" + model_body + "}}";
}

const char kVocab[] = R"("vocab": {"a": 0, "b": 1, "ab": 2})";

TEST(HfTokenizer, MalformedFilesGiveNamedErrors) {
  const std::string ok_model = std::string(kVocab) + R"(, "merges": ["a b"])";
  const std::string ok_prefix = std::string(kVocab) + R"(, "merges": [])";
  const std::vector<BadJson> cases = {
      {"", "not valid JSON"},
      {"{", "not valid JSON"},
      {"{} trailing", "not valid JSON"},
      {"{\"model\": \"\xFF\"}", "not valid JSON"},
      {"[]", "(root): expected an object"},
      {"{}", "model: missing"},
      {R"({"model": 5})", "model: expected an object"},
      {WithModel(R"("type": "WordPiece", )" + ok_model), "model.type"},
      {WithModel(R"("type": 5, )" + ok_model), "model.type: expected a string"},
      {WithModel(R"("merges": [])"), "model.vocab: missing"},
      {WithModel(R"("vocab": [], "merges": [])"), "model.vocab: expected an object"},
      {WithModel(R"("vocab": {"a": "0"}, "merges": [])"), "model.vocab[\"a\"]: expected an integer"},
      {WithModel(R"("vocab": {"a": -1}, "merges": [])"), "model.vocab[\"a\"]: -1 is outside"},
      {WithModel(R"("vocab": {"a": 1.5}, "merges": [])"), "expected an integer"},
      {WithModel(R"("vocab": {"a": 99999999999}, "merges": [])"), "is outside"},
      {WithModel(R"("vocab": {"a": 0, "b": 0}, "merges": [])"), "id 0 is used by both"},
      {WithModel(kVocab), "model.merges: missing"},
      {WithModel(std::string(kVocab) + R"(, "merges": "a b")"), "model.merges: expected an array"},
      {WithModel(std::string(kVocab) + R"(, "merges": ["a b", "a c"])"),
       "model.merges[1]: the right token"},
      {WithModel(std::string(kVocab) + R"(, "merges": ["b a"])"),
       "model.merges[0]: the merged token"},
      {WithModel(std::string(kVocab) + R"(, "merges": ["a b c"])"), "model.merges[0]: expected"},
      {WithModel(std::string(kVocab) + R"(, "merges": ["ab"])"), "model.merges[0]: expected"},
      {WithModel(std::string(kVocab) + R"(, "merges": [["a"]])"),
       "model.merges[0]: expected 2 strings"},
      {WithModel(std::string(kVocab) + R"(, "merges": [[1, 2]])"),
       "model.merges[0][0]: expected a string"},
      {WithModel(std::string(kVocab) + R"(, "merges": [5])"),
       "model.merges[0]: expected a string or an array"},
      {WithModel(ok_model + R"(, "unk_token": "zzz")"), "model.unk_token"},
      {WithModel(ok_model + R"(, "unk_token": 3)"), "model.unk_token: expected a string"},
      {WithModel(ok_model + R"(, "byte_fallback": "yes")"), "model.byte_fallback: expected a boolean"},
      {WithModel(ok_model + R"(, "dropout": "x")"), "model.dropout"},
      {WithModel(ok_model + R"(, "continuing_subword_prefix": "##")"),
       "model.continuing_subword_prefix"},
      {WithModel(ok_model, R"("added_tokens": {}, )"), "added_tokens: expected an array"},
      {WithModel(ok_model, R"("added_tokens": [5], )"), "added_tokens[0]: expected an object"},
      {WithModel(ok_model, R"("added_tokens": [{"id": "x", "content": "y"}], )"),
       "added_tokens[0].id: expected an integer"},
      {WithModel(ok_model, R"("added_tokens": [{"id": 5}], )"), "added_tokens[0].content: missing"},
      {WithModel(ok_model, R"("added_tokens": [{"id": 5, "content": ""}], )"),
       "added_tokens[0].content: empty"},
      {WithModel(ok_model, R"("added_tokens": [{"id": 5, "content": "x", "special": "yes"}], )"),
       "added_tokens[0].special: expected a boolean"},
      {WithModel(ok_model,
                 R"("added_tokens": [{"id": 5, "content": "x"}, {"id": 5, "content": "y"}], )"),
       "added_tokens[1]: id 5 is already"},
      {WithModel(ok_model, R"("normalizer": {"type": "NFC"}, )"), "normalizer.type"},
      {WithModel(ok_model, R"("normalizer": {"kind": "NFC"}, )"), "normalizer.type: missing"},
      {WithModel(ok_model, R"("normalizer": [], )"), "normalizer: expected an object"},
      {WithModel(ok_model,
                 R"("normalizer": {"type": "Sequence", "normalizers": [{"type": "Replace",
                    "pattern": {"Regex": " "}, "content": "x"}]}, )"),
       "normalizer.normalizers[0].pattern"},
      {WithModel(ok_model, R"("normalizer": {"type": "Sequence", "normalizers": 3}, )"),
       "normalizer.normalizers: expected an array"},
      {WithModel(ok_model, R"("normalizer": {"type": "Prepend"}, )"),
       "normalizer.prepend: missing"},
      {WithModel(ok_model,
                 R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("},
                    "behavior": "Isolated"}, )"),
       "regex does not compile"},
      {WithModel(ok_model,
                 R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"},
                    "behavior": "Removed"}, )"),
       "pre_tokenizer.behavior"},
      {WithModel(ok_model,
                 R"("pre_tokenizer": {"type": "Split", "pattern": {"Glob": "a"},
                    "behavior": "Isolated"}, )"),
       "pre_tokenizer.pattern: expected"},
      {WithModel(ok_model, R"("pre_tokenizer": {"type": "Metaspace", "replacement": ""}, )"),
       "pre_tokenizer.replacement: expected a single character"},
      {WithModel(ok_model,
                 R"("pre_tokenizer": {"type": "Metaspace", "replacement": "_",
                    "prepend_scheme": "sometimes"}, )"),
       "pre_tokenizer.prepend_scheme"},
      {WithModel(ok_model, R"("pre_tokenizer": {"type": "Whitespace"}, )"),
       "pre_tokenizer.type"},
      {WithModel(ok_model,
                 R"("decoder": {"type": "Strip", "content": " ", "start": 1, "stop": 1}, )"),
       "decoder.stop"},
      {WithModel(ok_model,
                 R"("decoder": {"type": "Strip", "content": "ab", "start": 1, "stop": 0}, )"),
       "decoder.content: expected a single character"},
      {WithModel(ok_model, R"("decoder": {"type": "Strip", "content": " ", "start": -1,
                              "stop": 0}, )"),
       "decoder.start"},
      {WithModel(ok_model, R"("decoder": {"type": "WordPiece"}, )"), "decoder.type"},
      {WithModel(ok_model,
                 R"("post_processor": {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
                    "special_tokens": {}}, )"),
       "post_processor.special_tokens[\"<s>\"]: missing"},
      {WithModel(ok_model,
                 R"("post_processor": {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
                    "special_tokens": {"<s>": {"ids": [99]}}}, )"),
       "BOS id 99"},
      {WithModel(ok_model,
                 R"("post_processor": {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
                    "special_tokens": {"<s>": {"ids": "1"}}}, )"),
       "post_processor.special_tokens[\"<s>\"].ids: expected an array"},
      {WithModel(ok_model, R"("post_processor": {"type": "TemplateProcessing"}, )"),
       "post_processor.single: missing"},
      {std::string(100000, '['), "nesting deeper than 64"},
      {std::string(100000, '[') + std::string(100000, ']'), "nesting deeper than 64"},
      {WithModel("\"vocab\": {\"" + std::string(70000, 'x') + "\": 0}, \"merges\": []"),
       "exceeds the limit"},
      {std::string((64 << 20) + 1, ' '), "exceed the limit"},
  };
  for (const BadJson& c : cases) {
    auto tokenizer = ParseHfTokenizerJson(c.json);
    ASSERT_FALSE(tokenizer.ok()) << c.json.substr(0, 200);
    const std::string message(tokenizer.status().message());
    EXPECT_EQ(message.rfind("tokenizer.json: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "expected \"" << c.expected << "\" in: " << message;
  }
  // The baseline itself is fine.
  EXPECT_TRUE(ParseHfTokenizerJson(WithModel(ok_model)).ok());
  EXPECT_TRUE(ParseHfTokenizerJson(WithModel(ok_prefix)).ok());
}

TEST(HfTokenizer, FuzzSeedsLoad) {
  // The fuzzer's seeds (fuzz/corpus/tokenizer_json) are valid tokenizers, but for one.
  const std::string dir = std::string(ESTUARY_SOURCE_DIR) + "/fuzz/corpus/tokenizer_json/";
  const std::vector<std::pair<const char*, const char*>> seeds = {
      {"byte_level_llama3.json", "the ab"},
      {"byte_level_gpt2.json", " the ab"},  // add_prefix_space: the space stays when decoding
      {"sentencepiece_llama2.json", "the ab"},
      {"sentencepiece_metaspace.json", "the ab"},
      {"minimal.json", "ab"}};
  for (const auto& [name, decoded] : seeds) {
    auto tokenizer = LoadHfTokenizer(dir + name);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto ids = (*tokenizer)->Encode(std::string(decoded).substr(decoded[0] == ' '), true);
    ASSERT_TRUE(ids.ok()) << name;
    EXPECT_EQ((*tokenizer)->Decode(*ids), decoded) << name;
  }
  EXPECT_FALSE(LoadHfTokenizer(dir + "truncated.json").ok());
}

TEST(HfTokenizer, LoadNamesThePath) {
  auto missing = LoadHfTokenizer(::testing::TempDir() + "/nope/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace estuary
