#include "worker/engine_metrics.h"

namespace estuary::worker {

EngineMetrics& EngineMetrics::Get() {
  static EngineMetrics* const metrics = new EngineMetrics();
  return *metrics;
}

EngineMetrics::EngineMetrics()
    : running_(common::MetricsRegistry::Global().GetGauge(
          "estuary:num_requests_running", "Sequences in the engine's running batch.")),
      waiting_(common::MetricsRegistry::Global().GetGauge(
          "estuary:num_requests_waiting",
          "Requests queued in the engine, not yet in its batch (Inference Extension queue "
          "depth).")),
      preemptions_(common::MetricsRegistry::Global().GetCounter(
          "estuary:num_preemptions_total",
          "Sequences preempted (pages freed, recomputed later) for lack of KV pages.")),
      kv_usage_(common::MetricsRegistry::Global().GetGauge(
          "estuary:kv_cache_usage_perc",
          "KV pool pages in use, 0 to 1 (Inference Extension KV-cache utilisation).")),
      prefix_queries_(common::MetricsRegistry::Global().GetCounter(
          "estuary:prefix_cache_queries_total",
          "Prompt tokens looked up in the prefix cache.")),
      prefix_hits_(common::MetricsRegistry::Global().GetCounter(
          "estuary:prefix_cache_hits_total",
          "Prompt tokens found in the prefix cache (their KV reused).")) {}

void EngineMetrics::UpdateScheduler(int running, int waiting, int64_t preemptions) {
  running_.Set(running);
  waiting_.Set(waiting);
  preemptions_.AdvanceTo(static_cast<double>(preemptions));
}

void EngineMetrics::UpdatePool(const KvPool& pool) {
  const KvPoolStats stats = pool.Stats();
  kv_usage_.Set(KvUsage(stats.used_pages, stats.num_pages));
  prefix_queries_.AdvanceTo(static_cast<double>(stats.prefix_query_tokens));
  prefix_hits_.AdvanceTo(static_cast<double>(stats.prefix_hit_tokens));
}

double KvUsage(int64_t used_pages, int64_t num_pages) {
  if (num_pages <= 0 || used_pages <= 0) return 0;
  return used_pages >= num_pages ? 1.0 : static_cast<double>(used_pages) / num_pages;
}

}  // namespace estuary::worker
