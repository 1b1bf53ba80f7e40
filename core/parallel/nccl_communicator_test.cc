// Runs only on a machine with a GPU; elsewhere the cases skip (style §3.4). One rank, because
// NCCL does not allow two ranks on one device.
#include "core/parallel/nccl_communicator.h"

#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace estuary::parallel {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(NcclCommunicatorTest, SingleRankCollectivesAndAbort) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = NcclCommunicator::Create(*id, 1, 0, 0, Soon(), nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status();
  NcclCommunicator& c = **comm;

  std::vector<float> host = {1.5f, -2.0f, 3.25f};
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), 6 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), 3 * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_TRUE(c.AllReduceSum(absl::MakeSpan(dev, 3), Soon()).ok());
  EXPECT_TRUE(c.Broadcast(absl::MakeSpan(dev, 3), 0, Soon()).ok());
  EXPECT_TRUE(c.AllGather(absl::MakeConstSpan(dev, 3), absl::MakeSpan(dev + 3, 3), Soon()).ok());
  EXPECT_TRUE(c.Barrier(Soon()).ok());
  std::vector<float> out(6);
  ASSERT_EQ(cudaMemcpy(out.data(), dev, 6 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i], host[i]);
    EXPECT_EQ(out[3 + i], host[i]);
  }
  EXPECT_EQ(c.Broadcast(absl::MakeSpan(dev, 3), 1, Soon()).code(),
            absl::StatusCode::kInvalidArgument);

  const absl::Status reason = absl::AbortedError("test abort");
  c.Abort(reason);
  EXPECT_EQ(c.Barrier(Soon()), reason);
  EXPECT_EQ(c.AllReduceSum(absl::MakeSpan(dev, 3), Soon()), reason);
  cudaFree(dev);
}

}  // namespace
}  // namespace estuary::parallel
