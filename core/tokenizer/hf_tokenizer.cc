#include "core/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/added_token_matcher.h"
#include "core/tokenizer/bpe_merge.h"
#include "core/tokenizer/byte_fallback.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/hf_tokenizer_spec.h"
#include "core/tokenizer/patterns.h"
#include "core/tokenizer/pcre2_regex.h"
#include "core/tokenizer/utf8.h"

namespace estuary {
namespace {


constexpr std::array<absl::string_view, 2> kBosNames = {"<s>", "<|begin_of_text|>"};
constexpr std::array<absl::string_view, 6> kEosNames = {
    "</s>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|im_end|>"};

absl::Status Error(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

void ReplaceAll(std::string* text, absl::string_view from, absl::string_view to) {
  if (from.empty() || text->find(from.data(), 0, from.size()) == std::string::npos) return;
  std::string out;
  out.reserve(text->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text->find(from.data(), pos, from.size());
    if (hit == std::string::npos) break;
    out.append(*text, pos, hit - pos);
    out.append(to.data(), to.size());
    pos = hit + from.size();
  }
  out.append(*text, pos, std::string::npos);
  *text = std::move(out);
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

struct PreTokenizer {
  HfPreTokenizerStep step;
  std::unique_ptr<Pcre2Regex> regex;  // kSplit; kByteLevel with use_regex
};

// Built once by BuildHfTokenizer, immutable afterwards: Encode/TokenBytes only read the tables
// (and each regex call uses its own match data), so one instance serves many threads.
class HfTokenizer final : public Tokenizer {
 public:
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  std::string TokenBytes(int32_t prev_id, int32_t id) const override;

 private:
  friend absl::StatusOr<std::unique_ptr<Tokenizer>> BuildHfTokenizer(
      HfTokenizerSpec spec, const HfTokenizerOptions& options);

  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  // Encodes a segment of ordinary text (no added tokens); `first` when it starts the input.
  absl::Status EncodeText(std::string_view text, bool first, std::vector<int32_t>* ids) const;
  // BPE on one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;
  std::string_view Decoded(int32_t id) const {
    return std::string_view(decoded_).substr(decoded_offsets_[id],
                                             decoded_offsets_[id + 1] - decoded_offsets_[id]);
  }

  int32_t vocab_size_ = 0;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;

  absl::flat_hash_map<std::string, int32_t> vocab_;  // model token -> id
  absl::flat_hash_map<uint64_t, Merge> merges_;      // (left id, right id) -> merge
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // byte -> id of "<0xXX>", when byte_fallback
  bool byte_fallback_ = false;

  AddedTokenMatcher added_;
  std::vector<HfNormalizerStep> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;

  // Decoding: the bytes of id i are decoded_[decoded_offsets_[i], decoded_offsets_[i + 1]).
  std::string decoded_;
  std::vector<uint32_t> decoded_offsets_;
  std::string strip_content_;  // stripped from the start of a text ...
  int32_t strip_count_ = 0;    // ... at most this many times
};

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text,
                                                         bool add_bos) const {
  if (text.size() > kMaxEncodeTextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("text of ", text.size(),
                                                   " bytes is longer than the limit of ",
                                                   kMaxEncodeTextBytes));
  }
  std::vector<int32_t> ids;
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  if (added_.empty()) {
    ESTUARY_RETURN_IF_ERROR(EncodeText(text, /*first=*/true, &ids));
    return ids;
  }
  for (const AddedTokenMatcher::Segment& segment : added_.Split(text)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      ESTUARY_RETURN_IF_ERROR(
          EncodeText(segment.text, /*first=*/segment.text.data() == text.data(), &ids));
    }
  }
  return ids;
}

absl::Status HfTokenizer::EncodeText(std::string_view text, bool first,
                                     std::vector<int32_t>* ids) const {
  if (text.empty()) return absl::OkStatus();
  std::string normalized(text);
  for (const HfNormalizerStep& step : normalizers_) {
    if (step.kind == HfNormalizerStep::Kind::kPrepend) {
      if (!normalized.empty()) normalized = step.content + normalized;
    } else {
      ReplaceAll(&normalized, step.pattern, step.content);
    }
  }
  std::vector<std::string> words;
  words.push_back(std::move(normalized));
  std::vector<std::string_view> views;
  for (const PreTokenizer& pre : pre_tokenizers_) {
    const HfPreTokenizerStep& step = pre.step;
    std::vector<std::string> next;
    for (size_t w = 0; w < words.size(); ++w) {
      std::string word = std::move(words[w]);
      switch (step.kind) {
        case HfPreTokenizerStep::Kind::kSplit:
          views.clear();
          ESTUARY_RETURN_IF_ERROR(pre.regex->SplitIsolated(word, &views));
          for (const std::string_view view : views) next.emplace_back(view);
          break;
        case HfPreTokenizerStep::Kind::kByteLevel:
          if (step.add_prefix_space && !StartsWith(word, " ")) word = " " + word;
          if (pre.regex != nullptr) {
            views.clear();
            ESTUARY_RETURN_IF_ERROR(pre.regex->SplitIsolated(word, &views));
            for (const std::string_view view : views) next.push_back(ByteLevelEncode(view));
          } else {
            next.push_back(ByteLevelEncode(word));
          }
          break;
        case HfPreTokenizerStep::Kind::kMetaspace: {
          ReplaceAll(&word, " ", step.replacement);
          const bool prepend =
              step.prepend_scheme == HfPrependScheme::kAlways ||
              (step.prepend_scheme == HfPrependScheme::kFirst && first && w == 0);
          if (prepend && !StartsWith(word, step.replacement)) word = step.replacement + word;
          if (!step.split) {
            next.push_back(std::move(word));
            break;
          }
          // Split before every replacement character (Hugging Face "MergedWithNext").
          size_t begin = 0;
          while (begin < word.size()) {
            size_t end = word.find(step.replacement, begin + 1);
            if (end == std::string::npos) end = word.size();
            next.push_back(word.substr(begin, end - begin));
            begin = end;
          }
          break;
        }
      }
    }
    words = std::move(next);
  }
  for (const std::string& word : words) EncodeWord(word, ids);
  return absl::OkStatus();
}

void HfTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  const absl::string_view word_key(word.data(), word.size());
  if (ignore_merges_) {
    const auto it = vocab_.find(word_key);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = utf8::CharLength(word, pos);
    const absl::string_view character(word.data() + pos, length);
    pos += length;
    const auto it = vocab_.find(character);
    if (it != vocab_.end()) {
      symbols.push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (const char c : character) all_bytes &= byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (const char c : character) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_was_unk)) symbols.push_back(unk_id_);
      last_was_unk = true;
    }
    // Without an unknown token the character is dropped, as Hugging Face does.
  }
  ApplyMerges(&symbols, [this](int32_t left, int32_t right, MergeCandidate* out) {
    const auto it = merges_.find(PairKey(left, right));
    if (it == merges_.end()) return false;
    out->priority = it->second.rank;
    out->merged_id = it->second.merged_id;
    return true;
  });
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

std::string HfTokenizer::TokenBytes(int32_t prev_id, int32_t id) const {
  if (id < 0 || id >= vocab_size_) return std::string();
  std::string_view bytes = Decoded(id);
  if (strip_count_ > 0 && (prev_id == -1 || prev_id == bos_id_)) {
    for (int32_t i = 0; i < strip_count_ && StartsWith(bytes, strip_content_); ++i) {
      bytes.remove_prefix(strip_content_.size());
    }
  }
  return std::string(bytes);
}

// Applies the per-token decoder steps to a model token (Strip is applied by TokenBytes).
std::string DecodeModelToken(const std::vector<HfDecoderStep>& steps, std::string token) {
  for (const HfDecoderStep& step : steps) {
    switch (step.kind) {
      case HfDecoderStep::Kind::kReplace:
        ReplaceAll(&token, step.pattern, step.content);
        break;
      case HfDecoderStep::Kind::kByteFallback: {
        uint8_t byte = 0;
        if (ParseByteFallbackPiece(token, &byte)) token.assign(1, static_cast<char>(byte));
        break;
      }
      case HfDecoderStep::Kind::kByteLevel: {
        std::string bytes;
        // A token with characters outside the alphabet is kept as it is, like Hugging Face.
        if (ByteLevelDecode(token, &bytes)) token = std::move(bytes);
        break;
      }
      case HfDecoderStep::Kind::kMetaspace:
        ReplaceAll(&token, step.pattern, " ");
        break;
      case HfDecoderStep::Kind::kFuse:
      case HfDecoderStep::Kind::kStrip:
        break;  // Fuse: no-op on bytes; Strip: applied at the start of a text (TokenBytes)
    }
  }
  return token;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> BuildHfTokenizer(HfTokenizerSpec spec,
                                                            const HfTokenizerOptions& options) {
  auto tokenizer = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  HfTokenizer& t = *tokenizer;

  // Ids and the model vocabulary.
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const HfAddedToken& added : spec.added_tokens) max_id = std::max(max_id, added.id);
  t.vocab_size_ = max_id + 1;
  std::vector<int32_t> vocab_index(t.vocab_size_, -1);  // id -> index in spec.vocab
  t.vocab_.reserve(spec.vocab.size());
  for (size_t i = 0; i < spec.vocab.size(); ++i) {
    const auto& [token, id] = spec.vocab[i];
    if (vocab_index[id] >= 0) {
      return Error("model.vocab", absl::StrCat("id ", id, " is used by both \"",
                                               spec.vocab[vocab_index[id]].first, "\" and \"",
                                               token, "\""));
    }
    vocab_index[id] = static_cast<int32_t>(i);
    t.vocab_.emplace(token, id);
  }

  // Merges, by rank; a later duplicate replaces an earlier one (as in Hugging Face).
  t.merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const auto left_it = t.vocab_.find(left);
    const auto right_it = t.vocab_.find(right);
    const auto merged_it = t.vocab_.find(left + right);
    const char* missing = left_it == t.vocab_.end()     ? "left token"
                          : right_it == t.vocab_.end()  ? "right token"
                          : merged_it == t.vocab_.end() ? "merged token"
                                                        : nullptr;
    if (missing != nullptr) {
      return Error(absl::StrCat("model.merges[", rank, "]"),
                   absl::StrCat("the ", missing, " of \"", left, "\" + \"", right,
                                "\" is not in model.vocab"));
    }
    t.merges_[PairKey(left_it->second, right_it->second)] =
        HfTokenizer::Merge{static_cast<int32_t>(rank), merged_it->second};
  }

  t.byte_fallback_ = spec.byte_fallback;
  t.byte_ids_.fill(-1);
  if (spec.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      const auto it = t.vocab_.find(ByteFallbackPiece(static_cast<uint8_t>(b)));
      if (it != t.vocab_.end()) t.byte_ids_[b] = it->second;
    }
  }
  if (spec.unk_token.has_value()) {
    const auto it = t.vocab_.find(*spec.unk_token);
    if (it == t.vocab_.end()) {
      return Error("model.unk_token", absl::StrCat("\"", *spec.unk_token,
                                                   "\" is not in model.vocab"));
    }
    t.unk_id_ = it->second;
  }
  t.fuse_unk_ = spec.fuse_unk;
  t.ignore_merges_ = spec.ignore_merges;

  // Added tokens.
  std::vector<int8_t> added_kind(t.vocab_size_, 0);  // 0: none, 1: ordinary, 2: special
  std::vector<int32_t> added_index(t.vocab_size_, -1);
  for (size_t i = 0; i < spec.added_tokens.size(); ++i) {
    const HfAddedToken& added = spec.added_tokens[i];
    if (added_index[added.id] >= 0 &&
        spec.added_tokens[added_index[added.id]].content != added.content) {
      return Error(absl::StrCat("added_tokens[", i, "]"),
                   absl::StrCat("id ", added.id, " is already the added token \"",
                                spec.added_tokens[added_index[added.id]].content, "\""));
    }
    added_index[added.id] = static_cast<int32_t>(i);
    added_kind[added.id] = added.special ? 2 : 1;
    t.added_.Add(added.content, added.id);
  }

  // Pipeline.
  t.normalizers_ = std::move(spec.normalizers);
  for (size_t i = 0; i < spec.pre_tokenizers.size(); ++i) {
    PreTokenizer pre;
    pre.step = std::move(spec.pre_tokenizers[i]);
    if (pre.step.kind == HfPreTokenizerStep::Kind::kSplit ||
        (pre.step.kind == HfPreTokenizerStep::Kind::kByteLevel && pre.step.use_regex)) {
      const bool split = pre.step.kind == HfPreTokenizerStep::Kind::kSplit;
      auto regex = Pcre2Regex::Compile(split ? absl::string_view(pre.step.pattern) : kGpt2SplitPattern,
                                       split && !pre.step.pattern_is_regex);
      if (!regex.ok()) {
        return Error(absl::StrCat("pre_tokenizer step ", i, " pattern"),
                     regex.status().message());
      }
      pre.regex = std::move(regex).value();
    }
    t.pre_tokenizers_.push_back(std::move(pre));
  }

  // Decoding table.
  for (const HfDecoderStep& step : spec.decoders) {
    if (step.kind == HfDecoderStep::Kind::kStrip) {
      t.strip_content_ = step.content;
      t.strip_count_ = step.strip_start;
    } else if (step.kind == HfDecoderStep::Kind::kMetaspace &&
               step.prepend_scheme != HfPrependScheme::kNever) {
      t.strip_content_ = std::string(1, ' ');
      t.strip_count_ = 1;
    }
  }
  t.decoded_offsets_.reserve(static_cast<size_t>(t.vocab_size_) + 1);
  for (int32_t id = 0; id < t.vocab_size_; ++id) {
    t.decoded_offsets_.push_back(static_cast<uint32_t>(t.decoded_.size()));
    if (added_kind[id] == 2) continue;  // special: contributes nothing
    if (added_kind[id] == 1) {
      t.decoded_ += spec.added_tokens[added_index[id]].content;
    } else if (vocab_index[id] >= 0) {
      t.decoded_ += DecodeModelToken(spec.decoders, spec.vocab[vocab_index[id]].first);
    }
    if (t.decoded_.size() > UINT32_MAX / 2) {
      return Error("model.vocab", "decoded tokens exceed 2 GiB");
    }
  }
  t.decoded_offsets_.push_back(static_cast<uint32_t>(t.decoded_.size()));

  // BOS and EOS.
  auto added_id = [&](absl::string_view name) -> int32_t {
    for (const HfAddedToken& added : spec.added_tokens) {
      if (added.content == name) return added.id;
    }
    return -1;
  };
  if (options.bos_id.has_value()) {
    t.bos_id_ = *options.bos_id < 0 ? -1 : *options.bos_id;
  } else if (spec.has_template) {
    t.bos_id_ = spec.template_bos_id.value_or(-1);
    if (t.bos_id_ >= t.vocab_size_) {
      return Error("post_processor", absl::StrCat("BOS id ", t.bos_id_,
                                                  " is outside the vocabulary"));
    }
  } else {
    for (const absl::string_view name : kBosNames) {
      if (t.bos_id_ < 0) t.bos_id_ = added_id(name);
    }
  }
  if (options.eos_ids.has_value()) {
    t.eos_ids_ = *options.eos_ids;
  } else {
    for (const absl::string_view name : kEosNames) {
      const int32_t id = added_id(name);
      if (id >= 0) t.eos_ids_.push_back(id);
    }
    std::sort(t.eos_ids_.begin(), t.eos_ids_.end());
    t.eos_ids_.erase(std::unique(t.eos_ids_.begin(), t.eos_ids_.end()), t.eos_ids_.end());
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizerJson(absl::string_view json_text) {
  return ParseHfTokenizerJson(json_text, HfTokenizerOptions());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizerJson(
    absl::string_view json_text, const HfTokenizerOptions& options) {
  try {
    ESTUARY_ASSIGN_OR_RETURN(HfTokenizerSpec spec, ParseHfTokenizerSpec(json_text));
    return BuildHfTokenizer(std::move(spec), options);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("tokenizer.json: out of memory while loading");
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  return LoadHfTokenizer(path, HfTokenizerOptions());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path,
                                                           const HfTokenizerOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kHfMaxJsonBytes));
  auto tokenizer = ParseHfTokenizerJson(text, options);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

}  // namespace estuary
