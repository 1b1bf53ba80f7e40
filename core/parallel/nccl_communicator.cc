#include "core/parallel/nccl_communicator.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"

namespace estuary::parallel {
namespace {

#if defined(NCCL_VERSION) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define ESTUARY_NCCL_NONBLOCKING 1
#else
#define ESTUARY_NCCL_NONBLOCKING 0
#endif

absl::Status NcclError(const char* what, ncclResult_t result) {
  return absl::InternalError(absl::StrCat(what, ": NCCL error ", static_cast<int>(result), " (",
                                          ncclGetErrorString(result), ")"));
}

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(err), " (",
                                          cudaGetErrorString(err), ")"));
}

// Short spin, then yields, then sleeps: keeps latency low for fast collectives without burning
// a core during long waits.
void Backoff(int* polls) {
  ++*polls;
  if (*polls < 64) return;
  if (*polls < 1024) {
    std::this_thread::yield();
    return;
  }
  absl::SleepFor(absl::Microseconds(50));
}

}  // namespace

void NcclAbortFlag::Raise(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (raised_.load(std::memory_order_relaxed)) return;
  status_ = reason.ok() ? absl::AbortedError("communicator aborted with an OK status") : reason;
  raised_.store(true, std::memory_order_release);
}

absl::Status NcclAbortFlag::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void NcclCommunicator::StreamDeleter::operator()(cudaStream_t s) const {
  const cudaError_t err = cudaStreamDestroy(s);
  if (err != cudaSuccess) {
    ESTUARY_LOG(ERROR) << "cudaStreamDestroy: " << cudaGetErrorString(err);
  }
}

void NcclCommunicator::DeviceFree::operator()(float* p) const {
  const cudaError_t err = cudaFree(p);
  if (err != cudaSuccess) ESTUARY_LOG(ERROR) << "cudaFree: " << cudaGetErrorString(err);
}

void NcclCommunicator::CommDestroyer::operator()(ncclComm_t comm) const {
#if ESTUARY_NCCL_NONBLOCKING
  ncclResult_t result = ncclCommFinalize(comm);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
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
    Backoff(&polls);
  }
  if (result != ncclSuccess) {
    ESTUARY_LOG(ERROR) << "ncclCommFinalize did not complete (" << ncclGetErrorString(result)
                       << "); aborting the communicator instead";
    const ncclResult_t abort_result = ncclCommAbort(comm);
    if (abort_result != ncclSuccess) {
      ESTUARY_LOG(ERROR) << "ncclCommAbort: " << ncclGetErrorString(abort_result);
    }
    return;
  }
#endif
  const ncclResult_t destroy_result = ncclCommDestroy(comm);
  if (destroy_result != ncclSuccess) {
    ESTUARY_LOG(ERROR) << "ncclCommDestroy: " << ncclGetErrorString(destroy_result);
  }
}

absl::StatusOr<ncclUniqueId> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result);
  return id;
}

NcclCommunicator::NcclCommunicator(int size, int rank, int device,
                                   std::shared_ptr<NcclAbortFlag> abort_flag)
    : size_(size), rank_(rank), device_(device), abort_flag_(std::move(abort_flag)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const ncclUniqueId& id, int size, int rank, int device, absl::Time deadline,
    std::shared_ptr<NcclAbortFlag> abort_flag) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicator: rank ", rank, " of size ", size));
  }
  if (abort_flag == nullptr) abort_flag = std::make_shared<NcclAbortFlag>();
  std::unique_ptr<NcclCommunicator> comm(
      new NcclCommunicator(size, rank, device, std::move(abort_flag)));

  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return CudaError("cudaSetDevice", err);
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError("cudaStreamCreateWithFlags", err);
  comm->stream_.reset(stream);
  float* scratch = nullptr;
  err = cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float));
  if (err != cudaSuccess) return CudaError("cudaMalloc", err);
  comm->barrier_scratch_.reset(scratch);

  ncclComm_t raw = nullptr;
#if ESTUARY_NCCL_NONBLOCKING
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t result = ncclCommInitRankConfig(&raw, size, id, rank, &config);
#else
  ncclResult_t result = ncclCommInitRank(&raw, size, id, rank);
#endif
  if (result != ncclSuccess && result != ncclInProgress) {
    if (raw != nullptr) ncclCommAbort(raw);
    return NcclError("ncclCommInitRank", result);
  }
  comm->comm_.reset(raw);
  absl::Status status = comm->WaitNotInProgress("ncclCommInitRank", deadline);
  if (!status.ok()) return status;  // Already aborted by WaitNotInProgress.
  return comm;
}

void NcclCommunicator::Abort(const absl::Status& reason) { abort_flag_->Raise(reason); }

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = std::move(status);
  if (comm_ != nullptr) {
    const ncclResult_t result = ncclCommAbort(comm_.release());
    if (result != ncclSuccess) {
      ESTUARY_LOG(ERROR) << "ncclCommAbort: " << ncclGetErrorString(result);
    }
  }
  // Raise the group flag so in-process peers stop waiting for this rank.
  abort_flag_->Raise(failed_);
  return failed_;
}

absl::Status NcclCommunicator::CheckUsable() {
  if (!failed_.ok()) return failed_;
  if (abort_flag_->raised()) return Fail(abort_flag_->status());
  const cudaError_t err = cudaSetDevice(device_);
  if (err != cudaSuccess) return Fail(CudaError("cudaSetDevice", err));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::WaitNotInProgress(const char* what, absl::Time deadline) {
  int polls = 0;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_.get(), &state);
    if (result != ncclSuccess) return Fail(NcclError("ncclCommGetAsyncError", result));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return Fail(NcclError(what, state));
    if (abort_flag_->raised()) return Fail(abort_flag_->status());
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, ": rank ", rank_, " timed out; NCCL communicator aborted")));
    }
    Backoff(&polls);
  }
}

absl::Status NcclCommunicator::Complete(const char* what, ncclResult_t enqueued,
                                        absl::Time deadline) {
  if (enqueued != ncclSuccess && enqueued != ncclInProgress) {
    return Fail(NcclError(what, enqueued));
  }
  if (enqueued == ncclInProgress) {
    absl::Status status = WaitNotInProgress(what, deadline);
    if (!status.ok()) return status;
  }
  int polls = 0;
  while (true) {
    const cudaError_t err = cudaStreamQuery(stream_.get());
    if (err == cudaSuccess) return absl::OkStatus();
    if (err != cudaErrorNotReady) return Fail(CudaError(what, err));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_.get(), &state);
    if (result != ncclSuccess) return Fail(NcclError("ncclCommGetAsyncError", result));
    if (state != ncclSuccess && state != ncclInProgress) return Fail(NcclError(what, state));
    if (abort_flag_->raised()) return Fail(abort_flag_->status());
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, ": rank ", rank_, " timed out; NCCL communicator aborted")));
    }
    Backoff(&polls);
  }
}

absl::Status NcclCommunicator::AllReduceSum(absl::Span<float> data, absl::Time deadline) {
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  return Complete("ncclAllReduce",
                  ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum,
                                comm_.get(), stream_.get()),
                  deadline);
}

absl::Status NcclCommunicator::AllGather(absl::Span<const float> send, absl::Span<float> recv,
                                         absl::Time deadline) {
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  // Only the local shape can be checked without a message; a count mismatch across ranks shows
  // up as an NCCL error or a timeout.
  if (recv.size() != send.size() * static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGather: recv has ", recv.size(),
                                                   " elements, expected ",
                                                   send.size() * size_));
  }
  return Complete("ncclAllGather",
                  ncclAllGather(send.data(), recv.data(), send.size(), ncclFloat32, comm_.get(),
                                stream_.get()),
                  deadline);
}

absl::Status NcclCommunicator::Broadcast(absl::Span<float> data, int root, absl::Time deadline) {
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " outside [0, ", size_, ")"));
  }
  return Complete("ncclBroadcast",
                  ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat32, root,
                                comm_.get(), stream_.get()),
                  deadline);
}

absl::Status NcclCommunicator::Barrier(absl::Time deadline) {
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  // NCCL has no barrier: a one-element all-reduce on scratch memory serves as one.
  return Complete("ncclAllReduce (barrier)",
                  ncclAllReduce(barrier_scratch_.get(), barrier_scratch_.get(), 1, ncclFloat32,
                                ncclSum, comm_.get(), stream_.get()),
                  deadline);
}

}  // namespace estuary::parallel
