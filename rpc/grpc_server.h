#pragma once
// StartGrpcServer: one gRPC server with the standard services every Estuary process exposes
// (grpc.health.v1 health checking and server reflection), listening on host:port (port 0 picks
// a free one). The caller owns the returned server and the services it registered, which must
// outlive it.

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace estuary::rpc {

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;          // the bound port
  std::string address;   // host:port as clients should dial it
};

// UNAVAILABLE when the port cannot be bound.
absl::StatusOr<RunningServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<grpc::Service*>& services);

// Writes "<address>\n" to `path` under a temporary name and renames it, so that a launcher
// polling for the file never reads half a line.
absl::Status WriteReadyFile(const std::string& path, const std::string& address);

// {SIGINT, SIGTERM}.
sigset_t TerminationSignals();
// Blocks until SIGINT or SIGTERM arrives (taken synchronously; call once per process).
void WaitForTerminationSignal();

}  // namespace estuary::rpc
