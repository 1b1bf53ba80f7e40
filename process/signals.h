#pragma once
// Termination signals of an Estuary process: SIGINT and SIGTERM are blocked in every thread
// (BlockTerminationSignals, first thing in main, before any thread starts) and taken
// synchronously by whoever waits for them, so that a drain can tell the first signal (drain)
// from the second (stop at once).

#include <signal.h>

#include "absl/time/time.h"

namespace estuary::process {

// {SIGINT, SIGTERM}.
sigset_t TerminationSignals();
// Blocks them in the calling thread; threads started later inherit the mask.
void BlockTerminationSignals();
// Waits until SIGINT or SIGTERM arrives or `deadline` passes; true when a signal was taken.
bool WaitForTerminationSignal(absl::Time deadline = absl::InfiniteFuture());

}  // namespace estuary::process
