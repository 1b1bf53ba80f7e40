#include "core/parallel/cpu_communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/common/logging.h"

namespace estuary::parallel {
namespace {

enum class Op { kAllReduceSum, kAllGather, kBroadcast, kBarrier };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduceSum:
      return "AllReduceSum";
    case Op::kAllGather:
      return "AllGather";
    case Op::kBroadcast:
      return "Broadcast";
    case Op::kBarrier:
      return "Barrier";
  }
  return "?";
}

// What one rank publishes for one collective.
struct Slot {
  uint64_t generation = ~uint64_t{0};  // Rendezvous this slot was published for.
  Op op = Op::kBarrier;
  const float* send = nullptr;  // AllGather input.
  float* data = nullptr;        // AllReduceSum / Broadcast buffer, AllGather output.
  int64_t count = 0;            // Elements per rank (AllGather: send.size()).
  int64_t recv_count = 0;       // AllGather only.
  int root = 0;                 // Broadcast only.
};

// Elements [begin, end) of `n` that rank `r` of `size` works on.
std::pair<int64_t, int64_t> Share(int64_t n, int r, int size) {
  return {n * r / size, n * (r + 1) / size};
}

}  // namespace

struct CpuCommunicatorGroup::State {
  explicit State(int n) : size(n), slots(n) {}

  const int size;

  absl::Mutex mu;
  absl::CondVar cv;
  // Counts completed first rendezvous; a rank arriving at generation g waits for g + 1.
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  std::vector<Slot> slots ABSL_GUARDED_BY(mu);
  // Verdict of the last completed rendezvous (INVALID_ARGUMENT on a mismatch). Stable until
  // every rank arrives again.
  absl::Status round_status ABSL_GUARDED_BY(mu);
  // Ranks still working on the data phase of `generation`, and the generation whose data phase
  // last finished.
  int busy ABSL_GUARDED_BY(mu) = 0;
  uint64_t data_done_generation ABSL_GUARDED_BY(mu) = 0;
  absl::Status abort_status ABSL_GUARDED_BY(mu);  // Non-OK once aborted.

  void Abort(absl::Status reason) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    AbortLocked(std::move(reason));
  }

  void AbortLocked(absl::Status reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!abort_status.ok()) return;
    if (reason.ok()) reason = absl::AbortedError("communicator aborted with an OK status");
    abort_status = std::move(reason);
    cv.SignalAll();
  }

  // Checks that every rank published the same collective. Called by the last arriver.
  absl::Status ValidateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const Slot& first = slots[0];
    for (int r = 0; r < size; ++r) {
      const Slot& s = slots[r];
      if (s.op != first.op) {
        return absl::InvalidArgumentError(absl::StrCat("collective mismatch: rank 0 called ",
                                                       OpName(first.op), ", rank ", r,
                                                       " called ", OpName(s.op)));
      }
      if (s.count != first.count) {
        return absl::InvalidArgumentError(
            absl::StrCat(OpName(s.op), ": element count mismatch: rank 0 has ", first.count,
                         ", rank ", r, " has ", s.count));
      }
      if (s.op == Op::kAllGather && s.recv_count != s.count * size) {
        return absl::InvalidArgumentError(
            absl::StrCat("AllGather: rank ", r, " recv has ", s.recv_count,
                         " elements, expected ", s.count * size));
      }
      if (s.op == Op::kBroadcast) {
        if (s.root != first.root) {
          return absl::InvalidArgumentError(absl::StrCat(
              "Broadcast: root mismatch: rank 0 has ", first.root, ", rank ", r, " has ", s.root));
        }
        if (s.root < 0 || s.root >= size) {
          return absl::InvalidArgumentError(
              absl::StrCat("Broadcast: root ", s.root, " outside [0, ", size, ")"));
        }
      }
    }
    return absl::OkStatus();
  }

  // First rendezvous: publishes `slot` for `rank` and waits for every rank until `deadline`.
  // On OK, every rank's slot is readable through `*all` until this rank calls FinishData.
  absl::Status Arrive(int rank, Slot slot, absl::Time deadline, std::vector<Slot>* all)
      ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (!abort_status.ok()) return abort_status;
    const uint64_t my_generation = generation;
    slot.generation = my_generation;
    slots[rank] = slot;
    if (++arrived == size) {
      arrived = 0;
      round_status = ValidateLocked();
      busy = round_status.ok() ? size : 0;
      ++generation;
      cv.SignalAll();
    } else {
      while (generation == my_generation && abort_status.ok()) {
        if (cv.WaitWithDeadline(&mu, deadline) && generation == my_generation &&
            abort_status.ok()) {
          std::vector<int> missing;
          for (int r = 0; r < size; ++r) {
            if (slots[r].generation != my_generation) missing.push_back(r);
          }
          AbortLocked(absl::DeadlineExceededError(absl::StrCat(
              OpName(slot.op), ": rank ", rank, " timed out waiting for rank(s) ",
              absl::StrJoin(missing, ","), "; communicator group aborted")));
        }
      }
      // The rendezvous completing wins over an abort that came after it: this rank is then
      // counted in `busy` and must go through the data phase so the others are not left waiting.
      if (generation == my_generation) return abort_status;
    }
    if (!round_status.ok()) return round_status;
    *all = slots;
    return absl::OkStatus();
  }

  // Second rendezvous: marks this rank's data work done and waits until every rank's is. Waits
  // only for bounded copying, so it takes no deadline.
  absl::Status FinishData() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (--busy == 0) {
      data_done_generation = generation;
      cv.SignalAll();
    }
    while (data_done_generation != generation) cv.Wait(&mu);
    return abort_status;
  }
};

namespace {

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(CpuCommunicatorGroup::State* state, int rank) : state_(state), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }

  absl::Status AllReduceSum(absl::Span<float> data, absl::Time deadline) override {
    Slot slot;
    slot.op = Op::kAllReduceSum;
    slot.data = data.data();
    slot.count = static_cast<int64_t>(data.size());
    std::vector<Slot> all;
    absl::Status status = state_->Arrive(rank_, slot, deadline, &all);
    if (!status.ok()) return status;
    const int n = state_->size;
    const auto [begin, end] = Share(slot.count, rank_, n);
    constexpr int64_t kBlock = 256;
    float sum[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t len = std::min(kBlock, end - b);
      std::memcpy(sum, all[0].data + b, len * sizeof(float));
      for (int r = 1; r < n; ++r) {  // Rank order 0..n-1: deterministic.
        const float* src = all[r].data + b;
        for (int64_t i = 0; i < len; ++i) sum[i] += src[i];
      }
      for (int r = 0; r < n; ++r) std::memcpy(all[r].data + b, sum, len * sizeof(float));
    }
    return state_->FinishData();
  }

  absl::Status AllGather(absl::Span<const float> send, absl::Span<float> recv,
                         absl::Time deadline) override {
    Slot slot;
    slot.op = Op::kAllGather;
    slot.send = send.data();
    slot.data = recv.data();
    slot.count = static_cast<int64_t>(send.size());
    slot.recv_count = static_cast<int64_t>(recv.size());
    std::vector<Slot> all;
    absl::Status status = state_->Arrive(rank_, slot, deadline, &all);
    if (!status.ok()) return status;
    // Each rank fills its own recv. A send that aliases this rank's own part of recv (in-place
    // gather) is left alone; other ranks only read it.
    for (int r = 0; r < state_->size; ++r) {
      float* dst = recv.data() + r * slot.count;
      if (dst != all[r].send && slot.count > 0) {
        std::memmove(dst, all[r].send, slot.count * sizeof(float));
      }
    }
    return state_->FinishData();
  }

  absl::Status Broadcast(absl::Span<float> data, int root, absl::Time deadline) override {
    Slot slot;
    slot.op = Op::kBroadcast;
    slot.data = data.data();
    slot.count = static_cast<int64_t>(data.size());
    slot.root = root;
    std::vector<Slot> all;
    absl::Status status = state_->Arrive(rank_, slot, deadline, &all);
    if (!status.ok()) return status;
    if (rank_ != root && slot.count > 0 && all[root].data != data.data()) {
      std::memcpy(data.data(), all[root].data, slot.count * sizeof(float));
    }
    return state_->FinishData();
  }

  absl::Status Barrier(absl::Time deadline) override {
    Slot slot;
    slot.op = Op::kBarrier;
    std::vector<Slot> all;
    absl::Status status = state_->Arrive(rank_, slot, deadline, &all);
    if (!status.ok()) return status;
    return state_->FinishData();
  }

  void Abort(const absl::Status& reason) override { state_->Abort(reason); }

 private:
  CpuCommunicatorGroup::State* const state_;  // Owned by the group.
  const int rank_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CpuCommunicatorGroup>> CpuCommunicatorGroup::Create(int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("communicator group size ", size, " < 1"));
  }
  return std::unique_ptr<CpuCommunicatorGroup>(new CpuCommunicatorGroup(size));
}

CpuCommunicatorGroup::CpuCommunicatorGroup(int size) : state_(std::make_unique<State>(size)) {
  ranks_.reserve(size);
  for (int r = 0; r < size; ++r) {
    ranks_.push_back(std::make_unique<CpuCommunicator>(state_.get(), r));
  }
}

CpuCommunicatorGroup::~CpuCommunicatorGroup() = default;

Communicator& CpuCommunicatorGroup::rank(int r) {
  if (r < 0 || r >= size()) {
    ESTUARY_LOG(ERROR) << "CpuCommunicatorGroup::rank(" << r << ") outside [0, " << size()
                       << ")";
    std::abort();
  }
  return *ranks_[r];
}

void CpuCommunicatorGroup::Abort(const absl::Status& reason) { state_->Abort(reason); }

}  // namespace estuary::parallel
