#pragma once
// Tokenizer interface shared by the llama2.c tokenizer and tokenizer.json BPE (both flavours).
// Implementations are immutable after loading and safe to use from many threads.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace estuary {

// Longest text Tokenizer::Encode accepts, in bytes. The serving layer bounds prompts far below
// this; the limit only keeps a stray caller from making the encoder allocate gigabytes.
inline constexpr size_t kMaxEncodeTextBytes = 16 << 20;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Number of ids the tokenizer knows (ids outside [0, vocab_size) are never produced).
  virtual int32_t vocab_size() const = 0;
  // -1 when the tokenizer has no BOS token.
  virtual int32_t bos_id() const = 0;
  virtual std::vector<int32_t> eos_ids() const = 0;

  // Encodes `text`, prepending BOS when `add_bos` and the tokenizer has one. Fails only on
  // input the tokenizer cannot represent or that exceeds its size limits (kMaxEncodeTextBytes,
  // regex match limits of an untrusted tokenizer.json).
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_bos) const = 0;

  // The raw bytes `id` contributes to the text when it follows `prev_id` (-1 at the start of a
  // text). The bytes may be a fragment of a UTF-8 code point (byte-fallback tokens); special
  // tokens such as BOS/EOS contribute nothing. Unknown ids contribute nothing.
  virtual std::string TokenBytes(int32_t prev_id, int32_t id) const = 0;

  // Decodes a whole sequence; invalid UTF-8 is replaced by U+FFFD.
  std::string Decode(absl::Span<const int32_t> ids) const;
};

// Turns a stream of ids into text that never ends inside a UTF-8 code point: bytes of an
// incomplete code point are held back until the code point completes. Not thread-safe; one per
// sequence.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, int32_t prev_id = -1)
      : tokenizer_(tokenizer), prev_id_(prev_id) {}

  // Adds one id; returns the text that became complete (possibly empty).
  std::string Push(int32_t id);
  // Returns whatever is held back, with invalid or truncated sequences as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_id_;
  std::string pending_;  // bytes of an incomplete code point
};

// Replaces invalid UTF-8 sequences in `bytes` by U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

}  // namespace estuary
