#pragma once
// Which flags each Estuary command takes: the `estuary` subcommands and the three server
// binaries (estuary-router, estuary-prefill, estuary-decode). One table per command
// (process/command_flags.h): --help prints it, a flag outside it is refused naming the commands
// that do take it. The flags themselves are defined (ABSL_FLAG) by the binaries that read them
// (cli/estuary_main.cc, router/router_main.cc, worker/worker_flags.cc,
// decode/decode_worker_main.cc); these tables only name them, so that each binary also knows its
// siblings' and `estuary up` knows which server each of its flags goes to.
//
// Adding a flag: define it where it is read AND add its name (underscores) to the table of every
// command that reads it. tests/cli/command_flags_cli_test fails for a name a binary does not
// define, and for a flag of estuary_main.cc that no subcommand takes.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "process/command_flags.h"

namespace estuary::cli {

// The server binaries, in this order: router, prefill, decode.
const process::CommandFlags& RouterCommand();
const process::CommandFlags& PrefillWorkerCommand();
const process::CommandFlags& DecodeWorkerCommand();
absl::Span<const process::CommandFlags> ServerCommands();

// The `estuary` subcommands (program "estuary <name>", label "<name>").
absl::Span<const process::CommandFlags> EstuaryCommands();
// Null for an unknown subcommand.
const process::CommandFlags* FindEstuaryCommand(absl::string_view name);

// `estuary up`: flags it sets on its processes itself (from its own options), never passed
// through as given.
absl::Span<const char* const> UpManagedFlags();

}  // namespace estuary::cli
