#include "core/common/step_loop.h"

namespace estuary {

StepLoop::StepLoop(std::function<bool()> has_work, std::function<void()> step,
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

void StepLoop::Run() {
  while (true) {
    const bool busy = has_work_();
    {
      absl::MutexLock lock(&mu_);
      if (!busy) mu_.AwaitWithTimeout(absl::Condition(this, &StepLoop::Woken), idle_poll_);
      if (stop_) return;
      notified_ = false;
    }
    step_();
  }
}

}  // namespace estuary
