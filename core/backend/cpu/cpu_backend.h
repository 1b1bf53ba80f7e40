#pragma once
// The CPU backend: host memory, a synchronous stream, every kernel of core/kernels/cpu.

#include "core/backend/backend.h"

namespace estuary {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "cpu"; }
  absl::StatusOr<Buffer> Allocate(size_t bytes, MemoryKind kind) override;
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override;
  absl::Status Copy(const Buffer& src, size_t src_offset, Buffer& dst, size_t dst_offset,
                    size_t bytes, Stream& stream) override;
};

}  // namespace estuary
