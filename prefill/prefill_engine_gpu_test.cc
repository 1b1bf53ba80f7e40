// The prefill engine with its steps on a GPU (PrefillEngineOptions::cuda_device) against the
// same engine on the CPU: the first token, the KV of every layer and position, and the LayerReady
// events. Skips without a CUDA device (label `gpu`).
#include <cuda_runtime_api.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/backend/backend.h"
#include "core/model/model_loader.h"
#include "core/model/sharded_model.h"
#include "gtest/gtest.h"
#include "prefill/prefill_engine.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

// What one engine produced for every golden prompt.
struct PrefillRun {
  std::map<std::string, PrefillDone> done;
  int layer_events = 0;
};

PrefillRun Prefill(ShardedModel& model, int cuda_device,
                   const std::vector<::estuary::testing::GoldenCase>& cases) {
  PrefillRun run;
  PrefillSink sink;
  sink.on_layer_ready = [&run](const LayerReady&) { ++run.layer_events; };
  sink.on_done = [&run](PrefillDone& done) { run.done.emplace(done.request_id, std::move(done)); };
  PrefillEngineOptions options;
  options.cuda_device = cuda_device;
  options.kv_cache_bytes = int64_t{32} << 20;
  auto engine = PrefillEngine::Create(model, options, sink);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  for (size_t i = 0; i < cases.size(); ++i) {
    PrefillRequest request;
    request.request_id = std::to_string(i);
    request.prompt_ids = cases[i].prompt_ids;
    request.sampling.temperature = 0.0f;
    EXPECT_TRUE((*engine)->Submit(std::move(request)).ok());
  }
  EXPECT_TRUE((*engine)->RunUntilIdle(absl::Now() + absl::Seconds(60)).ok());
  return run;
}

TEST(PrefillEngineGpuTest, MatchesTheCpuEngine) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir("stories12L"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto model = ShardedModel::Create(std::move(loaded->model), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const auto cases = ::estuary::testing::LoadGoldenCases("stories12L");
  ASSERT_FALSE(cases.empty());
  const PrefillRun cpu = Prefill(**model, -1, cases);
  const PrefillRun gpu = Prefill(**model, 0, cases);
  const LlamaConfig& c = (*model)->config();
  EXPECT_EQ(gpu.layer_events, cpu.layer_events);

  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = std::to_string(i);
    ASSERT_TRUE(cpu.done.contains(id) && gpu.done.contains(id)) << id;
    const PrefillDone& a = cpu.done.at(id);
    const PrefillDone& b = gpu.done.at(id);
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << " " << b.status;
    EXPECT_EQ(b.first_token, cases[i].completion_ids[0]) << "case " << i;
    EXPECT_EQ(b.first_token, a.first_token) << "case " << i;
    ASSERT_EQ(a.num_tokens, b.num_tokens);
    // K and V of every layer and position: the device pool's regions copied back.
    const KvLayout& layout = b.pool->layout();
    double worst = 0.0;
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const KvRegion region = b.pool->layer_region(layer);
      std::vector<float> host(region.bytes / sizeof(float));
      ASSERT_EQ(cudaMemcpy(host.data(), region.data, region.bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (int pos = 0; pos < b.num_tokens; ++pos) {
        const int32_t page = b.pages[static_cast<size_t>(pos / layout.block_size)];
        const int slot = pos % layout.block_size;
        for (int head = 0; head < layout.n_kv_heads; ++head) {
          const float* k = host.data() + page * layout.page_floats_per_layer() +
                           head * layout.head_floats() + slot * layout.head_dim;
          const float* v = k + layout.half_page_floats();
          const float* k_cpu = a.kv.k_slot(layer, pos, head);
          const float* v_cpu = a.kv.v_slot(layer, pos, head);
          for (int d = 0; d < layout.head_dim; ++d) {
            worst = std::max(worst, static_cast<double>(std::fabs(k[d] - k_cpu[d])));
            worst = std::max(worst, static_cast<double>(std::fabs(v[d] - v_cpu[d])));
          }
        }
      }
    }
    // f32 weights: only the summation order differs.
    EXPECT_LT(worst, 1e-3) << "case " << i;
  }
}

}  // namespace
}  // namespace estuary
