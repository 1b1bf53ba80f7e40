#pragma once
// Buffers over ranges of a memory-mapped file, for tensors that are never copied.

#include <cstddef>
#include <memory>

#include "core/backend/buffer.h"
#include "core/common/mapped_file.h"

namespace estuary {

// A host Buffer over bytes [offset, offset + size) of `file` (the caller checks the range).
// The buffer's releaser holds a reference to the file, so the mapping outlives every tensor
// viewing it. The memory is mapped read-only: writing through the buffer faults.
std::shared_ptr<Buffer> MappedRangeBuffer(std::shared_ptr<const MappedFile> file, size_t offset,
                                          size_t size);

}  // namespace estuary
