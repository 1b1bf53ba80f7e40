#include "core/common/worker_pool.h"

#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

TEST(WorkerPoolTest, EveryIndexRunsOnceInContiguousParts) {
  WorkerPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> calls{0};
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      ++calls;
      for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n;
    EXPECT_EQ(calls.load(), std::min<int64_t>(n, 3)) << n;
  }
}

TEST(WorkerPoolTest, PartsRunOnDistinctThreadsAndTheCallerTakesPart) {
  WorkerPool pool(2);
  absl::Mutex mu;
  std::set<std::thread::id> ids;
  pool.ParallelFor(2, [&](int64_t, int64_t) {
    absl::MutexLock lock(&mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);
}

TEST(WorkerPoolTest, ThePartCountCapsTheSplitAndTheSplitIsFixed) {
  WorkerPool pool(4);
  absl::Mutex mu;
  std::set<std::pair<int64_t, int64_t>> ranges;
  pool.ParallelFor(
      10,
      [&](int64_t begin, int64_t end) {
        absl::MutexLock lock(&mu);
        ranges.insert({begin, end});
      },
      2);
  EXPECT_EQ(ranges, (std::set<std::pair<int64_t, int64_t>>{{0, 5}, {5, 10}}));
}

TEST(WorkerPoolTest, ManyBackToBackJobsFromTwoCallersAllComplete) {
  WorkerPool pool(2);
  std::atomic<int64_t> sum{0};
  auto hammer = [&] {
    for (int j = 0; j < 20000; ++j) {
      pool.ParallelFor(4, [&](int64_t begin, int64_t end) { sum += end - begin; });
    }
  };
  std::thread other(hammer);
  hammer();
  other.join();
  EXPECT_EQ(sum.load(), int64_t{2} * 20000 * 4);
}

TEST(WorkerPoolTest, SerialRunsOnTheCaller) {
  std::thread::id ran;
  WorkerPool::Serial().ParallelFor(5, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 5);
    ran = std::this_thread::get_id();
  });
  EXPECT_EQ(ran, std::this_thread::get_id());
}

}  // namespace
}  // namespace estuary
