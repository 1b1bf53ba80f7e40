#include "core/common/streamed_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace estuary {
namespace {
constexpr size_t kCacheLine = 64;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kSmallPage = 4096;
constexpr size_t kHugePageThreshold = size_t{1} << 20;

// An aligned, advised, untouched block of max(bytes, 1) bytes; the caller fills it.
void* AllocateAdvised(size_t bytes) {
  const size_t size = bytes == 0 ? 1 : bytes;
  const size_t alignment = size >= kHugePageThreshold ? kHugePage : kCacheLine;
  void* raw = nullptr;
  if (posix_memalign(&raw, alignment, size) != 0 || raw == nullptr) return nullptr;
  if (alignment == kHugePage) {
    // Advice before the first touch (the caller's fill), so that the faults take huge pages.
    // The untouched rest of the last huge page costs address space only. madvise failing (THP
    // off) leaves ordinary pages: slower, still correct.
    const auto begin = reinterpret_cast<uintptr_t>(raw);
    const auto end = (begin + size + kSmallPage - 1) & ~(kSmallPage - 1);
    madvise(raw, end - begin, MADV_HUGEPAGE);
  }
  return raw;
}

}  // namespace

void* AllocateStreamedMemory(size_t bytes) {
  void* block = AllocateAdvised(bytes);
  if (block != nullptr) std::memset(block, 0, bytes == 0 ? 1 : bytes);
  return block;
}

void* CopyToStreamedMemory(const void* src, size_t bytes) {
  void* block = AllocateAdvised(bytes);
  if (block != nullptr && bytes > 0) std::memcpy(block, src, bytes);
  return block;
}

}  // namespace estuary
