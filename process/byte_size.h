#pragma once
// ByteSize: a memory size as people write it on a command line (--kv-cache-memory 2GiB).
// Accepted: plain bytes ("268435456"), binary units KiB / MiB / GiB / TiB (powers of 1024),
// decimal units KB / MB / GB / TB (powers of 1000), "B"; a fraction with a unit ("1.5GiB");
// case-insensitive units, optional space before the unit. Usable as an absl flag type.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace estuary::process {

struct ByteSize {
  int64_t bytes = 0;
};

// INVALID_ARGUMENT saying what is accepted (no number, unknown unit, negative, over 2^62).
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);
// An exact spelling, binary units first: "2GiB", "256MiB", "2GB", "4KiB", "1KB", "100".
std::string FormatByteSize(int64_t bytes);

// absl flag support.
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace estuary::process
