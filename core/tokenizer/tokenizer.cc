#include "core/tokenizer/tokenizer.h"

#include "core/tokenizer/utf8.h"

namespace estuary {
namespace {

// Appends the well-formed part of `bytes` to `out`, invalid subparts as U+FFFD. A truncated
// sequence at the end is replaced too when `final`, otherwise left alone. Returns the number of
// bytes consumed.
size_t AppendSanitized(std::string_view bytes, bool final, std::string* out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t length = 1;
    const utf8::SequenceStatus status = utf8::NextSequence(bytes, pos, &length);
    if (status == utf8::SequenceStatus::kValid) {
      out->append(bytes.data() + pos, length);
    } else if (status == utf8::SequenceStatus::kTruncated && !final) {
      break;
    } else {
      out->append(utf8::kReplacementCharacter);
    }
    pos += length;
  }
  return pos;
}

}  // namespace

std::string Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string bytes;
  int32_t prev = -1;
  for (const int32_t id : ids) {
    bytes += TokenBytes(prev, id);
    prev = id;
  }
  return SanitizeUtf8(bytes);
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  pending_ += tokenizer_.TokenBytes(prev_id_, id);
  prev_id_ = id;
  std::string out;
  const size_t consumed = AppendSanitized(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out;
  AppendSanitized(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendSanitized(bytes, /*final=*/true, &out);
  return out;
}

}  // namespace estuary
