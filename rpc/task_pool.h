#pragma once
// TaskPool: the threads rpc/http_server.h runs request handlers on (handlers block: they call
// the router's gRPC service synchronously). At most `max_threads`, started as tasks need them and
// kept until Stop; a task that finds every thread busy waits in a queue of at most `max_queued`
// tasks, beyond which TrySubmit refuses it (the caller answers "busy"). The queue and the thread
// count are the bound: an idle connection never holds a thread, a request only while it runs.

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace estuary::rpc {

class TaskPool {
 public:
  TaskPool(int max_threads, size_t max_queued);
  ~TaskPool();  // Stop()
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues `task` (runs it on a free thread, or starts one, or waits in the queue). False when
  // the queue is full or the pool stopped; `task` is then destroyed, not run.
  bool TrySubmit(std::function<void()> task);
  // Refuses new tasks, destroys the queued ones unrun, and waits for the running ones to return
  // (idempotent).
  void Stop();

  int threads();  // started so far

 private:
  void Loop();

  const int max_threads_;
  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace estuary::rpc
