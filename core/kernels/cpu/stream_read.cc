#include "core/kernels/cpu/stream_read.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "core/common/worker_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/kernels/cpu/stream_read.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace estuary::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Eight vectors per iteration into eight accumulators (no dependency between consecutive loads),
// then whole vectors, then the scalar words.
uint32_t StreamSumImpl(const uint8_t* HWY_RESTRICT data, size_t bytes, size_t prefetch_bytes) {
  const hn::ScalableTag<uint32_t> d;
  const size_t n = hn::Lanes(d);
  const auto* p = reinterpret_cast<const uint32_t*>(data);
  const size_t count = bytes / sizeof(uint32_t);
  const size_t ahead = prefetch_bytes / sizeof(uint32_t);
  constexpr size_t kLineWords = 64 / sizeof(uint32_t);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  size_t i = 0;
  for (; i + 8 * n <= count; i += 8 * n) {
    if (ahead > 0) {
      // Prefetching past the end is harmless (a hint, never a fault).
      for (size_t line = 0; line < 8 * n; line += kLineWords) hwy::Prefetch(p + i + ahead + line);
    }
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + n));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * n));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * n));
    a4 = hn::Add(a4, hn::LoadU(d, p + i + 4 * n));
    a5 = hn::Add(a5, hn::LoadU(d, p + i + 5 * n));
    a6 = hn::Add(a6, hn::LoadU(d, p + i + 6 * n));
    a7 = hn::Add(a7, hn::LoadU(d, p + i + 7 * n));
  }
  for (; i + n <= count; i += n) a0 = hn::Add(a0, hn::LoadU(d, p + i));
  const auto sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                           hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  uint32_t total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < count; ++i) {
    uint32_t word;
    std::memcpy(&word, p + i, sizeof(word));
    total += word;
  }
  return total;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary::kernels::cpu {

HWY_EXPORT(StreamSumImpl);

uint32_t StreamSum(const uint8_t* data, size_t bytes, size_t prefetch_bytes) {
  return HWY_DYNAMIC_DISPATCH(StreamSumImpl)(data, bytes, prefetch_bytes);
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;
constexpr uint8_t kFillByte = 0x01;

// An anonymous mapping with `bytes` usable at a 2 MiB boundary, advised for or against
// transparent huge pages, every page touched (filled with kFillByte) before use.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, bool huge_pages) : bytes_(bytes) {
    mapped_bytes_ = bytes + kHugePage;
    void* base = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED) return;
    base_ = base;
    const auto address = reinterpret_cast<uintptr_t>(base);
    data_ = reinterpret_cast<uint8_t*>((address + kHugePage - 1) / kHugePage * kHugePage);
    // Advice is best effort: without it (or where THP is off) the buffer has small pages.
    madvise(data_, bytes_, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(data_, kFillByte, bytes_);
  }
  ~StreamBuffer() {
    if (base_ != nullptr) munmap(base_, mapped_bytes_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  const uint8_t* data() const { return data_; }
  bool ok() const { return data_ != nullptr; }

 private:
  size_t bytes_;
  size_t mapped_bytes_ = 0;
  void* base_ = nullptr;
  uint8_t* data_ = nullptr;
};

// AnonHugePages of the mapping that holds `address` over `bytes`, from /proc/self/smaps; -1 when
// not found.
double HugePageFraction(const uint8_t* address, size_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  double huge_kib = -1;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-') {
      if (inside) break;  // past the mapping: done
      inside = begin <= target && target < end;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      std::istringstream value(line.substr(14));
      double kib = 0;
      if (value >> kib) huge_kib = std::max(0.0, huge_kib) + kib;
    }
  }
  return huge_kib < 0 ? -1.0 : huge_kib * 1024.0 / static_cast<double>(bytes);
}

// One timed pass: part p of `threads` sums its own page-aligned slice of the buffer.
struct alignas(64) PartSum {
  uint32_t value = 0;
};

uint32_t ReadPass(WorkerPool& pool, const uint8_t* data, size_t bytes, size_t prefetch_bytes,
                  std::vector<PartSum>& parts) {
  const int threads = pool.size();
  const size_t pages = bytes / kPage;
  pool.ParallelFor(
      threads,
      [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const size_t first = pages * static_cast<size_t>(p) / threads * kPage;
          const size_t last = pages * static_cast<size_t>(p + 1) / threads * kPage;
          parts[static_cast<size_t>(p)].value =
              StreamSum(data + first, last - first, prefetch_bytes);
        }
      },
      threads);
  uint32_t total = 0;
  for (int p = 0; p < threads; ++p) total += parts[static_cast<size_t>(p)].value;
  return total;
}

// Best of `repetitions` passes, in bytes per second.
double BestPass(WorkerPool& pool, const uint8_t* data, size_t bytes, size_t prefetch_bytes,
                int repetitions, uint32_t* checksum) {
  std::vector<PartSum> parts(static_cast<size_t>(pool.size()));
  double best = 0;
  for (int r = 0; r < std::max(1, repetitions); ++r) {
    const auto start = std::chrono::steady_clock::now();
    *checksum = ReadPass(pool, data, bytes, prefetch_bytes, parts);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds);
  }
  return best;
}

// result.best[t - 1]: the fastest of result.variants at t threads.
void PickBest(StreamReadResult& result) {
  int max_threads = 0;
  for (const StreamReadVariant& v : result.variants) max_threads = std::max(max_threads, v.threads);
  result.best.assign(static_cast<size_t>(max_threads), StreamReadVariant{});
  for (const StreamReadVariant& v : result.variants) {
    StreamReadVariant& best = result.best[static_cast<size_t>(v.threads - 1)];
    if (v.bytes_per_second > best.bytes_per_second) best = v;
  }
}

}  // namespace

StreamReadResult MeasureStreamRead(const StreamReadOptions& options) {
  StreamReadResult result;
  result.bytes = std::max(options.bytes / kPage, size_t{1}) * kPage;
  const int max_threads = std::max(1, options.max_threads);
  std::vector<std::unique_ptr<WorkerPool>> pools;  // threads created once, before any timing
  for (int t = 1; t <= max_threads; ++t) pools.push_back(std::make_unique<WorkerPool>(t));
  for (const bool huge : {true, false}) {
    const StreamBuffer buffer(result.bytes, huge);
    if (!buffer.ok()) {
      result.variants.clear();
      return result;
    }
    (huge ? result.huge_fraction_advised : result.huge_fraction_not_advised) =
        HugePageFraction(buffer.data(), result.bytes);
    for (const std::unique_ptr<WorkerPool>& pool : pools) {
      for (const size_t prefetch : options.prefetch_bytes) {
        StreamReadVariant variant{pool->size(), huge, prefetch, 0.0};
        variant.bytes_per_second = BestPass(*pool, buffer.data(), result.bytes, prefetch,
                                            options.repetitions, &result.checksum);
        result.variants.push_back(variant);
      }
    }
  }
  PickBest(result);
  return result;
}

StreamReadResult FasterOf(const StreamReadResult& a, const StreamReadResult& b) {
  if (a.variants.empty()) return b;
  if (b.variants.empty() || a.variants.size() != b.variants.size()) return a;
  StreamReadResult merged = a;
  for (size_t i = 0; i < merged.variants.size(); ++i) {
    merged.variants[i].bytes_per_second =
        std::max(a.variants[i].bytes_per_second, b.variants[i].bytes_per_second);
  }
  PickBest(merged);
  return merged;
}

}  // namespace estuary::kernels::cpu
#endif  // HWY_ONCE
