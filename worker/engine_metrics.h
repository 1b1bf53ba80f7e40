#pragma once
// EngineMetrics: the scheduler and KV-cache figures that both worker roles expose on /metrics,
// under vLLM's names with the `estuary:` prefix (README "Metrics"). Two of them are the model
// server metrics the Gateway API Inference Extension's endpoint picker reads:
//
//   estuary:num_requests_waiting   queue depth      (vLLM: vllm:num_requests_waiting)
//   estuary:num_requests_running   running requests (vLLM: vllm:num_requests_running)
//   estuary:kv_cache_usage_perc    KV utilisation   (vLLM: vllm:kv_cache_usage_perc, formerly
//                                                    vllm:gpu_cache_usage_perc), in [0, 1]
//
// plus estuary:num_preemptions_total and the prefix cache's estuary:prefix_cache_queries_total /
// estuary:prefix_cache_hits_total (in tokens, as vLLM's). The engines keep their own totals
// (KvPoolStats, DecodeEngine::preemptions()); the services' step loops copy them here with
// UpdateScheduler / UpdatePool, so the engines know nothing of Prometheus.

#include <cstdint>

#include "core/common/metrics.h"
#include "core/kvcache/kv_pool.h"

namespace estuary::worker {

class EngineMetrics {
 public:
  // The process-wide set (one engine per worker process), registered on first use.
  static EngineMetrics& Get();

  // From the engine thread after a step: its queue and batch, and its preemptions so far.
  void UpdateScheduler(int running, int waiting, int64_t preemptions);
  // The pool's usage and prefix-cache totals (thread-safe: any thread).
  void UpdatePool(const KvPool& pool);

 private:
  EngineMetrics();

  common::Gauge& running_;
  common::Gauge& waiting_;
  common::Counter& preemptions_;
  common::Gauge& kv_usage_;
  common::Counter& prefix_queries_;
  common::Counter& prefix_hits_;
};

// Pages in use over all pages, in [0, 1] (0 for an empty pool).
double KvUsage(int64_t used_pages, int64_t num_pages);

}  // namespace estuary::worker
