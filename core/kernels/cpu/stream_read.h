#pragma once
// The machine's streaming-read bandwidth: the roofline every memory-bound decode kernel is
// measured against. Benchmarks measure it in the same binary and the same run as what they
// compare with it.

#include <cstddef>
#include <cstdint>

namespace estuary::kernels::cpu {

// Sums `bytes` (a multiple of 256) of `data` as u32 lanes with independent SIMD accumulators:
// one pass of plain reads, nothing else. Highway runtime dispatch.
uint32_t StreamSum(const uint8_t* data, size_t bytes);

// Streaming-read bandwidth in bytes per second over a buffer of `bytes` (well beyond the
// caches, e.g. 1 GiB), the best of `repetitions` passes, single thread.
double MeasureStreamReadBandwidth(size_t bytes, int repetitions);

}  // namespace estuary::kernels::cpu
