#include "core/parallel/rank_threads.h"

#include "absl/time/clock.h"
#include "core/common/logging.h"

namespace estuary::parallel {

RankThreads::RankThreads(int size, int stall_rank)
    : size_(size < 1 ? 1 : size), stall_rank_(stall_rank) {
  {
    absl::MutexLock lock(&mu_);
    results_.resize(static_cast<size_t>(size_));
  }
  for (int r = 1; r < size_; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  absl::MutexLock run_lock(&run_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void RankThreads::Finish(int rank, absl::Status status) {
  const ErrorFn* on_error = nullptr;
  {
    absl::MutexLock lock(&mu_);
    on_error = on_error_;
  }
  if (!status.ok() && on_error != nullptr && *on_error) (*on_error)(status);
  absl::MutexLock lock(&mu_);
  results_[static_cast<size_t>(rank)] = std::move(status);
  --pending_;
}

void RankThreads::MaybeStall(int rank) const {
  if (rank != stall_rank_) return;
  ESTUARY_LOG(WARNING) << "rank " << rank << " stalls for good (fault injection for tests: stall_rank)";
  while (true) absl::SleepFor(absl::Hours(1));
}

void RankThreads::Loop(int rank) {
  // Wakes on a new generation (a Run) or on stopping.
  struct Wake {
    const RankThreads* self;
    uint64_t seen;
    bool Ready() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return self->stopping_ || self->generation_ != seen;
    }
  };
  Wake wake{this, 0};
  while (true) {
    const RankFn* fn = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&wake, &Wake::Ready));
      if (stopping_) return;
      wake.seen = generation_;
      fn = fn_;
    }
    MaybeStall(rank);
    Finish(rank, (*fn)(rank));
  }
}

absl::Status RankThreads::Run(const RankFn& fn, const ErrorFn& on_error) {
  absl::MutexLock run_lock(&run_mu_);
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    on_error_ = &on_error;
    pending_ = size_;
    ++generation_;
  }
  MaybeStall(0);
  Finish(0, fn(0));
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int* pending) { return *pending == 0; }, &pending_));
  fn_ = nullptr;
  on_error_ = nullptr;
  for (const absl::Status& s : results_) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace estuary::parallel
