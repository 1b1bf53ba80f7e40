#include "process/process_main.h"

#include <cstdio>

#include "process/flag_spelling.h"
#include "process/signals.h"

namespace estuary::process {

int ProcessMain(int argc, char** argv, const char* program,
                const std::function<absl::Status()>& run) {
  BlockTerminationSignals();
  ParseFlags(argc, argv);
  const absl::Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace estuary::process
