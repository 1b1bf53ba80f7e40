#include "core/loader/mapped_buffer.h"

#include <utility>

namespace estuary {

std::shared_ptr<Buffer> MappedRangeBuffer(std::shared_ptr<const MappedFile> file, size_t offset,
                                          size_t size) {
  // Buffer wants a mutable pointer; the mapping is PROT_READ and nothing writes to weights.
  void* data = const_cast<uint8_t*>(file->data() + offset);
  return std::make_shared<Buffer>(data, size, Device::Cpu(), MemoryKind::kMappedFile,
                                  [keep_alive = std::move(file)](void*) {});
}

}  // namespace estuary
