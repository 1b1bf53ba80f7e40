#pragma once
// RaiseOpenFileLimit: a server holds a socket per client connection and per peer, so the soft
// RLIMIT_NOFILE of a login shell (often 1024) would make the 1025th connection fail to be
// accepted while the hard limit allows far more. Servers raise the soft limit to the hard one
// at start, as nginx and Envoy deployments do (ProcessMain).

#include <cstdint>

namespace estuary::process {

// The soft limit after raising it (unchanged when getrlimit/setrlimit fail).
uint64_t RaiseOpenFileLimit();

}  // namespace estuary::process
