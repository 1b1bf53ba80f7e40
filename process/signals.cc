#include "process/signals.h"

#include <errno.h>
#include <time.h>

#include "absl/time/clock.h"

namespace estuary::process {

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

bool WaitForTerminationSignal(absl::Time deadline) {
  const sigset_t signals = TerminationSignals();
  // Blocked in this thread too (BlockTerminationSignals did it for the whole process when
  // called first), then taken synchronously.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  while (true) {
    if (deadline == absl::InfiniteFuture()) {
      int received = 0;
      if (sigwait(&signals, &received) == 0) return true;
      continue;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const timespec timeout = absl::ToTimespec(left);
    if (sigtimedwait(&signals, nullptr, &timeout) > 0) return true;
    if (errno == EAGAIN) return false;  // timed out; EINTR: wait again
  }
}

void IgnoreBrokenPipes() { ::signal(SIGPIPE, SIG_IGN); }

}  // namespace estuary::process
