#include "core/common/worker_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <utility>

namespace estuary {
namespace {

// ~0.3 ms of pause instructions on Zen 4: longer than the gap between two kernels of one decode
// step, far shorter than a scheduler quantum.
constexpr int kSpins = 1 << 14;

template <class Pred>
bool Spin(const Pred& ready) {
  for (int i = 0; i < kSpins; ++i) {
    if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return ready();
}

void PinCurrentThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  // Best effort: a CPU outside this process's cgroup leaves the thread where it was.
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

WorkerPool::WorkerPool(int threads, std::vector<int> pin_cpus)
    : size_(std::clamp(threads, 1, 0xFFFF)), pin_cpus_(std::move(pin_cpus)) {
  helpers_.reserve(static_cast<size_t>(size_ - 1));
  for (int part = 1; part < size_; ++part) {
    helpers_.emplace_back([this, part] {
      if (static_cast<size_t>(part) < pin_cpus_.size()) PinCurrentThread(pin_cpus_[part]);
      HelperLoop(part, 0);
    });
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 16) + 1;
    state_.store(generation << 16, std::memory_order_release);  // parts 0: stop
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

WorkerPool& WorkerPool::Serial() {
  static WorkerPool* pool = new WorkerPool(1);  // no threads; never destroyed
  return *pool;
}

void WorkerPool::RunPart(int part, int parts, int64_t n, const RangeFn& fn) {
  const int64_t begin = n * part / parts;
  const int64_t end = n * (part + 1) / parts;
  if (begin < end) fn(begin, end);
}

void WorkerPool::PinCallerOnce() {
  if (pin_cpus_.empty() || pinned_caller_ == std::this_thread::get_id()) return;
  PinCurrentThread(pin_cpus_[0]);
  pinned_caller_ = std::this_thread::get_id();
}

void WorkerPool::ParallelFor(int64_t n, const RangeFn& fn, int parts) {
  if (n <= 0) return;
  if (parts <= 0) parts = size_;
  parts = static_cast<int>(std::min<int64_t>({parts, size_, n}));
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  PinCallerOnce();
  if (parts == 1) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  pending_.store(parts - 1, std::memory_order_relaxed);
  {
    // One word carries the job's generation and part count so that a helper reads both
    // consistently; the release publishes job_ and job_n_.
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 16) + 1;
    state_.store(generation << 16 | static_cast<uint64_t>(parts), std::memory_order_release);
  }
  wake_.notify_all();
  RunPart(0, parts, n, fn);
  const auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!Spin(done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, done);
  }
}

void WorkerPool::HelperLoop(int part, uint64_t seen) {
  for (;;) {
    const auto moved = [&] { return state_.load(std::memory_order_acquire) != seen; };
    if (!Spin(moved)) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, moved);
    }
    seen = state_.load(std::memory_order_acquire);
    const int parts = static_cast<int>(seen & 0xFFFF);
    if (parts == 0) return;          // the destructor's stop
    if (part >= parts) continue;     // not needed for this job
    // The job stays valid until every needed helper has decremented pending_.
    RunPart(part, parts, job_n_, *job_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

}  // namespace estuary
