#pragma once
// Runs a program (no shell, so arguments need no quoting) and captures what it prints.
// For tests that drive the real binaries.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace estuary::testing {

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv[0] with `argv`, waiting at most `timeout` (then kills it: DEADLINE_EXCEEDED).
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         absl::Duration timeout = absl::Minutes(5));

// Path of a binary built by this project, e.g. BinaryPath("cli/estuary"): under $ESTUARY_BINARY_DIR
// when set, else under the build folder the test was compiled in.
std::string BinaryPath(const std::string& relative);

}  // namespace estuary::testing
