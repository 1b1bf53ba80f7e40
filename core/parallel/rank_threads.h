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
  explicit RankThreads(int size);
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

  const int size_;
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
