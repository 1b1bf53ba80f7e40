#include "process/process_main.h"

#include <cstdio>

#include "process/file_limit.h"
#include "process/signals.h"

namespace estuary::process {

int ProcessMain(int argc, char** argv, const CommandFlags& command,
                const std::function<absl::Status()>& run,
                absl::Span<const CommandFlags> siblings) {
  BlockTerminationSignals();
  IgnoreBrokenPipes();
  RaiseOpenFileLimit();
  ParseCommandFlags(argc, argv, command, siblings);
  const absl::Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", command.program.c_str(), status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace estuary::process
