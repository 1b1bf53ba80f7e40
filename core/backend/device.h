#pragma once
// Where memory lives and kernels run.

#include <cstdint>
#include <string>

namespace estuary {

enum class DeviceKind : uint8_t { kCpu, kCuda };

// Host memory is plain or page-locked (for fast device copies), or a read-only view of a
// memory-mapped file (weights served from the checkpoint, never allocated by a backend); device
// memory is on a GPU.
enum class MemoryKind : uint8_t { kHost, kPinnedHost, kMappedFile, kDevice };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;

  static Device Cpu() { return Device{}; }
  static Device Cuda(int ordinal) { return Device{DeviceKind::kCuda, ordinal}; }
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  std::string ToString() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace estuary
