#pragma once
// StepLoop: the thread that drives an engine (decode or prefill) in a worker process. Calls
// `step` while `has_work` says so, otherwise sleeps until Notify() or `idle_poll` passes (so
// that time-based work, such as lease expiry, still gets looked at). `step` runs only on the
// loop's thread, which makes that thread the engine thread. Owns the thread; the callbacks'
// targets must outlive the loop.
//
// The loop also keeps the figures a health check needs (Progress): whether a step is running
// and since when, and how many steps in a row failed. `step` returns the status of the engine
// step it ran (OK when there was nothing to do).

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace estuary {

// A snapshot of the loop's progress (thread-safe to take).
struct StepLoopProgress {
  bool running = false;           // the loop thread has started
  bool in_step = false;           // a step is running now
  absl::Time step_started;        // when the running (or the last) step started
  int consecutive_failures = 0;   // steps in a row that returned an error
  int64_t steps = 0;              // steps completed
};

class StepLoop {
 public:
  StepLoop(std::function<bool()> has_work, std::function<absl::Status()> step,
           absl::Duration idle_poll = absl::Milliseconds(10));
  ~StepLoop();  // stops and joins (after the step in progress)
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // Wakes the loop: new work arrived. Thread-safe.
  void Notify();
  StepLoopProgress Progress() const;

 private:
  void Run();
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_ || stop_; }

  const std::function<bool()> has_work_;
  const std::function<absl::Status()> step_;
  const absl::Duration idle_poll_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  StepLoopProgress progress_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace estuary
