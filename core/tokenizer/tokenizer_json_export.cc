#include "core/tokenizer/tokenizer_json_export.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/byte_fallback.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/llama2c_tokenizer.h"
#include "core/tokenizer/patterns.h"
#include "core/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr const char* kMetaspace = "\xE2\x96\x81";  // "▁" U+2581
constexpr float kMinMergeScore = -1e10f;            // llama2.c merges only above this

// A JSON string literal. `text` is valid UTF-8 here; the replace handler keeps dump() from
// throwing regardless.
std::string Quote(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Dump(const OrderedJson& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

OrderedJson AddedToken(int32_t id, const char* content) {
  return OrderedJson{{"id", id},           {"content", content}, {"single_word", false},
                     {"lstrip", false},    {"rstrip", false},    {"normalized", false},
                     {"special", true}};
}

OrderedJson BosTemplate(const char* bos, int32_t bos_id) {
  OrderedJson special_token = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  return OrderedJson{
      {"type", "TemplateProcessing"},
      {"single", {special_token, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {special_token,
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{bos,
         {{"id", bos},
          {"ids", OrderedJson::array({bos_id})},
          {"tokens", OrderedJson::array({bos})}}}}}};
}

struct MergeRule {
  float score;
  int32_t merged;
  int32_t left;
  int32_t right;
};

}  // namespace

absl::StatusOr<std::string> ExportLlama2cTokenizerJson(const std::string& path,
                                                       int32_t vocab_size) {
  ESTUARY_ASSIGN_OR_RETURN(Llama2cVocab vocab, ReadLlama2cVocab(path, vocab_size));
  const int32_t n = static_cast<int32_t>(vocab.pieces.size());

  // Vocabulary keys.
  std::vector<std::string> keys(n);
  keys[kLlama2cUnkId] = "<unk>";
  keys[kLlama2cBosId] = "<s>";
  keys[kLlama2cEosId] = "</s>";
  for (int32_t id = kLlama2cEosId + 1; id < n; ++id) {
    const std::string& piece = vocab.pieces[id];
    if (SanitizeUtf8(piece) != piece) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token ", id, " is not valid UTF-8; tokenizer.json cannot hold it"));
    }
    if (piece.find(kMetaspace) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token ", id, " contains U+2581, which tokenizer.json uses for spaces"));
    }
    for (const char c : piece) {
      if (c == ' ') {
        keys[id] += kMetaspace;
      } else {
        keys[id] += c;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t id = kLlama2cByteFallbackOffset + b;
    uint8_t byte = 0;
    if (!ParseByteFallbackPiece(vocab.pieces[id], &byte) || byte != b) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token ", id, " is not the byte-fallback piece ",
          ByteFallbackPiece(static_cast<uint8_t>(b))));
    }
  }
  absl::flat_hash_map<std::string, int32_t> key_ids;
  key_ids.reserve(n);
  for (int32_t id = 0; id < n; ++id) {
    const auto [it, inserted] = key_ids.emplace(keys[id], id);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", id, " duplicates token ",
                                                     it->second, " (", Quote(keys[id]), ")"));
    }
  }

  // Merges: every split of every mergeable piece into two pieces (ids >= 3).
  absl::flat_hash_map<std::string, int32_t> piece_ids;
  for (int32_t id = kLlama2cEosId + 1; id < n; ++id) piece_ids.emplace(vocab.pieces[id], id);
  std::vector<MergeRule> rules;
  for (int32_t id = kLlama2cEosId + 1; id < n; ++id) {
    const float score = vocab.scores[id];
    if (!std::isfinite(score) || !(score > kMinMergeScore)) continue;
    const std::string& piece = vocab.pieces[id];
    for (size_t split = 1; split < piece.size(); ++split) {
      const auto left = piece_ids.find(piece.substr(0, split));
      if (left == piece_ids.end()) continue;
      const auto right = piece_ids.find(piece.substr(split));
      if (right == piece_ids.end()) continue;
      rules.push_back(MergeRule{score, id, left->second, right->second});
    }
  }
  std::sort(rules.begin(), rules.end(), [](const MergeRule& a, const MergeRule& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.merged != b.merged) return a.merged < b.merged;
    if (a.left != b.left) return a.left < b.left;
    return a.right < b.right;
  });

  const OrderedJson normalizer = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", kMetaspace}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}}}}};
  const OrderedJson decoder = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};

  std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  absl::StrAppend(&out, "  \"added_tokens\": [\n    ", Dump(AddedToken(kLlama2cUnkId, "<unk>")),
                  ",\n    ", Dump(AddedToken(kLlama2cBosId, "<s>")), ",\n    ",
                  Dump(AddedToken(kLlama2cEosId, "</s>")), "\n  ],\n");
  absl::StrAppend(&out, "  \"normalizer\": ", Dump(normalizer), ",\n");
  absl::StrAppend(&out, "  \"pre_tokenizer\": null,\n");
  absl::StrAppend(&out, "  \"post_processor\": ", Dump(BosTemplate("<s>", kLlama2cBosId)), ",\n");
  absl::StrAppend(&out, "  \"decoder\": ", Dump(decoder), ",\n");
  absl::StrAppend(&out,
                  "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
                  "    \"unk_token\": \"<unk>\",\n    \"continuing_subword_prefix\": null,\n"
                  "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": true,\n"
                  "    \"byte_fallback\": true,\n    \"ignore_merges\": false,\n"
                  "    \"vocab\": {");
  for (int32_t id = 0; id < n; ++id) {
    absl::StrAppend(&out, id == 0 ? "\n      " : ",\n      ", Quote(keys[id]), ": ", id);
  }
  absl::StrAppend(&out, "\n    },\n    \"merges\": [");
  for (size_t i = 0; i < rules.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "\n      " : ",\n      ",
                    Quote(absl::StrCat(keys[rules[i].left], " ", keys[rules[i].right])));
  }
  absl::StrAppend(&out, rules.empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n");
  return out;
}

std::string MakeByteLevelTokenizerJson(int32_t vocab_size, int32_t bos_id, int32_t eos_id) {
  if (vocab_size > (4 << 20) || bos_id < 256 || eos_id < 256 || bos_id >= vocab_size ||
      eos_id >= vocab_size || bos_id == eos_id) {
    return std::string();
  }
  OrderedJson vocab = OrderedJson::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<unsigned char>(b))] = b;
  // A handful of merges, each only while its id fits; ids skip BOS and EOS.
  static constexpr std::pair<const char*, const char*> kMerges[] = {
      {"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "n"}, {"\xC4\xA0", "a"},
      {"e", "r"},        {"o", "n"}, {"\xC4\xA0", "s"},   {"r", "e"}, {"a", "t"}};
  OrderedJson merges = OrderedJson::array();
  int32_t next_id = 256;
  for (const auto& [left, right] : kMerges) {
    while (next_id == bos_id || next_id == eos_id) ++next_id;
    if (next_id >= vocab_size) break;
    if (!vocab.contains(left) || !vocab.contains(right)) continue;
    vocab[std::string(left) + right] = next_id++;
    merges.push_back(OrderedJson::array({left, right}));
  }
  const OrderedJson split = {{"type", "Split"},
                             {"pattern", {{"Regex", std::string(kLlama3SplitPattern)}}},
                             {"behavior", "Isolated"},
                             {"invert", false}};
  const OrderedJson byte_level = {{"type", "ByteLevel"},
                                  {"add_prefix_space", false},
                                  {"trim_offsets", true},
                                  {"use_regex", false}};
  const OrderedJson root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {AddedToken(bos_id, "<|begin_of_text|>"), AddedToken(eos_id, "<|end_of_text|>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
      {"post_processor", BosTemplate("<|begin_of_text|>", bos_id)},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", merges}}}};
  return root.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace estuary
