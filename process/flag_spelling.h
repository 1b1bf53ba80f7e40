#pragma once
// absl flags are spelled with underscores; users type dashes (--max-tokens). Shared by every
// Estuary binary so that both spellings work everywhere.

#include <string>
#include <vector>

namespace estuary::process {

// argv with the name part of each "--flag" or "--flag=value" argument rewritten to underscores,
// and `--config FILE` turned into absl's `--flagfile=FILE` (a file of --flag=value lines).
std::vector<std::string> DashesToUnderscores(int argc, char** argv);

// Parses `argv` (after the rewrite) with absl::ParseCommandLine; returns the positional arguments.
std::vector<std::string> ParseFlags(int argc, char** argv);

}  // namespace estuary::process
