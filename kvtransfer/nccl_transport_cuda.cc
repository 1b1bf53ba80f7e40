// The CUDA + NCCL backend of NcclTransport (nccl_transport_backend.h). Built with ESTUARY_CUDA.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/parallel/nccl_util.h"
#include "kvtransfer/nccl_transport_backend.h"

namespace estuary::kvtransfer::nccl {
namespace {

using parallel::CudaError;
using parallel::NcclError;

// Makes `device` the calling thread's current CUDA device for the scope, then restores the
// previous one (the transport runs on its callers' threads and must not move them).
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_) set_ = cudaSetDevice(device_);
  }
  ~DeviceScope() {
    if (set_ == cudaSuccess && previous_ >= 0 && previous_ != device_) {
      (void)cudaSetDevice(previous_);
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  absl::Status status() const {
    return set_ == cudaSuccess ? absl::OkStatus() : CudaError("cudaSetDevice", set_);
  }

 private:
  const int device_;
  int previous_ = -1;
  cudaError_t set_ = cudaSuccess;
};

const char* MemoryKind(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered:
      return "host memory (not known to CUDA)";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
  }
  return "memory of an unknown kind";
}

absl::Status CheckPointer(const void* p, const void* base, size_t bytes, int device,
                          std::string_view what) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  const std::string where = absl::StrFormat("%s at %p (%u bytes)", std::string(what), base, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; clear it for later calls
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is not CUDA device memory: cudaPointerGetAttributes: ", cudaGetErrorString(err)));
  }
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is ", MemoryKind(attr.type),
        "; the NCCL transport moves CUDA device memory only (use the UCX transport for host "
        "memory)"));
  }
  if (attr.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is memory of CUDA device ", attr.device,
                                                   ", but this NCCL transport uses device ",
                                                   device));
  }
  return absl::OkStatus();
}

class CudaNcclLink : public Link {
 public:
  static absl::StatusOr<std::unique_ptr<Link>> Start(int device, std::string_view group, int rank) {
    if (group.size() != sizeof(ncclUniqueId)) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL group id of ", group.size(),
                                                     " bytes; expected ", sizeof(ncclUniqueId)));
    }
    if (rank != 0 && rank != 1) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL link rank ", rank, " (0 or 1)"));
    }
    DeviceScope scope(device);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    std::unique_ptr<CudaNcclLink> link(new CudaNcclLink(device, rank));
    cudaError_t err = cudaStreamCreateWithFlags(&link->stream_, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      link->stream_ = nullptr;
      return CudaError("cudaStreamCreateWithFlags", err);
    }
    ncclUniqueId id;
    std::memcpy(&id, group.data(), sizeof(id));
    ESTUARY_ASSIGN_OR_RETURN(link->comm_, parallel::NcclStartInitRank(id, 2, rank));
    return std::unique_ptr<Link>(std::move(link));
  }

  ~CudaNcclLink() override {
    DeviceScope scope(device_);
    if (comm_ != nullptr) parallel::NcclAbortComm(comm_);
    for (const auto& [token, event] : events_) (void)cudaEventDestroy(event);
    for (cudaEvent_t event : free_events_) (void)cudaEventDestroy(event);
    if (stream_ != nullptr) {
      const cudaError_t err = cudaStreamDestroy(stream_);
      if (err != cudaSuccess)
        ESTUARY_LOG(ERROR) << "cudaStreamDestroy: " << cudaGetErrorString(err);
    }
  }

  absl::StatusOr<bool> InProgress() override {
    ESTUARY_RETURN_IF_ERROR(Usable());
    return parallel::NcclPollInProgress(comm_, "NCCL communicator");
  }

  absl::Status Send(const void* data, size_t bytes) override {
    ESTUARY_RETURN_IF_ERROR(Usable());
    DeviceScope scope(device_);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    const ncclResult_t r = ncclSend(data, bytes, ncclUint8, 1 - rank_, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclSend", r, comm_);
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, size_t bytes) override {
    ESTUARY_RETURN_IF_ERROR(Usable());
    DeviceScope scope(device_);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    const ncclResult_t r = ncclRecv(data, bytes, ncclUint8, 1 - rank_, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclRecv", r, comm_);
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Mark() override {
    ESTUARY_RETURN_IF_ERROR(Usable());
    DeviceScope scope(device_);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    cudaEvent_t event = nullptr;
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    } else {
      const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (err != cudaSuccess) return CudaError("cudaEventCreateWithFlags", err);
    }
    const cudaError_t err = cudaEventRecord(event, stream_);
    if (err != cudaSuccess) {
      free_events_.push_back(event);
      return CudaError("cudaEventRecord", err);
    }
    events_.emplace_back(++last_token_, event);
    return last_token_;
  }

  absl::StatusOr<bool> Done(uint64_t token) override {
    ESTUARY_RETURN_IF_ERROR(Usable());
    DeviceScope scope(device_);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    while (!events_.empty() && events_.front().first <= token) {
      const cudaError_t err = cudaEventQuery(events_.front().second);
      if (err == cudaErrorNotReady) {
        // Still running: report the communicator's asynchronous errors, if any.
        ESTUARY_RETURN_IF_ERROR(parallel::NcclPollInProgress(comm_, "NCCL communicator").status());
        return false;
      }
      if (err != cudaSuccess) return CudaError("cudaEventQuery", err);
      free_events_.push_back(events_.front().second);
      events_.pop_front();
    }
    return true;
  }

  void Abort() override {
    if (comm_ == nullptr) return;
    DeviceScope scope(device_);
    parallel::NcclAbortComm(comm_);
    comm_ = nullptr;
    ended_ = true;
  }

  void Close(absl::Time deadline) override {
    if (comm_ == nullptr) return;
    DeviceScope scope(device_);
    parallel::NcclCloseComm(comm_, deadline);
    comm_ = nullptr;
    ended_ = true;
  }

 private:
  CudaNcclLink(int device, int rank) : device_(device), rank_(rank) {}

  absl::Status Usable() const {
    if (ended_ || comm_ == nullptr) {
      return absl::FailedPreconditionError("the NCCL communicator was closed or aborted");
    }
    return absl::OkStatus();
  }

  const int device_;
  const int rank_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;  // null once closed or aborted
  bool ended_ = false;
  uint64_t last_token_ = 0;
  std::deque<std::pair<uint64_t, cudaEvent_t>> events_;  // recorded, oldest first
  std::vector<cudaEvent_t> free_events_;                 // completed, for reuse
};

class CudaNcclBackend : public Backend {
 public:
  CudaNcclBackend(int device, std::string description)
      : device_(device), description_(std::move(description)) {}

  std::string Describe() const override { return description_; }

  absl::Status CheckMemory(const void* data, size_t bytes, std::string_view what) override {
    return CheckCudaDeviceMemory(data, bytes, device_, what);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    DeviceScope scope(device_);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", bytes, " bytes on device ", device_, ": out of memory"));
    }
    if (err != cudaSuccess) return CudaError("cudaMalloc", err);
    // On the legacy default stream, which does not wait for the transport's non-blocking streams.
    err = cudaMemset(p, 0, bytes);
    if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
    if (err != cudaSuccess) {
      (void)cudaFree(p);
      return CudaError("cudaMemset", err);
    }
    return p;
  }

  void Free(void* data) override {
    DeviceScope scope(device_);
    const cudaError_t err = cudaFree(data);
    if (err != cudaSuccess) ESTUARY_LOG(ERROR) << "cudaFree: " << cudaGetErrorString(err);
  }

  absl::StatusOr<std::string> NewGroupId() override {
    DeviceScope scope(device_);
    ESTUARY_RETURN_IF_ERROR(scope.status());
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r);
    return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
  }

  absl::StatusOr<std::unique_ptr<Link>> StartLink(std::string_view group_id, int rank) override {
    return CudaNcclLink::Start(device_, group_id, rank);
  }

 private:
  const int device_;
  const std::string description_;
};

}  // namespace

absl::Status CheckCudaDeviceMemory(const void* data, size_t bytes, int device,
                                   std::string_view what) {
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is a null pointer"));
  }
  ESTUARY_RETURN_IF_ERROR(CheckPointer(data, data, bytes, device, what));
  if (bytes > 1) {
    // The last byte too: a range that runs off the end of a device allocation into host memory
    // (or another allocation of another device) is refused as well.
    const void* last = static_cast<const char*>(data) + (bytes - 1);
    ESTUARY_RETURN_IF_ERROR(CheckPointer(last, data, bytes, device, what));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaNcclBackend(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " is not a device"));
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL transport needs a CUDA device, but CUDA reports none: "
                     "cudaGetDeviceCount: ",
                     cudaGetErrorString(err)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("the NCCL transport needs a CUDA device; there is none");
  }
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " requested, but only ",
                                                   count, " device(s) are visible"));
  }
  int version = 0;
  const ncclResult_t r = ncclGetVersion(&version);
  if (r != ncclSuccess) return NcclError("ncclGetVersion", r);
  if (version < NCCL_VERSION(2, 14, 0) || !ESTUARY_NCCL_NONBLOCKING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the NCCL transport needs non-blocking NCCL communicators (NCCL >= 2.14); the library "
        "is version code ",
        version));
  }
  cudaDeviceProp prop{};
  std::string name = "unknown device";
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) name = prop.name;
  return std::unique_ptr<Backend>(new CudaNcclBackend(
      device, absl::StrCat("cuda:", device, " (", name, "), NCCL version code ", version)));
}

}  // namespace estuary::kvtransfer::nccl
