#pragma once
// ProcessMain: the whole main() of an Estuary server binary (estuary-router, estuary-prefill,
// estuary-decode). Blocks the termination signals before any thread starts (and ignores
// SIGPIPE: a closed peer fails a write, it does not kill the server), raises the soft
// open-file limit to the hard one (file_limit.h), parses the flags
// against the binary's own table (process/command_flags.h: dashes or underscores, --config FILE,
// --help, a foreign flag refused with exit status 2), runs `run` and turns its status into the
// exit code, printing an error as "<program>: <status>".

#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "process/command_flags.h"

namespace estuary::process {

// `siblings`: the other server binaries' tables, named when a flag of theirs is given here.
int ProcessMain(int argc, char** argv, const CommandFlags& command,
                const std::function<absl::Status()>& run,
                absl::Span<const CommandFlags> siblings = {});

}  // namespace estuary::process
