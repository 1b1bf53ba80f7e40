#include "core/backend/cpu/cpu_backend.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary {
namespace {
class CpuStream final : public Stream {
 public:
  Device device() const override { return Device::Cpu(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
};
}  // namespace

absl::StatusOr<Buffer> CpuBackend::Allocate(size_t bytes, MemoryKind kind) {
  if (kind == MemoryKind::kDevice) {
    return absl::InvalidArgumentError("the CPU backend has no device memory");
  }
  if (kind == MemoryKind::kMappedFile) {
    return absl::InvalidArgumentError("a file mapping is made by mapping a file, not allocated");
  }
  Buffer buffer = Buffer::AllocateHost(bytes);
  if (buffer.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " host bytes"));
  }
  return buffer;
}

absl::StatusOr<std::unique_ptr<Stream>> CpuBackend::CreateStream() {
  return std::unique_ptr<Stream>(new CpuStream());
}

absl::Status CpuBackend::Copy(const Buffer& src, size_t src_offset, Buffer& dst,
                              size_t dst_offset, size_t bytes, Stream& stream) {
  if (!src.device().is_cpu() || !dst.device().is_cpu()) {
    return absl::InvalidArgumentError("the CPU backend copies host memory only");
  }
  ESTUARY_RETURN_IF_ERROR(CheckBufferRange(src, src_offset, bytes));
  ESTUARY_RETURN_IF_ERROR(CheckBufferRange(dst, dst_offset, bytes));
  if (bytes > 0) {
    std::memmove(static_cast<uint8_t*>(dst.data()) + dst_offset,
                 static_cast<const uint8_t*>(src.data()) + src_offset, bytes);
  }
  return absl::OkStatus();
}

}  // namespace estuary
