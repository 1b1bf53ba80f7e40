#include "router/router_metrics.h"

#include <algorithm>
#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"

namespace estuary::router {
namespace {

using common::MetricLabels;
using common::MetricsRegistry;

MetricLabels Model(const std::string& model) { return {{"model_name", model}}; }

common::Counter& FinishedCounter(const std::string& model, const char* reason) {
  return MetricsRegistry::Global().GetCounter(
      "estuary:request_success_total", "Admitted requests that ended, by finish reason.",
      {{"model_name", model}, {"finished_reason", reason}});
}

// vLLM's buckets for the per-token latency histograms.
const std::vector<double>& TokenGapBounds() {
  static const std::vector<double> bounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                             0.3,  0.4,   0.5,  0.75,  1.0, 2.5, 5.0};
  return bounds;
}

}  // namespace

RouterMetrics& RouterMetrics::For(const std::string& model_name) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* const sets = new std::map<std::string, std::unique_ptr<RouterMetrics>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<RouterMetrics>& set = (*sets)[model_name];
  if (set == nullptr) set.reset(new RouterMetrics(model_name));
  return *set;
}

RouterMetrics::RouterMetrics(std::string model)
    : model_name(std::move(model)),
      eos(FinishedCounter(model_name, "eos")),
      stop_string(FinishedCounter(model_name, "stop_string")),
      stop_token(FinishedCounter(model_name, "stop_token")),
      length(FinishedCounter(model_name, "length")),
      cancelled(FinishedCounter(model_name, "cancelled")),
      error(FinishedCounter(model_name, "error")),
      prompt_tokens(MetricsRegistry::Global().GetCounter(
          "estuary:prompt_tokens_total",
          "Prompt tokens of the requests whose prefill finished (their first token came).",
          Model(model_name))),
      generation_tokens(MetricsRegistry::Global().GetCounter(
          "estuary:generation_tokens_total", "Tokens generated and relayed to clients.",
          Model(model_name))),
      ttft(MetricsRegistry::Global().GetHistogram(
          "estuary:time_to_first_token_seconds",
          "Time to first token (from arrival at the router).",
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
           10.0, 20.0, 40.0, 80.0},
          Model(model_name))),
      itl(MetricsRegistry::Global().GetHistogram(
          "estuary:inter_token_latency_seconds",
          "Time between consecutive output tokens (a chunk's gap split over its tokens).",
          TokenGapBounds(), Model(model_name))),
      tpot(MetricsRegistry::Global().GetHistogram(
          "estuary:time_per_output_token_seconds",
          "Time between output tokens (after the first); vLLM's older name of "
          "inter_token_latency_seconds.",
          TokenGapBounds(), Model(model_name))),
      e2e(MetricsRegistry::Global().GetHistogram(
          "estuary:e2e_request_latency_seconds", "End-to-end latency of admitted requests.",
          {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0},
          Model(model_name))),
      queue(MetricsRegistry::Global().GetHistogram(
          "estuary:request_queue_time_seconds", "Arrival to dispatch to the workers.",
          {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0},
          Model(model_name))),
      waiting(MetricsRegistry::Global().GetGauge(
          "estuary:num_requests_waiting",
          "Admitted requests not yet streaming (--max-queued-requests); the queue depth the "
          "Inference Extension reads.",
          Model(model_name))),
      running(MetricsRegistry::Global().GetGauge(
          "estuary:num_requests_running",
          "Requests streaming: first token sent, not yet ended (Inference Extension running "
          "requests).",
          Model(model_name))),
      kv_usage(MetricsRegistry::Global().GetGauge(
          "estuary:kv_cache_usage_perc",
          "KV pages in use over all live decode workers, 0 to 1 (Inference Extension "
          "KV-cache utilisation).",
          Model(model_name))),
      migrations(MetricsRegistry::Global().GetCounter(
          "estuary:request_migrations_total",
          "Streams resumed on another decode worker after theirs failed, hung or drained "
          "(--migration-limit).",
          Model(model_name))) {}

common::Counter& RouterMetrics::Finished(std::optional<estuary::v1::FinishReason> reason) {
  if (!reason.has_value()) return error;
  switch (*reason) {
    case estuary::v1::FINISH_REASON_EOS: return eos;
    case estuary::v1::FINISH_REASON_STOP_STRING: return stop_string;
    case estuary::v1::FINISH_REASON_STOP_TOKEN: return stop_token;
    case estuary::v1::FINISH_REASON_LENGTH: return length;
    case estuary::v1::FINISH_REASON_CANCELLED: return cancelled;
    default: return error;
  }
}

void RouterMetrics::ObserveChunk(double gap_seconds, int tokens) {
  if (tokens <= 0) return;
  const double per_token = gap_seconds / tokens;
  itl.Observe(per_token, static_cast<uint64_t>(tokens));
  tpot.Observe(per_token, static_cast<uint64_t>(tokens));
}

void RouterMetrics::SetDecodeLoads(const std::vector<estuary::v1::WorkerLoad>& loads) {
  int64_t total = 0, free = 0;
  for (const estuary::v1::WorkerLoad& load : loads) {
    total += load.total_pages();
    free += load.free_pages();
  }
  const int64_t used = total - free;
  kv_usage.Set(total <= 0 || used <= 0 ? 0.0
                                       : std::min(1.0, static_cast<double>(used) / total));
}

}  // namespace estuary::router
