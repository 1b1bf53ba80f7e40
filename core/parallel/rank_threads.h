#pragma once
// RankThreads: the threads of one tensor-parallel worker's ranks (design §6: one thread per
// device; on the CPU, per share of the cores). Rank 0 runs on the calling thread; ranks
// 1..size-1 each have a persistent thread of their own, so per-thread kernel scratch stays warm
// from one step to the next.
//
// Run(fn) calls fn(rank) on every rank at once and returns when all have returned: OK, or the
// first error by rank order. `on_error` (when set) is called as soon as any rank fails, from that
// rank's thread, so that the caller can abort the ranks' communicator group and the others leave
// their collectives at once instead of waiting for a deadline.
//
// Thread-safety: Run is not reentrant; calls from several threads are serialized by a mutex.
// The destructor joins the threads (after any Run in progress).
//
// Test hook (fault injection, the workers' --debug-stall-rank): with `stall_rank` >= 0, that
// rank stops making progress at its first Run, as a rank stuck in a kernel or on a dead device
// would: it never returns, so that Run never returns either and the other ranks run into their
// collectives' deadline. Nothing recovers such a group; only the process's exit ends it (the
// worker's watchdog, worker/worker_process.h). Never set outside tests.

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace estuary::parallel {

class RankThreads {
 public:
  explicit RankThreads(int size, int stall_rank = -1);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return size_; }

  using RankFn = std::function<absl::Status(int rank)>;
  using ErrorFn = std::function<void(const absl::Status& status)>;
  absl::Status Run(const RankFn& fn, const ErrorFn& on_error = nullptr);

 private:
  void Loop(int rank);
  void Finish(int rank, absl::Status status);
  // The test hook: blocks the calling rank for good when it is stall_rank_.
  void MaybeStall(int rank) const;

  const int size_;
  const int stall_rank_;
  absl::Mutex run_mu_;  // serializes Run
  absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by each Run to wake the threads
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const RankFn* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  const ErrorFn* on_error_ ABSL_GUARDED_BY(mu_) = nullptr;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace estuary::parallel
