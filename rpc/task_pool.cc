#include "rpc/task_pool.h"

#include <algorithm>
#include <utility>

namespace estuary::rpc {

TaskPool::TaskPool(int max_threads, size_t max_queued)
    : max_threads_(std::max(max_threads, 1)), max_queued_(max_queued) {}

TaskPool::~TaskPool() { Stop(); }

bool TaskPool::TrySubmit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  // Waiting tasks beyond the idle threads need a thread each, up to the cap; the rest queue.
  const size_t waiting = queue_.size() + 1;
  const size_t unserved = waiting > static_cast<size_t>(idle_) ? waiting - idle_ : 0;
  if (unserved > 0 && static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back(&TaskPool::Loop, this);
  } else if (unserved > max_queued_) {
    return false;
  }
  queue_.push_back(std::move(task));
  return true;
}

void TaskPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      --idle_;
      if (queue_.empty()) return;  // stopping
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void TaskPool::Stop() {
  std::vector<std::thread> threads;
  std::deque<std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(queue_);
    threads.swap(threads_);
  }
  dropped.clear();  // outside the lock: a task's captures may take locks of their own
  for (std::thread& thread : threads) thread.join();
}

int TaskPool::threads() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

}  // namespace estuary::rpc
