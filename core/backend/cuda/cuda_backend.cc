#include "core/backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/backend/cuda/cuda_fill.h"
#include "core/common/status_macros.h"

// Turns a cudaError_t into an INTERNAL Status naming the call and the place.
#define ESTUARY_CUDA_RETURN_IF_ERROR(call)                                              \
  do {                                                                                  \
    if (cudaError_t _estuary_cuda_error = (call); _estuary_cuda_error != cudaSuccess) { \
      return absl::InternalError(absl::StrCat(#call, " failed at ", __FILE__, ":",      \
                                              __LINE__, ": ",                           \
                                              cudaGetErrorString(_estuary_cuda_error)));  \
    }                                                                                   \
  } while (0)

namespace estuary {
namespace {

// Owns one cudaStream_t.
class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaStream() override { cudaStreamDestroy(stream_); }
  Device device() const override { return Device::Cuda(ordinal_); }
  absl::Status Synchronize() override {
    ESTUARY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  cudaStream_t get() const { return stream_; }

 private:
  int ordinal_;
  cudaStream_t stream_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int ordinal) : ordinal_(ordinal) {}
  Device device() const override { return Device::Cuda(ordinal_); }
  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }

  absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryKind kind) override {
    if (kind == MemoryKind::kMappedFile) {
      return absl::InvalidArgumentError("a file mapping is made by mapping a file, not allocated");
    }
    ESTUARY_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    void* data = nullptr;
    if (kind == MemoryKind::kDevice) {
      if (cudaMalloc(&data, bytes) != cudaSuccess) {
        return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", bytes, " bytes"));
      }
      ESTUARY_CUDA_RETURN_IF_ERROR(cudaMemset(data, 0, bytes));
      return Buffer(data, bytes, device(), kind, [](void* p) { cudaFree(p); });
    }
    if (cudaMallocHost(&data, bytes) != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
    }
    return Buffer(data, bytes, Device::Cpu(), kind, [](void* p) { cudaFreeHost(p); });
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    ESTUARY_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaStream_t stream = nullptr;
    ESTUARY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(new CudaStream(ordinal_, stream));
  }

  absl::Status Copy(const Buffer& src, size_t src_offset, Buffer& dst, size_t dst_offset,
                    size_t bytes, Stream& stream) override {
    ESTUARY_RETURN_IF_ERROR(CheckBufferRange(src, src_offset, bytes));
    ESTUARY_RETURN_IF_ERROR(CheckBufferRange(dst, dst_offset, bytes));
    auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
    if (cuda_stream == nullptr) return absl::InvalidArgumentError("not a CUDA stream");
    ESTUARY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        static_cast<uint8_t*>(dst.data()) + dst_offset,
        static_cast<const uint8_t*>(src.data()) + src_offset, bytes, cudaMemcpyDefault,
        cuda_stream->get()));
    return absl::OkStatus();
  }

 private:
  int ordinal_;
};

}  // namespace

int CudaDeviceCountImpl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

absl::StatusOr<Backend*> GetCudaBackend(int ordinal) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* backends = new std::map<int, std::unique_ptr<CudaBackend>>();
  const int count = CudaDeviceCountImpl();
  if (ordinal < 0 || ordinal >= count) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device ", ordinal, " (", count, " visible)"));
  }
  absl::MutexLock lock(&mu);
  auto& slot = (*backends)[ordinal];
  if (!slot) slot = std::make_unique<CudaBackend>(ordinal);
  return slot.get();
}

}  // namespace estuary
