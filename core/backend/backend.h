#pragma once
// Backend: one device's allocator, streams and copies (the ggml split of allocation and stream;
// kernels are not dispatched through it: an engine's steps go through core/model/step_runner.h). The CPU backend is always present; the CUDA backend exists when built with
// ESTUARY_CUDA and a GPU is visible. Obtain backends from the registry (GetBackend); the registry
// owns them for the life of the process and they are thread-safe.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/backend/buffer.h"
#include "core/backend/device.h"

namespace estuary {

// An ordered queue of work on a device. The CPU stream runs everything synchronously.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  // Blocks until all work queued on the stream is done; reports a device error if one occurred.
  [[nodiscard]] virtual absl::Status Synchronize() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // Allocates `bytes` of `kind` memory. RESOURCE_EXHAUSTED when the device is out of memory;
  // INVALID_ARGUMENT for a kind the backend cannot provide.
  virtual absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryKind kind) = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  // Copies `bytes` from `src` to `dst` (host or this device's memory) in stream order.
  [[nodiscard]] virtual absl::Status Copy(const Buffer& src, size_t src_offset, Buffer& dst,
                                          size_t dst_offset, size_t bytes, Stream& stream) = 0;
};

// Checks that [offset, offset + bytes) lies inside `buffer`; OUT_OF_RANGE otherwise.
[[nodiscard]] absl::Status CheckBufferRange(const Buffer& buffer, size_t offset, size_t bytes);

// The backend for `device`: the CPU backend, or the CUDA backend of that ordinal.
// UNIMPLEMENTED when the binary was built without CUDA; UNAVAILABLE when no such GPU exists.
absl::StatusOr<Backend*> GetBackend(Device device);

// Number of CUDA devices visible (0 without CUDA support or without a GPU).
int CudaDeviceCount();

// Parses a --device value: "cpu", "cuda" (device 0) or "cuda:N". INVALID_ARGUMENT otherwise.
// Does not check that the device exists.
absl::StatusOr<Device> ParseDevice(std::string_view text);

}  // namespace estuary
