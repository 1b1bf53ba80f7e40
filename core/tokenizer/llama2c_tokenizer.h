#pragma once
// The llama2.c tokenizer (tokenizer.bin next to a llama2.c checkpoint).
//
// File format (little-endian): int32 max_token_length, then for each of `vocab_size` tokens a
// float32 merge score, an int32 length and that many bytes. Bytes after the last token are
// ignored (a tokenizer.bin may hold more tokens than the model uses). The file is untrusted:
// every length is bounded and every read is checked; errors name the file, the token and the
// field.
//
// Ids 0/1/2 are <unk>, BOS and EOS; ids 3..258 are the byte fallbacks <0x00>..<0xFF>.
// Encoding reproduces llama2.c's `encode` exactly (see Llama2cTokenizer::Encode). Two
// deliberate differences: a NUL byte is encoded (as byte fallback <0x00>) instead of ending
// the text, and a missing " " piece for the dummy prefix falls back to <0x20> instead of -1.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"

namespace estuary {

inline constexpr int32_t kLlama2cUnkId = 0;
inline constexpr int32_t kLlama2cBosId = 1;
inline constexpr int32_t kLlama2cEosId = 2;
inline constexpr int32_t kLlama2cByteFallbackOffset = 3;  // id of byte b is b + 3
inline constexpr int32_t kLlama2cMinVocabSize = 3 + 256;
inline constexpr int32_t kLlama2cMaxVocabSize = 4 << 20;
inline constexpr int32_t kLlama2cMaxTokenLength = 64 << 10;

// The raw contents of a tokenizer.bin.
struct Llama2cVocab {
  int32_t max_token_length = 0;
  std::vector<std::string> pieces;  // pieces[id]: the token's bytes
  std::vector<float> scores;        // scores[id]: merge score (higher merges first)
};

// Reads and validates `path`, expecting `vocab_size` tokens (the model's vocabulary size;
// kLlama2cMinVocabSize..kLlama2cMaxVocabSize).
absl::StatusOr<Llama2cVocab> ReadLlama2cVocab(const std::string& path, int32_t vocab_size);

// Builds the tokenizer from contents that ReadLlama2cVocab validated (pieces.size() is the
// vocabulary size, at least kLlama2cMinVocabSize).
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeLlama2cTokenizer(Llama2cVocab vocab);

// ReadLlama2cVocab + MakeLlama2cTokenizer. The result is immutable and thread-safe.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                                 int32_t vocab_size);

}  // namespace estuary
