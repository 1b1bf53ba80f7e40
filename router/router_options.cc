#include "router/router_options.h"

#include "absl/strings/str_cat.h"

namespace estuary::router {

absl::Status ValidateRouterOptions(const RouterOptions& options) {
  if (options.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.host.empty()) return absl::InvalidArgumentError("--host is empty");
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port = ", options.metrics_port, " outside [-1, 65535]"));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port = ", options.port, " outside [0, 65535]"));
  }
  if (options.local_prefill_max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--local-prefill-max-tokens = ",
                                                   options.local_prefill_max_tokens,
                                                   " must be >= 0 (0 = never)"));
  }
  if (options.max_queued_requests < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-queued-requests = ",
                                                   options.max_queued_requests, " must be >= 1"));
  }
  if (options.max_concurrent_streams < 1 ||
      options.max_concurrent_streams > RouterOptions::kMaxStreamsCap) {
    return absl::InvalidArgumentError(absl::StrCat("--max-concurrent-streams = ",
                                                   options.max_concurrent_streams,
                                                   " outside [1, ", RouterOptions::kMaxStreamsCap, "]"));
  }
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the heartbeat interval must be positive");
  }
  if (options.worker_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--worker-timeout = ", absl::FormatDuration(options.worker_timeout),
        " must exceed the heartbeat interval of ", absl::FormatDuration(options.heartbeat_interval)));
  }
  if (options.shutdown_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown-timeout must be >= 0");
  }
  if (options.discovery_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--discovery-interval must be positive");
  }
  if (!options.discover_workers.empty() && options.discovery_interval >= options.worker_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--discovery-interval = ", absl::FormatDuration(options.discovery_interval),
        " must be shorter than --worker-timeout = ", absl::FormatDuration(options.worker_timeout),
        " (discovered workers are kept alive by its probes)"));
  }
  if (options.max_model_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len = ", options.max_model_len, " must be >= 0 (0 = the model's)"));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts = ", options.max_attempts, " must be >= 1"));
  }
  if (options.migration_limit < 0 || options.migration_limit > RouterOptions::kMaxMigrationLimit) {
    return absl::InvalidArgumentError(absl::StrCat("--migration-limit = ", options.migration_limit,
                                                   " outside [0, ",
                                                   RouterOptions::kMaxMigrationLimit,
                                                   "] (0 = no migration)"));
  }
  return options.timeouts.Validate();
}

}  // namespace estuary::router
