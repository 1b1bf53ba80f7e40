#include "core/backend/backend.h"

#include "absl/strings/str_cat.h"

namespace estuary {

absl::Status CheckBufferRange(const Buffer& buffer, size_t offset, size_t bytes) {
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", ", offset + bytes,
                                              ") outside a buffer of ", buffer.size(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace estuary
