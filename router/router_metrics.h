#pragma once
// RouterMetrics: the router's Prometheus series (design §9), named as vLLM's with the
// `estuary:` prefix and labelled, as vLLM's are, with the served model's name (`model_name`).
// One set per served model name, shared by every RouterService serving it (gRPC and HTTP
// requests both pass through RouterService::Generate, so both doors are counted once).
//
//   request_success_total{finished_reason}   admitted requests by how they ended
//   prompt_tokens_total, generation_tokens_total   tokens prefilled / generated for clients
//   time_to_first_token_seconds, inter_token_latency_seconds (per token),
//   time_per_output_token_seconds (same per-token figure, vLLM's older name),
//   e2e_request_latency_seconds, request_queue_time_seconds   histograms
//   num_requests_waiting   admitted, not yet streaming (the router's queue depth)
//   num_requests_running   streaming: first token sent, not yet ended
//   kv_cache_usage_perc    KV pages in use over all live decode workers, 0 to 1
//   request_migrations_total   streams resumed on another decode worker (--migration-limit)
//
// README "Metrics" maps each to its vLLM name.

#include <optional>
#include <string>
#include <vector>

#include "core/common/metrics.h"
#include "estuary/v1/inference.pb.h"
#include "estuary/v1/worker.pb.h"

namespace estuary::router {

class RouterMetrics {
 public:
  // The set for `model_name` (registered on first use; lives as long as the process).
  static RouterMetrics& For(const std::string& model_name);

  // Admitted requests by how they ended: eos, stop_string, stop_token, length, cancelled, error.
  common::Counter& Finished(std::optional<estuary::v1::FinishReason> reason);
  // A chunk of `tokens` new tokens arrived `gap_seconds` after the previous one: each token is
  // observed as gap / tokens in the inter-token histograms.
  void ObserveChunk(double gap_seconds, int tokens);
  // The KV usage of the cluster from the decode workers' latest loads.
  void SetDecodeLoads(const std::vector<estuary::v1::WorkerLoad>& loads);

  const std::string model_name;
  common::Counter& eos;
  common::Counter& stop_string;
  common::Counter& stop_token;
  common::Counter& length;
  common::Counter& cancelled;
  common::Counter& error;
  common::Counter& prompt_tokens;
  common::Counter& generation_tokens;
  common::Histogram& ttft;
  common::Histogram& itl;
  common::Histogram& tpot;
  common::Histogram& e2e;
  common::Histogram& queue;
  common::Gauge& waiting;
  common::Gauge& running;
  common::Gauge& kv_usage;
  common::Counter& migrations;

 private:
  explicit RouterMetrics(std::string model);
};

}  // namespace estuary::router
