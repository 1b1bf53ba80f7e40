#include "core/parallel/cpu_communicator.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace estuary::parallel {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

// Runs fn(rank) on one thread per rank and joins them.
void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

std::unique_ptr<CpuCommunicatorGroup> MakeGroup(int n) {
  auto group = CpuCommunicatorGroup::Create(n);
  EXPECT_TRUE(group.ok()) << group.status();
  return *std::move(group);
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float Value(int rank, int64_t i) { return 1.0f / (1.0f + rank * 0.37f + i * 0.013f); }

class CpuCommunicatorSizeTest : public ::testing::TestWithParam<int> {};

TEST_P(CpuCommunicatorSizeTest, AllReduceSumIsRankOrderSumOnEveryRank) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1037}}) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) data[r][i] = Value(r, i);
    }
    std::vector<float> expected(count);
    for (int64_t i = 0; i < count; ++i) {
      float s = data[0][i];
      for (int r = 1; r < n; ++r) s += data[r][i];
      expected[i] = s;
    }
    std::vector<absl::Status> status(n);
    RunRanks(n, [&](int r) {
      EXPECT_EQ(group->rank(r).rank(), r);
      EXPECT_EQ(group->rank(r).size(), n);
      status[r] = group->rank(r).AllReduceSum(absl::MakeSpan(data[r]), Soon());
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(status[r].ok()) << status[r];
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(Bits(data[r][i]), Bits(expected[i])) << "rank " << r << " i " << i;
      }
    }
  }
}

TEST_P(CpuCommunicatorSizeTest, AllGatherIsRankMajor) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  const int64_t count = 5;
  std::vector<std::vector<float>> recv(n, std::vector<float>(n * count, -1.0f));
  std::vector<std::vector<float>> in_place(n, std::vector<float>(n * count, -1.0f));
  RunRanks(n, [&](int r) {
    std::vector<float> send(count);
    for (int64_t i = 0; i < count; ++i) send[i] = r * 100.0f + i;
    EXPECT_TRUE(group->rank(r).AllGather(send, absl::MakeSpan(recv[r]), Soon()).ok());
    // In place: the send span is this rank's own part of recv.
    std::copy(send.begin(), send.end(), in_place[r].begin() + r * count);
    absl::Span<float> all = absl::MakeSpan(in_place[r]);
    EXPECT_TRUE(group->rank(r).AllGather(all.subspan(r * count, count), all, Soon()).ok());
  });
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < n; ++k) {
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_EQ(recv[r][k * count + i], k * 100.0f + i);
        EXPECT_EQ(in_place[r][k * count + i], k * 100.0f + i);
      }
    }
  }
}

TEST_P(CpuCommunicatorSizeTest, BroadcastFromEveryRoot) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  for (int root = 0; root < n; ++root) {
    std::vector<std::vector<float>> data(n, std::vector<float>(7));
    RunRanks(n, [&](int r) {
      for (int i = 0; i < 7; ++i) data[r][i] = r * 10.0f + i;
      EXPECT_TRUE(group->rank(r).Broadcast(absl::MakeSpan(data[r]), root, Soon()).ok());
    });
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 7; ++i) EXPECT_EQ(data[r][i], root * 10.0f + i);
    }
  }
}

TEST_P(CpuCommunicatorSizeTest, BarrierWaitsForEveryRank) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  std::atomic<int> entered{0};
  RunRanks(n, [&](int r) {
    for (int round = 1; round <= 20; ++round) {
      entered.fetch_add(1);
      ASSERT_TRUE(group->rank(r).Barrier(Soon()).ok());
      EXPECT_GE(entered.load(), round * n);
      ASSERT_TRUE(group->rank(r).Barrier(Soon()).ok());  // Nobody starts round+1 early.
    }
  });
}

TEST_P(CpuCommunicatorSizeTest, ThousandMixedCollectivesDoNotDeadlock) {
  const int n = GetParam();
  auto group = MakeGroup(n);
  RunRanks(n, [&](int r) {
    Communicator& comm = group->rank(r);
    std::vector<float> data(8);
    std::vector<float> gathered(8 * n);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    for (int it = 0; it < 1000; ++it) {
      std::fill(data.begin(), data.end(), 1.0f);
      switch (it % 4) {
        case 0:
          ASSERT_TRUE(comm.AllReduceSum(absl::MakeSpan(data), deadline).ok());
          ASSERT_EQ(data[7], static_cast<float>(n));
          break;
        case 1:
          ASSERT_TRUE(comm.AllGather(data, absl::MakeSpan(gathered), deadline).ok());
          break;
        case 2:
          ASSERT_TRUE(comm.Broadcast(absl::MakeSpan(data), it % n, deadline).ok());
          break;
        default:
          ASSERT_TRUE(comm.Barrier(deadline).ok());
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CpuCommunicatorSizeTest, ::testing::Values(1, 2, 3, 4));

TEST(CpuCommunicatorTest, CreateRejectsEmptyGroup) {
  EXPECT_EQ(CpuCommunicatorGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuCommunicatorTest, MissingRankTimesOutTheWholeGroup) {
  auto group = MakeGroup(3);
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Milliseconds(200);
  std::vector<absl::Status> status(2);
  std::vector<absl::Duration> elapsed(2);
  // Rank 2 never arrives. Rank 0 has a deadline; rank 1 waits forever and must still wake.
  RunRanks(2, [&](int r) {
    std::vector<float> data(4, 1.0f);
    const absl::Time deadline = r == 0 ? start + timeout : absl::InfiniteFuture();
    status[r] = group->rank(r).AllReduceSum(absl::MakeSpan(data), deadline);
    elapsed[r] = absl::Now() - start;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_GE(elapsed[r], timeout - absl::Milliseconds(5));
    EXPECT_LT(elapsed[r], timeout + absl::Seconds(1));
  }
  EXPECT_NE(status[0].message().find("rank(s) 2"), absl::string_view::npos) << status[0];
  // The late rank and later collectives fail too.
  EXPECT_EQ(group->rank(2).Barrier(Soon()).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(group->rank(0).Barrier(Soon()).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(CpuCommunicatorTest, AbortFromAnotherThreadWakesWaitingRanks) {
  auto group = MakeGroup(3);
  const absl::Status reason = absl::AbortedError("batch 7 failed on rank 2");
  std::vector<absl::Status> status(2);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    group->rank(2).Abort(reason);
  });
  RunRanks(2, [&](int r) { status[r] = group->rank(r).Barrier(absl::InfiniteFuture()); });
  aborter.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(status[r], reason);
  std::vector<float> data(3);
  EXPECT_EQ(group->rank(2).AllReduceSum(absl::MakeSpan(data), Soon()), reason);
  group->Abort(absl::FailedPreconditionError("second abort is ignored"));
  EXPECT_EQ(group->rank(0).Broadcast(absl::MakeSpan(data), 0, Soon()), reason);
}

TEST(CpuCommunicatorTest, MismatchesAreInvalidArgumentOnEveryRankAndRecoverable) {
  auto group = MakeGroup(3);
  std::vector<absl::Status> status(3);
  auto expect_all_invalid = [&] {
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << "rank " << r;
      EXPECT_EQ(status[r], status[0]);
    }
  };
  // Element count.
  RunRanks(3, [&](int r) {
    std::vector<float> data(r == 1 ? 5 : 4);
    status[r] = group->rank(r).AllReduceSum(absl::MakeSpan(data), Soon());
  });
  expect_all_invalid();
  // Broadcast root, out of range on every rank or different across ranks.
  RunRanks(3, [&](int r) {
    std::vector<float> data(4);
    status[r] = group->rank(r).Broadcast(absl::MakeSpan(data), 3, Soon());
  });
  expect_all_invalid();
  RunRanks(3, [&](int r) {
    std::vector<float> data(4);
    status[r] = group->rank(r).Broadcast(absl::MakeSpan(data), r == 0 ? 0 : 1, Soon());
  });
  expect_all_invalid();
  // AllGather recv of the wrong size on one rank.
  RunRanks(3, [&](int r) {
    std::vector<float> send(2), recv(r == 2 ? 5 : 6);
    status[r] = group->rank(r).AllGather(send, absl::MakeSpan(recv), Soon());
  });
  expect_all_invalid();
  // Different collectives.
  RunRanks(3, [&](int r) {
    std::vector<float> data(4);
    status[r] = r == 0 ? group->rank(r).Barrier(Soon())
                       : group->rank(r).AllReduceSum(absl::MakeSpan(data), Soon());
  });
  expect_all_invalid();
  // The group is still usable.
  RunRanks(3, [&](int r) {
    std::vector<float> data(4, 2.0f);
    status[r] = group->rank(r).AllReduceSum(absl::MakeSpan(data), Soon());
    EXPECT_EQ(data[3], 6.0f);
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(status[r].ok()) << status[r];
}

}  // namespace
}  // namespace estuary::parallel
