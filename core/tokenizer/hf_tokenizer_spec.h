#pragma once
// The parts of a tokenizer.json that Estuary's BPE implementation uses, after type checking
// (ParseHfTokenizerSpec) and before the cross-checks and tables of BuildHfTokenizer. Plain data.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace estuary {

// Limits for untrusted tokenizer.json files.
inline constexpr size_t kHfMaxJsonBytes = 64 << 20;
inline constexpr int kHfMaxJsonDepth = 64;
inline constexpr size_t kHfMaxVocabEntries = 4 << 20;  // model.vocab, and also the largest id
inline constexpr size_t kHfMaxMerges = 4 << 20;
inline constexpr size_t kHfMaxAddedTokens = 1 << 20;
inline constexpr size_t kHfMaxTokenBytes = 64 << 10;   // any token, pattern or replacement
inline constexpr size_t kHfMaxAddedTokenTotalBytes = 16 << 20;
inline constexpr size_t kHfMaxPipelineSteps = 64;      // normalizers, pre-tokenizers, decoders

// Metaspace "prepend_scheme" (legacy "add_prefix_space": true is kAlways, false is kNever).
enum class HfPrependScheme { kAlways, kFirst, kNever };

struct HfNormalizerStep {
  enum class Kind { kPrepend, kReplace };
  Kind kind = Kind::kPrepend;
  std::string pattern;  // kReplace: the literal string replaced
  std::string content;  // kPrepend: the prefix; kReplace: the replacement
};

struct HfPreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind = Kind::kSplit;
  // kSplit (behaviour "Isolated", not inverted).
  std::string pattern;
  bool pattern_is_regex = false;
  // kByteLevel.
  bool add_prefix_space = false;
  bool use_regex = true;
  // kMetaspace.
  std::string replacement;
  HfPrependScheme prepend_scheme = HfPrependScheme::kAlways;
  bool split = true;
};

struct HfDecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kByteLevel, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string pattern;  // kReplace: literal replaced; kMetaspace: the replacement character
  std::string content;  // kReplace: replacement; kStrip: the stripped character
  int32_t strip_start = 0;  // kStrip: how many leading `content` characters to strip
  HfPrependScheme prepend_scheme = HfPrependScheme::kAlways;  // kMetaspace
};

struct HfAddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
};

struct HfTokenizerSpec {
  // model (type BPE).
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::optional<std::string> unk_token;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;

  std::vector<HfNormalizerStep> normalizers;
  std::vector<HfPreTokenizerStep> pre_tokenizers;
  std::vector<HfDecoderStep> decoders;
  std::vector<HfAddedToken> added_tokens;

  // From post_processor: true when a TemplateProcessing was found; then `template_bos_id` is the
  // id of the special token that starts its "single" template, if any.
  bool has_template = false;
  std::optional<int32_t> template_bos_id;
};

// Parses and type-checks tokenizer.json text. Never throws; errors read
// "tokenizer.json: <field path>: <problem>".
absl::StatusOr<HfTokenizerSpec> ParseHfTokenizerSpec(absl::string_view json_text);

}  // namespace estuary
