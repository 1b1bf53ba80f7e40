#pragma once
// Hugging Face tokenizer.json BPE tokenizers, in the two flavours Llama-family models use:
//
//  (a) SentencePiece-style (Llama 2, TinyLlama, Mistral): normalizer Sequence[Prepend("▁"),
//      Replace(" " -> "▁")] or the legacy Metaspace pre-tokenizer, BPE with byte_fallback,
//      decoder Sequence[Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0)] or Metaspace.
//  (b) Byte-level (Llama 3, GPT-2): pre-tokenizer Split(Regex, Isolated) + ByteLevel (or
//      ByteLevel with its GPT-2 regex), GPT-2 byte <-> Unicode alphabet, decoder ByteLevel.
//
// Encoding follows the Hugging Face pipeline: added tokens ("added_tokens", special or not) are
// found in the raw text first (leftmost, longest match) and never split; every other segment is
// normalized, pre-tokenized and BPE-merged by merge rank (leftmost on ties), with
// "ignore_merges", "byte_fallback", "unk_token" and "fuse_unk" honoured. Regexes run on PCRE2.
// Text that is not valid UTF-8 is accepted: each ill-formed byte is its own character.
//
// Decoding (TokenBytes): special added tokens contribute nothing, other added tokens their
// content; model tokens go through the decoder steps (Replace, ByteFallback, ByteLevel,
// Metaspace). Strip/Metaspace remove the leading space of the first token of a text, i.e. when
// prev_id is -1 or BOS (Hugging Face strips once per decode call; a per-token interface cannot
// see further back). With no decoder, tokens are concatenated as they are.
//
// BOS: from post_processor TemplateProcessing (possibly inside a Sequence): the special token
// its "single" template starts with, or none when it starts with the sequence. Without a
// TemplateProcessing: the added token "<s>" or "<|begin_of_text|>" (in that order), else none.
// EOS: every added token named "</s>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>",
// "<|endoftext|>" or "<|im_end|>". Callers that know better (config.json,
// generation_config.json) pass HfTokenizerOptions.
//
// Not supported (load fails with Unimplemented naming the field): other model types, Regex
// Replace, normalizers other than Prepend/Replace, pre-tokenizers other than
// Split(Isolated)/ByteLevel/Metaspace, subword prefixes/suffixes. Ignored: dropout, padding,
// truncation, added-token lstrip/rstrip/single_word/normalized flags.
//
// Limits (hostile files): see hf_tokenizer_spec.h (64 MiB of JSON, nesting 64, 4M vocab
// entries and merges, 64 KiB per token). Errors name the field, e.g.
// "tokenizer.json: model.merges[17]: ...". No exception escapes.
//
// The tokenizers are immutable and thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tokenizer/tokenizer.h"

namespace estuary {

struct HfTokenizerOptions {
  std::optional<int32_t> bos_id;                // overrides the BOS found in the file; -1: none
  std::optional<std::vector<int32_t>> eos_ids;  // overrides the EOS found in the file
};

// Parses tokenizer.json text.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizerJson(absl::string_view json_text);
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizerJson(
    absl::string_view json_text, const HfTokenizerOptions& options);

// Reads (at most 64 MiB) and parses a tokenizer.json file; errors name the path.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& tokenizer_json_path);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& tokenizer_json_path,
                                                           const HfTokenizerOptions& options);

}  // namespace estuary
