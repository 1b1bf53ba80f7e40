#pragma once
// Small NCCL/CUDA helpers shared by the NCCL users (core/parallel/nccl_communicator.cc and
// kvtransfer/nccl_transport_cuda.cc). Built only with ESTUARY_CUDA.
//
// Non-blocking communicators (NCCL >= 2.14): set-up, enqueues and finalize return ncclInProgress
// and complete in the background; callers poll NcclPollInProgress with their own deadline, so
// no NCCL call can hang a thread. With an older NCCL the blocking API is used and set-up is not
// bounded by a deadline.

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/common/poll_backoff.h"

#if defined(NCCL_VERSION) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define ESTUARY_NCCL_NONBLOCKING 1
#else
#define ESTUARY_NCCL_NONBLOCKING 0
#endif

namespace estuary::parallel {

// INTERNAL "<what>: NCCL error <n> (<string>)", plus ncclGetLastError(comm) when `comm` is set.
absl::Status NcclError(const char* what, ncclResult_t result, ncclComm_t comm = nullptr);
// INTERNAL "<what>: CUDA error <n> (<string>)".
absl::Status CudaError(const char* what, cudaError_t err);

// PollBackoff (core/common/poll_backoff.h): spin, yield, then 50 us sleeps.
inline void NcclBackoff(int* polls) { PollBackoff(polls); }

// Starts joining group `id` as `rank` of `size` on the current CUDA device, non-blocking where
// NCCL supports it (then the communicator may still be ncclInProgress: poll it). On error nothing
// is left to clean up.
absl::StatusOr<ncclComm_t> NcclStartInitRank(const ncclUniqueId& id, int size, int rank);

// ncclCommGetAsyncError: true while the communicator is ncclInProgress (set-up, a non-blocking
// enqueue or a finalize still running), false when it is ready, an error when it failed.
absl::StatusOr<bool> NcclPollInProgress(ncclComm_t comm, const char* what);

// The orderly close: ncclCommFinalize, polled until `deadline`, then ncclCommDestroy; when the
// finalize fails or does not finish in time the communicator is aborted instead. Logs errors.
void NcclCloseComm(ncclComm_t comm, absl::Time deadline);
// ncclCommAbort, logging an error. The error path: never blocks on the peer.
void NcclAbortComm(ncclComm_t comm);

}  // namespace estuary::parallel
