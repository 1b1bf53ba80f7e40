#pragma once
// StartGrpcServer: one gRPC server with the standard services every Estuary process exposes
// (grpc.health.v1 health checking and server reflection), listening on host:port (port 0 picks
// a free one), with the keepalive policy of the cluster's channels (rpc/channels.h) allowed
// and enforced, and a request that does not parse answered INVALID_ARGUMENT naming the method
// (parse_status_interceptor.h). The caller owns the returned server and the services it registered, which must
// outlive it.
//
// Health (grpc.health.v1): the overall service "" and each registered service answer
// NOT_SERVING until the owner calls ServingHealth::SetReady(true) (readiness: model loaded,
// engine running, not draining); the service named kLivenessService answers SERVING while the
// process runs (liveness, which never depends on peers).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "rpc/channels.h"

namespace estuary::rpc {

// Limits a server sets explicitly instead of gRPC's defaults (4 MiB received, unbounded sent,
// threads and streams unbounded). The servers are synchronous: a call in flight holds one of
// the server's threads until it ends (a token stream, for as long as it streams), so the
// thread quota bounds the calls at once; beyond it gRPC refuses a new call at once with
// RESOURCE_EXHAUSTED instead of queueing it. Owners set max_threads above their own caps
// (e.g. the router's --max-concurrent-streams) so that those refuse first, with a message that
// names the flag; the quota is the backstop.
struct ServerLimits {
  int max_message_bytes = kMaxClusterMessageBytes;  // received and sent, per message
  int max_threads = 1024;            // the server's gRPC ResourceQuota
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS. Keep it above the owner's cap: a client at this
  // limit queues its next call on its side rather than being refused.
  int max_streams_per_connection = 1024;
  // Calls beyond a process's own caps (health checks, heartbeats, registration, aborts) that
  // owners add to their cap when they size max_threads.
  static constexpr int kControlThreads = 64;
};

// The health service name of liveness (Kubernetes: grpc probe with service: "liveness").
inline constexpr char kLivenessService[] = "liveness";

class ServingHealth {
 public:
  ServingHealth() = default;
  // `server` must outlive this object's use.
  ServingHealth(grpc::Server* server, std::vector<std::string> services);
  // Readiness of "" and every registered service.
  void SetReady(bool ready);
  bool ready() const { return ready_; }

 private:
  grpc::HealthCheckServiceInterface* health_ = nullptr;
  std::vector<std::string> services_;
  bool ready_ = false;
};

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;          // the bound port
  std::string address;   // host:port as bound (may be a wildcard: not for peers to dial)
  ServingHealth health;  // starts not ready
};

// UNAVAILABLE when the port cannot be bound; INVALID_ARGUMENT for a limit below 1.
// `credentials`: null for an internal port of the cluster (ClusterServerCredentials: mutual TLS
// when this process configured it, rpc/cluster_security.h); the router's client port passes its
// own (rpc/client_tls.h).
absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& host, int port, const std::vector<grpc::Service*>& services,
    const ServerLimits& limits = {},
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

}  // namespace estuary::rpc
