#pragma once
// CheckRange: the bound check every config validator uses, with one message shape:
// "<what>: <field> = <value> is outside [lo, hi]".

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace estuary {

inline absl::Status CheckRange(const char* what, const char* field, int64_t value, int64_t lo,
                               int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", field, " = ", value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace estuary
