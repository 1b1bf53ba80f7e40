#pragma once
// absl flags are spelled with underscores; users type dashes (--max-tokens). Shared by every
// Estuary binary so that both spellings work everywhere.

#include <string>
#include <vector>

namespace estuary::process {

// argv with `--config FILE` replaced by the file's flags (one `--flag=value` a line, spelled as
// on the command line; '#' comments), and the name part of each "--flag" or "--flag=value"
// argument rewritten to underscores. An unreadable file or a line that is not a flag exits
// with a message (status 2).
std::vector<std::string> DashesToUnderscores(int argc, char** argv);

// Parses `argv` (after the rewrite) with absl::ParseCommandLine; returns the positional arguments.
// The binaries use ParseCommandFlags (process/command_flags.h) instead, which also checks argv
// against the command's own flags.
std::vector<std::string> ParseFlags(int argc, char** argv);

}  // namespace estuary::process
