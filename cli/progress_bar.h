#pragma once
// Load progress on stderr: a redrawn bar on a terminal, a log line per 10% otherwise.

#include "core/loader/checkpoint.h"

namespace estuary::cli {

// The returned callback keeps its own state; use it for one load.
ProgressCallback MakeProgressReporter();

}  // namespace estuary::cli
