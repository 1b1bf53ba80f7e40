#pragma once
// Shared-memory communicator for ranks that are threads of one process (design §6). This is
// the implementation CI tests tensor parallelism with.
//
//   ESTUARY_ASSIGN_OR_RETURN(auto group, CpuCommunicatorGroup::Create(tp_size));
//   // thread r:
//   ESTUARY_RETURN_IF_ERROR(group->rank(r).AllReduceSum(partial, deadline));
//
// Each collective is a rendezvous: every rank publishes its buffer pointers and waits for the
// others (the only wait bounded by the deadline); then each rank does its own share of the work
// (for AllReduceSum: reduces its 1/size slice of the elements over ranks 0..size-1, in that
// order, and writes the sum into every rank's buffer, i.e. a fused reduce-scatter + all-gather);
// then a second rendezvous so that no rank returns, and reuses or frees its buffer, while
// another rank still touches it. The second wait only waits for bounded copying and ignores the
// deadline; it never waits for a rank that has not arrived.
//
// Determinism: every element is summed by exactly one rank in rank order 0..size-1 and copied
// to all, so results are bitwise identical on every rank and across runs.
//
// Mismatched collectives (different op, element count or root across ranks, or a malformed
// AllGather recv size) are detected at the rendezvous and return INVALID_ARGUMENT on every rank;
// they do not abort the group.

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/parallel/communicator.h"

namespace estuary::parallel {

class CpuCommunicatorGroup {
 public:
  // Creates `size` ranks (size >= 1). INVALID_ARGUMENT when size < 1.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CpuCommunicatorGroup>> Create(int size);

  ~CpuCommunicatorGroup();
  CpuCommunicatorGroup(const CpuCommunicatorGroup&) = delete;
  CpuCommunicatorGroup& operator=(const CpuCommunicatorGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }

  // Rank r's communicator, for use by rank r's thread only. Owned by the group, which must
  // outlive every call on it. CHECK-fails for r outside [0, size()).
  Communicator& rank(int r);

  // Same as rank(r).Abort(reason) for any r; thread-safe.
  void Abort(const absl::Status& reason);

  struct State;  // Shared rendezvous state; defined in the .cc.

 private:
  explicit CpuCommunicatorGroup(int size);

  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> ranks_;  // Destroyed before state_.
};

}  // namespace estuary::parallel
