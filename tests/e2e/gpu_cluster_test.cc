// The cluster with its workers on GPUs (--device cuda --kv-transport nccl), through the router's
// public API. Label `gpu`: skips without enough CUDA devices.
#include "core/backend/backend.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::Cluster;
using ::estuary::testing::ClusterSpec;
using ::estuary::testing::Generate;
using ::estuary::testing::Generated;
using ::estuary::testing::GoldenCase;

void ExpectGoldenIds(Cluster& cluster, const std::string& model) {
  for (const GoldenCase& c : ::estuary::testing::LoadGoldenCases(model)) {
    const Generated got = Generate(cluster.stub(), cluster.Greedy(c.prompt_ids));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << cluster.Logs();
    EXPECT_EQ(got.ids, c.completion_ids) << "case " << c.index;
  }
}

// One GPU: a decode worker on the GPU serves whole requests (the router prefills locally on it),
// with the golden ids.
TEST(GpuClusterTest, DecodeWorkerOnAGpuServesLocally) {
  if (CudaDeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  ClusterSpec spec;
  spec.prefill = 0;
  spec.decode_flags = {"--device", "cuda:0", "--kv-transport", "nccl"};
  Cluster cluster(spec);
  ExpectGoldenIds(cluster, spec.model);
}

// Two GPUs: prefill on one, decode on the other, KV pages over NCCL, with the golden ids. (NCCL
// refuses two ranks on one GPU, so this needs two.)
TEST(GpuClusterTest, PrefillAndDecodeOnTwoGpusOverNccl) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << CudaDeviceCount();
  ClusterSpec spec;
  spec.prefill_flags = {"--device", "cuda:0", "--kv-transport", "nccl"};
  spec.decode_flags = {"--device", "cuda:1", "--kv-transport", "nccl"};
  Cluster cluster(spec);
  ExpectGoldenIds(cluster, spec.model);
}

}  // namespace
}  // namespace estuary
