#pragma once
// StepLoop: the thread that drives an engine (decode or prefill) in a worker process. Calls
// `step` while `has_work` says so, otherwise sleeps until Notify() or `idle_poll` passes (so
// that time-based work, such as lease expiry, still gets looked at). `step` runs only on the
// loop's thread, which makes that thread the engine thread. Owns the thread; the callbacks'
// targets must outlive the loop.

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace estuary {

class StepLoop {
 public:
  StepLoop(std::function<bool()> has_work, std::function<void()> step,
           absl::Duration idle_poll = absl::Milliseconds(10));
  ~StepLoop();  // stops and joins (after the step in progress)
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // Wakes the loop: new work arrived. Thread-safe.
  void Notify();

 private:
  void Run();
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_ || stop_; }

  const std::function<bool()> has_work_;
  const std::function<void()> step_;
  const absl::Duration idle_poll_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace estuary
