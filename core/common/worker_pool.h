#pragma once
// WorkerPool: the CPU threads one model rank runs its kernels on (issue 18: one pool for every
// kernel, no thread created per call). The caller of ParallelFor takes part as worker 0; the pool
// owns size() - 1 helper threads, started once and kept until the pool is destroyed, so that
// per-thread kernel scratch stays warm from one call to the next.
//
// Waiting: a decode step issues ~7 matrix products and a few attention/norm calls per layer,
// microseconds apart, so helpers spin (pause instructions) for a short while after each job
// before they block on a condition variable, and the caller spins for the last helper before it
// blocks. A wake-up inside the spin window costs well under a microsecond.
//
// Pinning: with `pin_cpus`, helper i runs on CPU pin_cpus[i + 1] and the caller is moved to
// pin_cpus[0] on its first ParallelFor (the rank thread of a tensor-parallel worker, or the
// engine thread). Unpinned by default: on a machine shared with other processes pinning can only
// hurt; workers pin when they own the machine's cores (`--cpu-affinity`).
//
// Thread-safety: ParallelFor may be called from any thread; calls are serialized by a mutex.
// It is not reentrant: fn must not call ParallelFor on the same pool (it would deadlock).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace estuary {

class WorkerPool {
 public:
  // `threads` >= 1 counts the caller: WorkerPool(1) runs everything on the caller's thread.
  // `pin_cpus`: empty, or `threads` CPU ids (see above).
  explicit WorkerPool(int threads, std::vector<int> pin_cpus = {});
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return size_; }

  // Runs fn(begin, end) over [0, n) split into min(parts, size(), n) contiguous parts of
  // near-equal length (part p gets [n*p/k, n*(p+1)/k)); parts <= 0 means size(). The split depends
  // only on n and the part count, never on timing, so a kernel that writes disjoint outputs per
  // part is deterministic. Returns when every part has returned.
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;
  void ParallelFor(int64_t n, const RangeFn& fn, int parts = 0);

  // A process-wide pool of one thread (runs on the caller): the default for kernels called
  // without a pool.
  static WorkerPool& Serial();

 private:
  static void RunPart(int part, int parts, int64_t n, const RangeFn& fn);
  void HelperLoop(int part, uint64_t seen);
  void PinCallerOnce();

  const int size_;
  const std::vector<int> pin_cpus_;
  std::mutex run_mutex_;  // serializes ParallelFor
  std::mutex mutex_;      // guards the condition variables' waits
  std::condition_variable wake_;
  std::condition_variable done_;
  // The current job: written by ParallelFor before state_ moves, read by the helpers after.
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0;
  std::atomic<uint64_t> state_{0};  // generation << 16 | parts; parts == 0: stop
  std::atomic<int> pending_{0};     // helpers still running the current job
  std::thread::id pinned_caller_;
  std::vector<std::thread> helpers_;
};

}  // namespace estuary
