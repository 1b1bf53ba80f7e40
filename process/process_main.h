#pragma once
// ProcessMain: the whole main() of an Estuary server binary (estuary-router, estuary-prefill,
// estuary-decode). Blocks the termination signals before any thread starts, parses the flags
// (dashes or underscores, --config FILE), runs `run` and turns its status into the exit code,
// printing an error as "<program>: <status>".

#include <functional>

#include "absl/status/status.h"

namespace estuary::process {

int ProcessMain(int argc, char** argv, const char* program,
                const std::function<absl::Status()>& run);

}  // namespace estuary::process
