#include "core/common/step_loop.h"

#include "absl/time/clock.h"

namespace estuary {

StepLoop::StepLoop(std::function<bool()> has_work, std::function<absl::Status()> step,
                   absl::Duration idle_poll)
    : has_work_(std::move(has_work)), step_(std::move(step)), idle_poll_(idle_poll) {
  thread_ = std::thread([this] { Run(); });
}

StepLoop::~StepLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void StepLoop::Notify() {
  absl::MutexLock lock(&mu_);
  notified_ = true;
}

StepLoopProgress StepLoop::Progress() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

void StepLoop::Run() {
  {
    absl::MutexLock lock(&mu_);
    progress_.running = true;
  }
  while (true) {
    const bool busy = has_work_();
    {
      absl::MutexLock lock(&mu_);
      if (!busy) mu_.AwaitWithTimeout(absl::Condition(this, &StepLoop::Woken), idle_poll_);
      if (stop_) return;
      notified_ = false;
      progress_.in_step = true;
      progress_.step_started = absl::Now();
    }
    const absl::Status status = step_();
    absl::MutexLock lock(&mu_);
    progress_.in_step = false;
    ++progress_.steps;
    progress_.consecutive_failures = status.ok() ? 0 : progress_.consecutive_failures + 1;
  }
}

}  // namespace estuary
