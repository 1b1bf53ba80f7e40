#pragma once
// The device side of NcclTransport (nccl_transport.h), behind a small interface so that the
// transport's protocol (handshake, put headers, in-order receives, flush acks, failures) is the
// same code on a GPU and in the CPU tests:
//   - MakeCudaNcclBackend: CUDA device memory and 2-rank NCCL communicators
//     (nccl_transport_cuda.cc, built with ESTUARY_CUDA; without it the factory returns
//     FAILED_PRECONDITION);
//   - FakeNcclBackend (nccl_transport_fake.h): host memory and an in-process stand-in for NCCL's
//     matched send/recv, for tests.
//
// Threading: a Backend may be used from any thread. A Link is used by one thread at a time (the
// thread that owns the endpoint or the accepted connection); different links concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace estuary::kvtransfer::nccl {

// One end of a 2-rank communicator (rank 0 sends puts, rank 1 receives them). Operations are
// asynchronous and complete in the order they were enqueued.
class Link {
 public:
  // Aborts the communicator unless Close() or Abort() was called first. Never blocks.
  virtual ~Link() = default;

  // True while set-up or the last enqueue is still in progress (a non-blocking NCCL communicator
  // reports ncclInProgress); false once the link is ready for the next call; INTERNAL once the
  // communicator failed (an NCCL asynchronous error: the caller then aborts).
  virtual absl::StatusOr<bool> InProgress() = 0;
  // Enqueues sending `bytes` bytes at `data` to the other rank / receiving them into `data`.
  // Each Send must be matched by a Recv of the same size on the other rank, in the same order.
  [[nodiscard]] virtual absl::Status Send(const void* data, size_t bytes) = 0;
  [[nodiscard]] virtual absl::Status Recv(void* data, size_t bytes) = 0;
  // A token that is Done once every operation enqueued so far has completed on this rank.
  virtual absl::StatusOr<uint64_t> Mark() = 0;
  // Whether the operations before `token` have completed; INTERNAL once the link failed.
  virtual absl::StatusOr<bool> Done(uint64_t token) = 0;
  // Aborts the communicator (ncclCommAbort): pending operations are dropped. Idempotent. The
  // other rank is not told; its operations stop completing.
  virtual void Abort() = 0;
  // The orderly close once both ranks are done (ncclCommFinalize + ncclCommDestroy), bounded by
  // `deadline`, after which it aborts instead. No other call may follow.
  virtual void Close(absl::Time deadline) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // For messages and logs, e.g. "cuda:1 (NVIDIA H200), NCCL 2.28.9".
  virtual std::string Describe() const = 0;
  // OK when [data, data + bytes) is memory this backend's links can read and write (CUDA device
  // memory of the backend's device); INVALID_ARGUMENT naming `what` otherwise (host memory,
  // another device's memory).
  virtual absl::Status CheckMemory(const void* data, size_t bytes, std::string_view what) = 0;
  // Zeroed memory of `bytes` bytes that CheckMemory accepts; released with Free.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;
  // A fresh group id (ncclUniqueId bytes) made by the rank-0 side and sent to the peer.
  virtual absl::StatusOr<std::string> NewGroupId() = 0;
  // Starts joining group `group_id` as `rank` (0 or 1) of 2. Returns at once; the link is usable
  // once InProgress() is false.
  virtual absl::StatusOr<std::unique_ptr<Link>> StartLink(std::string_view group_id, int rank) = 0;
};

// The CUDA + NCCL backend on CUDA device `device`. FAILED_PRECONDITION when there is no usable
// CUDA device (no GPU, no driver) or the build has no CUDA; INVALID_ARGUMENT for a device number
// that does not exist.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaNcclBackend(int device);

// What the CUDA backend's CheckMemory does, usable without a device: OK only for CUDA device
// memory of `device` covering [data, data + bytes); INVALID_ARGUMENT (naming `what` and the kind
// of memory found) otherwise, including when no CUDA driver is present.
absl::Status CheckCudaDeviceMemory(const void* data, size_t bytes, int device,
                                   std::string_view what);

}  // namespace estuary::kvtransfer::nccl
