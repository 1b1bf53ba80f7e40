#pragma once
// The wait between the polls of a busy-wait loop (NCCL communicators, the NCCL KV transport).
// Header-only and free of CUDA/NCCL, so that code built without ESTUARY_CUDA can use it.

#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace estuary {

// Short spin, then yields, then 50 us sleeps: low latency for fast operations without burning a
// core during long waits. `*polls` counts the calls; start it at 0 for each wait.
inline void PollBackoff(int* polls) {
  ++*polls;
  if (*polls < 64) return;
  if (*polls < 1024) {
    std::this_thread::yield();
    return;
  }
  absl::SleepFor(absl::Microseconds(50));
}

}  // namespace estuary
