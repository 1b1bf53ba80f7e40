#pragma once
// Buffer: a move-only owner of one byte range on one device. What "owning" means is given by
// the releaser: free() for host allocations, cudaFree for device memory, or dropping a reference
// to a memory-mapped file for weights that were never copied. A borrowed buffer has no releaser.

#include <cstddef>
#include <functional>

#include "core/backend/device.h"

namespace estuary {

class Buffer {
 public:
  using Releaser = std::function<void(void*)>;

  Buffer() = default;
  Buffer(void* data, size_t size, Device device, MemoryKind kind, Releaser release)
      : data_(data), size_(size), device_(device), kind_(kind), release_(std::move(release)) {}
  // A view of memory owned elsewhere; the owner must outlive the buffer.
  static Buffer Borrow(void* data, size_t size, Device device, MemoryKind kind) {
    return Buffer(data, size, device, kind, nullptr);
  }
  // Zero-filled host memory, 64-byte aligned, and 2 MiB aligned on huge pages from 1 MiB up
  // (core/common/streamed_memory.h). Returns an empty buffer when allocation fails.
  static Buffer AllocateHost(size_t size);
  // The same kind of host memory holding a copy of data[0, size), not zero-filled first. Returns
  // an empty buffer when allocation fails.
  static Buffer CopyToHost(const void* data, size_t size);

  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }
  MemoryKind memory_kind() const { return kind_; }
  bool empty() const { return data_ == nullptr; }

 private:
  // Takes `block` (from core/common/streamed_memory.h, freed with std::free) as a host buffer of
  // `size` bytes; an empty buffer when `block` is null.
  static Buffer OwnStreamedBlock(void* block, size_t size);
  void Reset();

  void* data_ = nullptr;
  size_t size_ = 0;
  Device device_;
  MemoryKind kind_ = MemoryKind::kHost;
  Releaser release_;
};

}  // namespace estuary
