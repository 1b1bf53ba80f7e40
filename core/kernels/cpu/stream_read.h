#pragma once
// The machine's streaming-read bandwidth: the ceiling every memory-bound decode kernel is
// measured against (issue 18, item 1). Benchmarks measure it in the same binary and the same run
// as what they compare with it, the way the best engine reaches it: every thread of a WorkerPool
// (created once, before timing) reading its own contiguous slice of one buffer far beyond L3,
// 512-bit loads into eight independent accumulators, optional software prefetch ahead, on 2 MiB
// aligned memory with and without madvise(MADV_HUGEPAGE); the best pass of several per variant.
// Owned by the kernels; bench-decode (decode/bench_decode.h) reports against it.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace estuary::kernels::cpu {

// Sums the bytes / 4 u32 words of `data` (a trailing bytes % 4 is not read), wrapping mod 2^32,
// with eight independent SIMD accumulators. `prefetch_bytes` > 0 prefetches each cache line
// that far ahead of the loads. Any alignment. Highway runtime dispatch.
uint32_t StreamSum(const uint8_t* data, size_t bytes, size_t prefetch_bytes = 0);

struct StreamReadOptions {
  size_t bytes = size_t{1} << 30;  // rounded down to 4 KiB (at least 4 KiB)
  int repetitions = 5;             // timed passes per variant; the best counts
  int max_threads = 1;             // thread counts 1..max_threads are measured
  // Software prefetch distances tried (0: none); the best per thread count counts.
  std::vector<size_t> prefetch_bytes = {0, 2048};
};

// One measured variant: the best pass of `repetitions`.
struct StreamReadVariant {
  int threads = 0;
  bool huge_pages = false;  // madvise(MADV_HUGEPAGE); else MADV_NOHUGEPAGE
  size_t prefetch_bytes = 0;
  double bytes_per_second = 0;
};

struct StreamReadResult {
  size_t bytes = 0;  // the buffer actually read per pass
  // The fraction of each buffer the kernel backed with 2 MiB pages (AnonHugePages in
  // /proc/self/smaps; -1 where it could not be read).
  double huge_fraction_advised = -1;
  double huge_fraction_not_advised = -1;
  std::vector<StreamReadVariant> variants;  // every (threads, pages, prefetch) measured
  std::vector<StreamReadVariant> best;      // [t - 1]: the best variant at t threads
  // Every pass sums the whole buffer, filled with 0x01 bytes, into this (so the reads cannot be
  // optimized away): (bytes / 4) * 0x01010101 mod 2^32 when the passes read what they should.
  uint32_t checksum = 0;

  // The ceiling: the fastest variant at any thread count up to max_threads. On a quiet machine
  // that is all the threads of the rank; on a shared one a busy neighbour core can make fewer
  // threads faster, and a ceiling below what one thread reached would flatter the rows.
  const StreamReadVariant* ceiling() const {
    const StreamReadVariant* top = nullptr;
    for (const StreamReadVariant& v : best) {
      if (top == nullptr || v.bytes_per_second > top->bytes_per_second) top = &v;
    }
    return top;
  }
  double ceiling_bytes_per_second() const {
    return ceiling() == nullptr ? 0.0 : ceiling()->bytes_per_second;
  }
};

// Measures every variant in options. Allocates one buffer at a time (the huge-page one, then the
// other), touches every page before timing. On allocation failure returns a result with no
// variants (ceiling 0).
StreamReadResult MeasureStreamRead(const StreamReadOptions& options);

// Two measurements of the same options taken at different times (e.g. before and after a
// benchmark on a shared machine), merged: each variant keeps its faster figure, `best` is
// recomputed. Either may be empty (a failed allocation): the other is returned.
StreamReadResult FasterOf(const StreamReadResult& a, const StreamReadResult& b);

}  // namespace estuary::kernels::cpu
