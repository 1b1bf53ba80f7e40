#pragma once
// Collective communication between the tensor-parallel ranks of one worker (design §6).
//
// A group of `size()` ranks runs the same sequence of collectives. Each rank holds its own
// Communicator object, owned by whoever created the group (see CpuCommunicatorGroup and
// NcclCommunicator), and calls it from that rank's thread only: the collectives are not
// thread-safe on one object. Abort() is the exception and may be called from any thread.
//
// Every collective takes an absl::Time deadline and returns an absl::Status; no call blocks
// forever (style §3.2):
//   - DEADLINE_EXCEEDED: some rank did not arrive (or the operation did not finish) in time.
//     The group is then aborted, so every other rank's pending and future collectives fail too
//     instead of hanging; the current batch fails as a whole.
//   - INVALID_ARGUMENT: the ranks disagree on the operation, element count or root (reported on
//     every rank where the implementation can detect it), or a local argument is malformed.
//   - After Abort(reason): every pending and future collective on every rank returns `reason`
//     (callers normally pass ABORTED or FAILED_PRECONDITION). A group cannot be revived; build a
//     new one.
//
// Whether spans point to host or device memory depends on the implementation: host memory for
// CpuCommunicator, device memory for NcclCommunicator. Buffers must stay valid until the call
// returns; nothing is retained after it returns.

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace estuary::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // This rank's index in [0, size()).
  virtual int rank() const = 0;
  // Number of ranks in the group.
  virtual int size() const = 0;

  // In place: afterwards `data` on every rank holds the element-wise sum over all ranks.
  // All ranks pass the same data.size().
  [[nodiscard]] virtual absl::Status AllReduceSum(absl::Span<float> data,
                                                  absl::Time deadline) = 0;

  // recv.size() == size() * send.size(); afterwards recv holds every rank's `send`, rank-major
  // (rank k's elements at [k * send.size(), (k + 1) * send.size())). All ranks pass the same
  // send.size().
  [[nodiscard]] virtual absl::Status AllGather(absl::Span<const float> send,
                                               absl::Span<float> recv, absl::Time deadline) = 0;

  // Afterwards `data` on every rank equals `data` on rank `root`. All ranks pass the same root
  // and data.size().
  [[nodiscard]] virtual absl::Status Broadcast(absl::Span<float> data, int root,
                                               absl::Time deadline) = 0;

  // Returns once every rank has entered Barrier.
  [[nodiscard]] virtual absl::Status Barrier(absl::Time deadline) = 0;

  // Thread-safe. Fails the group: every pending and future collective on every rank returns
  // `reason` (an OK reason is replaced by ABORTED). The first abort wins; later calls are no-ops.
  virtual void Abort(const absl::Status& reason) = 0;

 protected:
  Communicator() = default;
};

}  // namespace estuary::parallel
