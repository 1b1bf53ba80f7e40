#pragma once
// NCCL communicator for ranks on GPUs (design §6). Built only with ESTUARY_CUDA.
//
// Spans passed to the collectives point to DEVICE memory on this rank's device; the calls
// enqueue NCCL work on the communicator's own stream and then poll (cudaStreamQuery,
// ncclCommGetAsyncError) until the work finishes, NCCL reports an error (INTERNAL), the group
// abort flag is raised, or the deadline passes (DEADLINE_EXCEEDED). On any failure the NCCL
// communicator is aborted with ncclCommAbort so that no collective can hang this rank, and every
// later call returns the same status.
//
// Abort() raises the shared NcclAbortFlag. Ranks of the same process that share the flag notice
// it in their poll loop and abort their own communicators; ranks in other processes notice via
// their own deadline or an NCCL error. ncclCommAbort is always called on the rank's own thread.
//
// Ownership: the object owns its ncclComm_t and cudaStream_t. The destructor runs the orderly
// close (ncclCommFinalize + ncclCommDestroy) unless the communicator was aborted; it logs errors
// and continues.

#include <atomic>
#include <memory>

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/parallel/communicator.h"

namespace estuary::parallel {

// Thread-safe abort signal shared by the ranks of one group that live in this process.
class NcclAbortFlag {
 public:
  // Sets the status once; later calls are ignored. An OK status becomes ABORTED.
  void Raise(const absl::Status& reason);
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  absl::Status status() const;

 private:
  std::atomic<bool> raised_{false};
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class NcclCommunicator final : public Communicator {
 public:
  // A fresh id, made by one rank and handed to the others out of band.
  [[nodiscard]] static absl::StatusOr<ncclUniqueId> NewUniqueId();

  // Joins the group `id` as `rank` of `size` on CUDA device `device`. Uses a non-blocking NCCL
  // config where NCCL supports it, so set-up is bounded by `deadline` too. `abort_flag` may be
  // null (then Abort() affects only this rank); share one flag among the ranks of a process.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const ncclUniqueId& id, int size, int rank, int device, absl::Time deadline,
      std::shared_ptr<NcclAbortFlag> abort_flag);

  ~NcclCommunicator() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(absl::Span<float> data, absl::Time deadline) override;
  absl::Status AllGather(absl::Span<const float> send, absl::Span<float> recv,
                         absl::Time deadline) override;
  absl::Status Broadcast(absl::Span<float> data, int root, absl::Time deadline) override;
  absl::Status Barrier(absl::Time deadline) override;
  void Abort(const absl::Status& reason) override;

  cudaStream_t stream() const { return stream_.get(); }

 private:
  struct StreamDeleter {
    void operator()(cudaStream_t s) const;
  };
  using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;
  // The orderly close: ncclCommFinalize (bounded wait) + ncclCommDestroy. The error path
  // releases the pointer and calls ncclCommAbort instead.
  struct CommDestroyer {
    void operator()(ncclComm_t comm) const;
  };
  using CommPtr = std::unique_ptr<ncclComm, CommDestroyer>;
  struct DeviceFree {
    void operator()(float* p) const;
  };
  using DeviceFloatPtr = std::unique_ptr<float, DeviceFree>;

  NcclCommunicator(int size, int rank, int device, std::shared_ptr<NcclAbortFlag> abort_flag);

  // Checks the result of enqueuing an NCCL call, then polls until the stream is done.
  absl::Status Complete(const char* what, ncclResult_t enqueued, absl::Time deadline);
  // Waits while the communicator reports ncclInProgress (non-blocking config).
  absl::Status WaitNotInProgress(const char* what, absl::Time deadline);
  // Aborts the NCCL communicator (own thread only) and records `status`; returns it.
  absl::Status Fail(absl::Status status);
  absl::Status CheckUsable();

  const int size_;
  const int rank_;
  const int device_;
  std::shared_ptr<NcclAbortFlag> abort_flag_;  // Shared with the group; never null.
  absl::Status failed_;                         // Set on this rank's thread once it fails.
  // Declared in reverse teardown order: the communicator is closed before its stream goes.
  StreamPtr stream_;
  DeviceFloatPtr barrier_scratch_;  // One float on the device for Barrier's all-reduce.
  CommPtr comm_;  // Null after an abort.
};

}  // namespace estuary::parallel
