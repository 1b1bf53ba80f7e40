#include "core/parallel/nccl_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/parallel/nccl_util.h"

namespace estuary::parallel {
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
  NcclCloseComm(comm, absl::Now() + absl::Seconds(10));
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

  absl::StatusOr<ncclComm_t> raw = NcclStartInitRank(id, size, rank);
  if (!raw.ok()) return raw.status();
  comm->comm_.reset(*raw);
  absl::Status status = comm->WaitNotInProgress("ncclCommInitRank", deadline);
  if (!status.ok()) return status;  // Already aborted by WaitNotInProgress.
  return comm;
}

void NcclCommunicator::Abort(const absl::Status& reason) { abort_flag_->Raise(reason); }

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = std::move(status);
  if (comm_ != nullptr) NcclAbortComm(comm_.release());
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
    const absl::StatusOr<bool> in_progress = NcclPollInProgress(comm_.get(), what);
    if (!in_progress.ok()) return Fail(in_progress.status());
    if (!*in_progress) return absl::OkStatus();
    if (abort_flag_->raised()) return Fail(abort_flag_->status());
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, ": rank ", rank_, " timed out; NCCL communicator aborted")));
    }
    NcclBackoff(&polls);
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
    const absl::StatusOr<bool> in_progress = NcclPollInProgress(comm_.get(), what);
    if (!in_progress.ok()) return Fail(in_progress.status());
    if (abort_flag_->raised()) return Fail(abort_flag_->status());
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, ": rank ", rank_, " timed out; NCCL communicator aborted")));
    }
    NcclBackoff(&polls);
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
