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

// SIGPIPE ignored for the whole process: a peer that closes its connection must fail the write
// (EPIPE), not kill the process. gRPC and cpp-httplib's plain sockets send with MSG_NOSIGNAL,
// but TLS writes go through OpenSSL's socket BIO, which does not (the HTTPS door, https
// clients). ProcessMain and `estuary` call it first.
void IgnoreBrokenPipes();

}  // namespace estuary::process
