#pragma once
// Host memory for data the kernels stream every step (weights, int4 matrices): large blocks
// start on a 2 MiB boundary and are advised for transparent huge pages, so that a pass over a
// gigabyte of weights walks a few hundred page-table entries instead of a quarter of a million.
// On this kind of virtual machine that is the difference between 3 and 25+ GB/s for a decode
// GEMV (README: "Weights in memory"). The caller owns the block and frees it with std::free.

#include <cstddef>

namespace estuary {

// Zero-filled, at least 64-byte aligned, `bytes` (0 counts as 1) long; blocks of 1 MiB and more
// are 2 MiB aligned and MADV_HUGEPAGE-advised before they are first touched. nullptr when the
// allocation fails.
void* AllocateStreamedMemory(size_t bytes);

// The same kind of block holding a copy of src[0, bytes): the copy is its first touch (no zero
// fill before it). nullptr when the allocation fails.
void* CopyToStreamedMemory(const void* src, size_t bytes);

}  // namespace estuary
