#pragma once
// The ready file: a process started with --ready-file F writes "host:port\n" to F once it
// serves, so that launchers (`estuary up`, tests) learn a port 0 picked and when to go on.

#include <string>

#include "absl/status/status.h"

namespace estuary::process {

// Writes "<address>\n" to `path` under a temporary name and renames it, so that a launcher
// polling for the file never reads half a line.
absl::Status WriteReadyFile(const std::string& path, const std::string& address);

}  // namespace estuary::process
