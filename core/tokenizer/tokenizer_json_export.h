#pragma once
// Writers of tokenizer.json text, so that every model can be served through the Hugging Face
// tokenizer path (and so that synthetic models get a tokenizer). Stateless; thread-safe.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace estuary {

// Converts a llama2.c tokenizer.bin (see llama2c_tokenizer.h) into a SentencePiece-style
// tokenizer.json (Llama 2 layout: normalizer Prepend("▁") + Replace(" " -> "▁"), BPE with
// byte_fallback, decoder Replace/ByteFallback/Fuse/Strip, TemplateProcessing adding <s>):
//  - ids are kept; pieces have " " replaced by "▁"; ids 0/1/2 become the special added tokens
//    <unk>, <s>, </s>; ids 3..258 must be the byte fallbacks <0x00>..<0xFF>;
//  - merges: every split (a, b) of a piece p (id >= 3, finite score above -1e10, as llama2.c
//    requires to merge) into two pieces a, b (ids >= 3), ranked by the score of p descending,
//    then by the id of p, then of a, then of b (the order Hugging Face's SentencePiece converter
//    uses).
// Encoding with the result equals llama2.c encoding except in cases no fixed merge ranking can
// reproduce: llama2.c takes the leftmost of equal-score candidates, BPE the lowest rank, so a
// text can differ when two overlapping candidate pairs tie (e.g. pieces "a", "aa", "aaa": text
// split as [a][aa][a] vs [aa][a][aa]). SentencePiece-trained vocabularies give every piece its
// own score, and then ties only come from different splits of one piece. Other differences:
// text containing "▁" (U+2581), or the literal text of an added token (<s>, ...), which
// tokenizer.json matches as a special token.
// Fails (naming the file and token) on pieces that are not valid UTF-8, contain "▁", or
// duplicate another piece.
absl::StatusOr<std::string> ExportLlama2cTokenizerJson(const std::string& tokenizer_bin_path,
                                                       int32_t vocab_size);

// A Llama-3-style byte-level tokenizer.json for random-weight synthetic models: ids 0..255 are
// the 256 byte tokens (GPT-2 byte-to-Unicode strings, id = byte value), followed by a handful of
// merges (" t", "he", " the", ...) while ids remain below `vocab_size`, and the special added
// tokens "<|begin_of_text|>" = bos_id (also the TemplateProcessing BOS) and "<|end_of_text|>" =
// eos_id. Ids without a token decode to nothing. Requires 256 <= bos_id, eos_id < vocab_size,
// bos_id != eos_id and vocab_size <= 4M; otherwise returns an empty string (which
// ParseHfTokenizerJson rejects).
std::string MakeByteLevelTokenizerJson(int32_t vocab_size, int32_t bos_id, int32_t eos_id);

}  // namespace estuary
