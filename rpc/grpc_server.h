#pragma once
// StartGrpcServer: one gRPC server with the standard services every Estuary process exposes
// (grpc.health.v1 health checking and server reflection), listening on host:port (port 0 picks
// a free one), with the keepalive policy of the cluster's channels (rpc/channels.h) allowed
// and enforced. The caller owns the returned server and the services it registered, which must
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

namespace estuary::rpc {

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

// UNAVAILABLE when the port cannot be bound.
absl::StatusOr<RunningServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<grpc::Service*>& services);

}  // namespace estuary::rpc
