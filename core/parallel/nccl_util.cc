#include "core/parallel/nccl_util.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"

namespace estuary::parallel {

absl::Status NcclError(const char* what, ncclResult_t result, ncclComm_t comm) {
  std::string message = absl::StrCat(what, ": NCCL error ", static_cast<int>(result), " (",
                                     ncclGetErrorString(result), ")");
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, ": ", last);
  }
  return absl::InternalError(message);
}

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(err), " (",
                                          cudaGetErrorString(err), ")"));
}

absl::StatusOr<ncclComm_t> NcclStartInitRank(const ncclUniqueId& id, int size, int rank) {
  ncclComm_t comm = nullptr;
#if ESTUARY_NCCL_NONBLOCKING
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
#else
  const ncclResult_t result = ncclCommInitRank(&comm, size, id, rank);
#endif
  if (result != ncclSuccess && result != ncclInProgress) {
    absl::Status status = NcclError("ncclCommInitRank", result, comm);
    if (comm != nullptr) NcclAbortComm(comm);
    return status;
  }
  return comm;
}

absl::StatusOr<bool> NcclPollInProgress(ncclComm_t comm, const char* what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
  if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result, comm);
  if (state == ncclInProgress) return true;
  if (state != ncclSuccess) return NcclError(what, state, comm);
  return false;
}

void NcclCloseComm(ncclComm_t comm, absl::Time deadline) {
#if ESTUARY_NCCL_NONBLOCKING
  ncclResult_t result = ncclCommFinalize(comm);
  int polls = 0;
  while (result == ncclSuccess || result == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) break;
    result = state;
    if (state != ncclInProgress) break;
    if (absl::Now() > deadline) {
      result = ncclInProgress;
      break;
    }
    NcclBackoff(&polls);
  }
  if (result != ncclSuccess) {
    ESTUARY_LOG(ERROR) << "ncclCommFinalize did not complete (" << ncclGetErrorString(result)
                       << "); aborting the communicator instead";
    NcclAbortComm(comm);
    return;
  }
#endif
  const ncclResult_t destroy_result = ncclCommDestroy(comm);
  if (destroy_result != ncclSuccess) {
    ESTUARY_LOG(ERROR) << "ncclCommDestroy: " << ncclGetErrorString(destroy_result);
  }
}

void NcclAbortComm(ncclComm_t comm) {
  const ncclResult_t result = ncclCommAbort(comm);
  if (result != ncclSuccess) ESTUARY_LOG(ERROR) << "ncclCommAbort: " << ncclGetErrorString(result);
}

}  // namespace estuary::parallel
