#include "core/kernels/cpu/stream_read.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/kernels/cpu/stream_read.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#if HWY_ONCE
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "hwy/aligned_allocator.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace estuary::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

uint32_t StreamSumImpl(const uint8_t* HWY_RESTRICT data, size_t bytes) {
  const hn::ScalableTag<uint32_t> d;
  const size_t n = hn::Lanes(d);
  const auto* p = reinterpret_cast<const uint32_t*>(data);
  const size_t count = bytes / sizeof(uint32_t);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (size_t i = 0; i + 4 * n <= count; i += 4 * n) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + n));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * n));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * n));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary::kernels::cpu {

HWY_EXPORT(StreamSumImpl);

uint32_t StreamSum(const uint8_t* data, size_t bytes) {
  return HWY_DYNAMIC_DISPATCH(StreamSumImpl)(data, bytes);
}

double MeasureStreamReadBandwidth(size_t bytes, int repetitions) {
  bytes = std::max<size_t>(bytes / 256 * 256, 256);
  auto buffer = hwy::AllocateAligned<uint8_t>(bytes);
  if (!buffer) return 0.0;
  std::memset(buffer.get(), 1, bytes);  // touch every page before timing
  double best = 0.0;
  volatile uint32_t sink = 0;
  for (int r = 0; r < std::max(1, repetitions); ++r) {
    const auto start = std::chrono::steady_clock::now();
    sink = sink + StreamSum(buffer.get(), bytes);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds);
  }
  return best;
}

}  // namespace estuary::kernels::cpu
#endif  // HWY_ONCE
