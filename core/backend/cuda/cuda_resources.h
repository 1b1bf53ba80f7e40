#pragma once
// RAII owners of CUDA runtime objects, for code that drives kernels directly (the device decode
// path in core/model/cuda): device and pinned host arrays, a stream, an event and an
// instantiated graph. Each type is move-only, frees what it owns in its destructor (errors there
// are ignored: there is nobody left to tell), and is created through a factory that returns a
// Status instead of throwing. CudaStatus turns a cudaError_t into an absl::Status.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace estuary::cuda {

// OK for cudaSuccess; RESOURCE_EXHAUSTED for an allocation failure; INTERNAL otherwise, naming
// `what` and the CUDA error.
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

namespace resources_internal {

// One owned handle plus the function that releases it.
template <typename Handle, cudaError_t (*Release)(Handle)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(Handle handle) : handle_(handle) {}
  Owned(Owned&& other) noexcept : handle_(std::exchange(other.handle_, Handle{})) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, Handle{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Reset(); }

  Handle get() const { return handle_; }
  bool empty() const { return handle_ == Handle{}; }

 private:
  void Reset() {
    if (handle_ != Handle{}) Release(handle_);
    handle_ = Handle{};
  }
  Handle handle_{};
};

inline cudaError_t FreeDevice(void* p) { return cudaFree(p); }
inline cudaError_t FreeHost(void* p) { return cudaFreeHost(p); }

}  // namespace resources_internal

// `count` elements of T in device memory of the current device, zero-filled.
template <typename T>
class DeviceArray {
 public:
  static absl::StatusOr<DeviceArray> Create(size_t count) {
    DeviceArray array;
    if (count == 0) return array;
    void* data = nullptr;
    if (absl::Status s = CudaStatus(cudaMalloc(&data, count * sizeof(T)),
                                    absl::StrCat("cudaMalloc of ", count * sizeof(T), " bytes"));
        !s.ok()) {
      return s;
    }
    array.memory_ = Memory(data);
    array.count_ = count;
    if (absl::Status s = CudaStatus(cudaMemset(data, 0, count * sizeof(T)), "cudaMemset");
        !s.ok()) {
      return s;
    }
    return array;
  }

  T* get() const { return static_cast<T*>(memory_.get()); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  using Memory = resources_internal::Owned<void*, resources_internal::FreeDevice>;
  Memory memory_;
  size_t count_ = 0;
};

// `count` elements of T in page-locked host memory (asynchronous copies need it), zero-filled.
template <typename T>
class PinnedArray {
 public:
  static absl::StatusOr<PinnedArray> Create(size_t count) {
    PinnedArray array;
    if (count == 0) return array;
    void* data = nullptr;
    if (absl::Status s =
            CudaStatus(cudaMallocHost(&data, count * sizeof(T)),
                       absl::StrCat("cudaMallocHost of ", count * sizeof(T), " bytes"));
        !s.ok()) {
      return s;
    }
    array.memory_ = Memory(data);
    array.count_ = count;
    for (size_t i = 0; i < count; ++i) array.get()[i] = T{};
    return array;
  }

  T* get() const { return static_cast<T*>(memory_.get()); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  using Memory = resources_internal::Owned<void*, resources_internal::FreeHost>;
  Memory memory_;
  size_t count_ = 0;
};

// A non-blocking stream of the current device.
class StreamHandle {
 public:
  static absl::StatusOr<StreamHandle> Create() {
    cudaStream_t stream = nullptr;
    if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;
    }
    StreamHandle handle;
    handle.stream_ = Owned(stream);
    return handle;
  }
  cudaStream_t get() const { return stream_.get(); }

 private:
  using Owned = resources_internal::Owned<cudaStream_t, cudaStreamDestroy>;
  Owned stream_;
};

// An event: with the default flags a timing event, for measuring stream work; with
// cudaEventDisableTiming a cheap marker to wait on (also inside captured graphs).
class EventHandle {
 public:
  static absl::StatusOr<EventHandle> Create(unsigned flags = cudaEventDefault) {
    cudaEvent_t event = nullptr;
    if (absl::Status s =
            CudaStatus(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags");
        !s.ok()) {
      return s;
    }
    EventHandle handle;
    handle.event_ = Owned(event);
    return handle;
  }
  cudaEvent_t get() const { return event_.get(); }

 private:
  using Owned = resources_internal::Owned<cudaEvent_t, cudaEventDestroy>;
  Owned event_;
};

// An instantiated graph, ready to launch. Made from a captured cudaGraph_t, which it destroys.
class GraphExecHandle {
 public:
  static absl::StatusOr<GraphExecHandle> Instantiate(cudaGraph_t graph) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t error = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (absl::Status s = CudaStatus(error, "cudaGraphInstantiate"); !s.ok()) return s;
    GraphExecHandle handle;
    handle.exec_ = Owned(exec);
    return handle;
  }
  cudaGraphExec_t get() const { return exec_.get(); }
  bool empty() const { return exec_.empty(); }

 private:
  using Owned = resources_internal::Owned<cudaGraphExec_t, cudaGraphExecDestroy>;
  Owned exec_;
};

}  // namespace estuary::cuda
