#pragma once
// Which model `estuary` uses when --model is absent: $ESTUARY_MODEL, else the shipped
// models/stories12L (else models/stories260K) of the repository, else a `tiny` synthesized model (made once in a
// cache folder), so the command always runs.

#include <string>

#include "absl/status/statusor.h"

namespace estuary::cli {

absl::StatusOr<std::string> ResolveModelPath(const std::string& flag_value);

}  // namespace estuary::cli
