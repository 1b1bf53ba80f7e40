#pragma once
// Per-command flag sets over Abseil's one global flag namespace. Every Estuary binary (and each
// `estuary` subcommand) names the flags it accepts in a CommandFlags table; ParseCommandFlags
// checks the command line against that table BEFORE absl parses it, so that
//   - `--help` (or -h) prints the command's own flags with their help text and defaults
//     (read from absl's registry: absl::FindCommandLineFlag), not every flag linked in;
//   - a flag that is not the command's is refused, naming it and the sibling commands that do
//     take it ("--num-requests does not apply to `estuary generate` (it is a flag of:
//     bench-serve)"), exit status 2;
//   - a stray positional argument is refused.
// Flags from `--config FILE` (process/flag_spelling.h) pass the same check. Dashes and
// underscores are both accepted; tables spell names with underscores (absl's names).
// This file knows no role: the tables live with the binaries that own the flags.

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace estuary::process {

struct CommandFlags {
  std::string program;             // as typed: "estuary generate", "estuary-router"
  std::string label;               // in another command's refusal; empty: `program`
  std::string summary;             // one line for --help
  std::vector<std::string> flags;  // absl names (underscores), in --help's order
};

// Flags every command takes besides its table: --help and --config FILE.
inline constexpr const char* kHelpFlags[] = {"help", "h", "helpfull", "helpshort"};

struct CheckedCommandLine {
  bool help = false;               // --help was asked (print HelpText, exit 0)
  std::set<std::string> given;     // the table's flags set on this command line (absl names)
};

// Checks `args` (argv after DashesToUnderscores: names with underscores, --config expanded;
// args[0] is the program) against `command`. INVALID_ARGUMENT naming the first flag that is not
// the command's (with the `siblings` that take it) or the first positional argument.
// A flag that is not bool consumes the next argument as its value unless spelled --flag=value.
absl::StatusOr<CheckedCommandLine> CheckCommandLine(const std::vector<std::string>& args,
                                                    const CommandFlags& command,
                                                    absl::Span<const CommandFlags> siblings = {});

// --help's text: usage, summary, then each flag as "--name-with-dashes (default: D)" and its
// help; flags the binary does not define are listed as such (a table error a test catches).
std::string HelpText(const CommandFlags& command);

// The table's names this binary does not define with ABSL_FLAG (should be none).
std::vector<std::string> UndefinedFlags(const CommandFlags& command);

// The whole front end of a command: rewrites argv (flag_spelling.h), checks it
// (CheckCommandLine), prints --help to stdout and exits 0, prints a refusal as
// "error: ..." with a pointer to --help on stderr and exits 2, then parses with absl.
// Returns the flags that were given.
std::set<std::string> ParseCommandFlags(int argc, char** argv, const CommandFlags& command,
                                        absl::Span<const CommandFlags> siblings = {});

}  // namespace estuary::process
