#include "core/parallel/rank_threads.h"

#include <atomic>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/parallel/cpu_communicator.h"
#include "gtest/gtest.h"

namespace estuary::parallel {
namespace {

TEST(RankThreadsTest, RunsEveryRankOnItsOwnThreadEachTime) {
  RankThreads threads(3);
  for (int round = 0; round < 20; ++round) {
    absl::Mutex mu;
    std::set<int> ranks;
    std::set<std::thread::id> ids;
    ASSERT_TRUE(threads
                    .Run([&](int rank) {
                      absl::MutexLock lock(&mu);
                      ranks.insert(rank);
                      ids.insert(std::this_thread::get_id());
                      return absl::OkStatus();
                    })
                    .ok());
    EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
    EXPECT_EQ(ids.size(), 3u);
    EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u) << "rank 0 runs on the caller";
  }
}

TEST(RankThreadsTest, AFailingRankAbortsTheOthersCollectiveInsteadOfAHang) {
  RankThreads threads(2);
  auto group = CpuCommunicatorGroup::Create(2);
  ASSERT_TRUE(group.ok());
  const absl::Time start = absl::Now();
  const absl::Status status = threads.Run(
      [&](int rank) -> absl::Status {
        if (rank == 1) return absl::InternalError("rank 1 failed its kernel");
        float x[4] = {1, 2, 3, 4};
        return (*group)->rank(0).AllReduceSum(absl::MakeSpan(x), absl::Now() + absl::Seconds(30));
      },
      [&](const absl::Status& error) { (*group)->Abort(error); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("rank 1 failed"), absl::string_view::npos) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(RankThreadsTest, SizeOneRunsInline) {
  RankThreads threads(1);
  std::atomic<int> calls{0};
  ASSERT_TRUE(threads
                  .Run([&](int rank) {
                    EXPECT_EQ(rank, 0);
                    ++calls;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace estuary::parallel
