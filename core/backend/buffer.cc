#include "core/backend/buffer.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/common/streamed_memory.h"

namespace estuary {

std::string Device::ToString() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : absl::StrCat("cuda:", ordinal);
}

Buffer Buffer::OwnStreamedBlock(void* block, size_t size) {
  if (block == nullptr) return Buffer();
  return Buffer(block, size, Device::Cpu(), MemoryKind::kHost, [](void* p) { std::free(p); });
}

Buffer Buffer::AllocateHost(size_t size) {
  return OwnStreamedBlock(AllocateStreamedMemory(size), size);
}

Buffer Buffer::CopyToHost(const void* data, size_t size) {
  return OwnStreamedBlock(CopyToStreamedMemory(data, size), size);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = other.data_;
    size_ = other.size_;
    device_ = other.device_;
    kind_ = other.kind_;
    release_ = std::move(other.release_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.release_ = nullptr;
  }
  return *this;
}

void Buffer::Reset() {
  if (data_ != nullptr && release_) release_(data_);
  data_ = nullptr;
  size_ = 0;
  release_ = nullptr;
}

}  // namespace estuary
