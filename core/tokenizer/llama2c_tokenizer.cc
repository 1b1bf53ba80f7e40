#include "core/tokenizer/llama2c_tokenizer.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/bpe_merge.h"
#include "core/tokenizer/byte_fallback.h"

namespace estuary {
namespace {

// llama2.c only merges pairs whose score is strictly above this (its initial best_score).
constexpr float kMinMergeScore = -1e10f;

// Bounds-checked little-endian reader over a mapped file. Errors name the file, the token
// (-1: the header) and the field.
class Reader {
 public:
  explicit Reader(const MappedFile& file) : file_(file) {}

  absl::Status Read(void* out, size_t n, int64_t token, const char* field) {
    if (file_.size() - pos_ < n) {
      return absl::InvalidArgumentError(absl::StrCat(
          file_.path(), ": truncated at byte ", pos_, " reading ",
          token < 0 ? std::string() : absl::StrCat("token ", token, " "), field, " (", n,
          " bytes needed, ", file_.size() - pos_, " left)"));
    }
    if (n > 0) std::memcpy(out, file_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

 private:
  const MappedFile& file_;
  size_t pos_ = 0;
};

class Llama2cTokenizer final : public Tokenizer {
 public:
  explicit Llama2cTokenizer(Llama2cVocab vocab) : vocab_(std::move(vocab)) {
    lookup_.reserve(vocab_.pieces.size());
    for (size_t id = 0; id < vocab_.pieces.size(); ++id) {
      // Keeps the lowest id for duplicate pieces (llama2.c's bsearch picks an arbitrary one).
      lookup_.emplace(vocab_.pieces[id], static_cast<int32_t>(id));
    }
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.pieces.size()); }
  int32_t bos_id() const override { return kLlama2cBosId; }
  std::vector<int32_t> eos_ids() const override { return {kLlama2cEosId}; }

  // llama2.c `encode`: BOS; a dummy-prefix " " piece when the text is not empty; one piece per
  // UTF-8 code point (a lead byte plus up to three continuation bytes, as llama2.c groups them),
  // or one byte-fallback piece per byte when the code point is not in the vocabulary; then
  // repeatedly merge the adjacent pair whose concatenation is a piece with the highest score
  // (leftmost on ties).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override {
    if (text.size() > kMaxEncodeTextBytes) {
      return absl::InvalidArgumentError(absl::StrCat("text of ", text.size(),
                                                     " bytes is longer than the limit of ",
                                                     kMaxEncodeTextBytes));
    }
    std::vector<int32_t> pieces;
    pieces.reserve(text.size() + 1);
    if (!text.empty()) pieces.push_back(FindOr(" ", ByteId(' ')));
    for (size_t i = 0; i < text.size();) {
      size_t length = 1;
      while (length < 4 && i + length < text.size() &&
             (static_cast<uint8_t>(text[i + length]) & 0xC0) == 0x80) {
        ++length;
      }
      const std::string_view code_point = text.substr(i, length);
      const auto it = lookup_.find(absl::string_view(code_point.data(), code_point.size()));
      if (it != lookup_.end()) {
        pieces.push_back(it->second);
      } else {
        for (const char c : code_point) pieces.push_back(ByteId(static_cast<uint8_t>(c)));
      }
      i += length;
    }
    ApplyMerges(&pieces, [this](int32_t left, int32_t right, MergeCandidate* out) {
      const std::string merged = vocab_.pieces[left] + vocab_.pieces[right];
      const auto it = lookup_.find(merged);
      if (it == lookup_.end()) return false;
      const float score = vocab_.scores[it->second];
      if (!(score > kMinMergeScore)) return false;  // also rejects NaN, as llama2.c does
      out->priority = -static_cast<double>(score);
      out->merged_id = it->second;
      return true;
    });
    std::vector<int32_t> ids;
    ids.reserve(pieces.size() + 1);
    if (add_bos) ids.push_back(kLlama2cBosId);
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

  // llama2.c `decode`: a piece that follows BOS loses its leading space, "<0xXX>" becomes the
  // raw byte. <unk>, BOS and EOS contribute nothing.
  std::string TokenBytes(int32_t prev_id, int32_t id) const override {
    if (id < 0 || id >= vocab_size() || id <= kLlama2cEosId) return std::string();
    std::string_view piece = vocab_.pieces[id];
    if (prev_id == kLlama2cBosId && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    uint8_t byte = 0;
    if (ParseByteFallbackPiece(piece, &byte)) return std::string(1, static_cast<char>(byte));
    return std::string(piece);
  }

 private:
  static int32_t ByteId(uint8_t byte) { return kLlama2cByteFallbackOffset + byte; }

  int32_t FindOr(const char* piece, int32_t fallback) const {
    const auto it = lookup_.find(piece);
    return it == lookup_.end() ? fallback : it->second;
  }

  const Llama2cVocab vocab_;
  absl::flat_hash_map<std::string, int32_t> lookup_;  // piece -> lowest id
};

}  // namespace

absl::StatusOr<Llama2cVocab> ReadLlama2cVocab(const std::string& path, int32_t vocab_size) {
  if (vocab_size < kLlama2cMinVocabSize || vocab_size > kLlama2cMaxVocabSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": vocab_size ", vocab_size, " is outside [", kLlama2cMinVocabSize, ", ",
        kLlama2cMaxVocabSize, "] (the llama2.c format needs <unk>, BOS, EOS and 256 byte "
        "fallbacks)"));
  }
  ESTUARY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  Reader reader(*file);
  Llama2cVocab vocab;
  ESTUARY_RETURN_IF_ERROR(reader.Read(&vocab.max_token_length, 4, -1, "max_token_length"));
  if (vocab.max_token_length < 1 || vocab.max_token_length > kLlama2cMaxTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": max_token_length ",
                                                   vocab.max_token_length, " is outside [1, ",
                                                   kLlama2cMaxTokenLength, "]"));
  }
  // Every token needs at least 8 bytes: refuse an impossible count before allocating for it.
  if ((file->size() - 4) / 8 < static_cast<size_t>(vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": file of ", file->size(),
                                                   " bytes is too short for ", vocab_size,
                                                   " tokens"));
  }
  vocab.pieces.resize(vocab_size);
  vocab.scores.resize(vocab_size);
  for (int32_t id = 0; id < vocab_size; ++id) {
    ESTUARY_RETURN_IF_ERROR(reader.Read(&vocab.scores[id], 4, id, "score"));
    int32_t length = 0;
    ESTUARY_RETURN_IF_ERROR(reader.Read(&length, 4, id, "length"));
    if (length < 0 || length > vocab.max_token_length) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", id, " length ", length,
                                                     " is outside [0, max_token_length ",
                                                     vocab.max_token_length, "]"));
    }
    vocab.pieces[id].resize(length);
    ESTUARY_RETURN_IF_ERROR(
        reader.Read(vocab.pieces[id].data(), length, id, "bytes"));
  }
  return vocab;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeLlama2cTokenizer(Llama2cVocab vocab) {
  if (vocab.pieces.size() < static_cast<size_t>(kLlama2cMinVocabSize) ||
      vocab.pieces.size() > static_cast<size_t>(kLlama2cMaxVocabSize) ||
      vocab.scores.size() != vocab.pieces.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c vocabulary of ", vocab.pieces.size(), " pieces and ",
                     vocab.scores.size(), " scores is not usable"));
  }
  return std::unique_ptr<Tokenizer>(new Llama2cTokenizer(std::move(vocab)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                                int32_t vocab_size) {
  ESTUARY_ASSIGN_OR_RETURN(Llama2cVocab vocab, ReadLlama2cVocab(path, vocab_size));
  return MakeLlama2cTokenizer(std::move(vocab));
}

}  // namespace estuary
