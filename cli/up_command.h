#pragma once
// `estuary up`: a whole cluster on loopback (design §1): one router, N prefill workers and M
// decode workers, each its own process started from the binaries built beside `estuary`. Waits
// until every process is ready and the router has them registered, prints the router's
// address, and on SIGINT / SIGTERM stops them all (SIGTERM, then SIGKILL after 5 s).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/backend/device.h"

namespace estuary::cli {

struct UpOptions {
  std::string model;              // resolved model folder
  std::string host = "127.0.0.1";
  int port = 50051;               // the router's; 0: any free port
  int prefill = 1;                // prefill workers
  int decode = 1;                 // decode workers
  int tp_prefill = 1;
  int tp_decode = 1;
  std::string ucx_tls = "tcp";    // UCX transports of the KV push
  int64_t kv_cache_bytes = int64_t{256} << 20;  // per worker
  std::string policy = "least_loaded";
  int local_prefill_max_tokens = 0;  // 0: every prompt disaggregated
  bool river = false;             // decode workers run the exit river
  std::string ready_file;         // written with the router's host:port once all is ready
  std::string log_dir;            // default: a fresh folder under the temp dir
  // Every member's --shutdown-timeout: on a stop, the router's requests in flight, then the
  // workers', get this long to finish.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // cpu, or cuda:N: worker i (decode workers first, then prefill) runs on GPU N + i with
  // --kv-transport nccl. One GPU: --prefill 0 (the decode worker prefills locally).
  Device device;
  // Prometheus /metrics: -1 off; 0 every process on a free port; P: the router on P, the
  // workers on P + 1, P + 2, ... (decode workers first, then prefill).
  int metrics_port = -1;
  // The router requires it from clients (--api-key); up's own calls to the router send it.
  std::string api_key;
  // Every process demands and sends it (--cluster-token; rpc/cluster_security.h), so the local
  // cluster's internal ports are closed to other local users; empty: RunUp draws a random one.
  std::string cluster_token;
  // Flags passed through as given (`--name=value`, estuary_main's PassThrough): to the router,
  // to each prefill worker, to each decode worker.
  std::vector<std::string> router_flags;
  std::vector<std::string> prefill_flags;
  std::vector<std::string> decode_flags;
};

absl::Status ValidateUpOptions(const UpOptions& options);
// Runs until a termination signal (the caller must have blocked SIGINT and SIGTERM first, see
// process::BlockTerminationSignals) or until a process of the cluster dies.
absl::Status RunUp(const UpOptions& options);

}  // namespace estuary::cli
