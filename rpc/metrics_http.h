#pragma once
// MetricsHttpServer: a process's --metrics-port for Prometheus scraping and probes (design §9),
// on rpc/http_server.h with one I/O thread and no handler threads (every answer is made at
// once):
//
//   GET /metrics  the registry in the text exposition format (text/plain; version=0.0.4)
//   GET /health   readiness: 200 "ok" once SetReady(true), else 503 "not ready" (the same truth
//                 as the gRPC health service: model loaded, engine running, not draining)
//   GET /live     liveness: 200 "ok" while the process serves (never depends on peers)
//
// Anything else is 404. RAII: the destructor stops the server and joins its thread.

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "core/common/metrics.h"
#include "rpc/http_server.h"

namespace estuary::rpc {

class MetricsHttpServer {
 public:
  // Serves `registry` (must outlive the server); default: the process-wide one.
  explicit MetricsHttpServer(
      common::MetricsRegistry* registry = &common::MetricsRegistry::Global());
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds host:port (0: any free port) and starts serving; returns once it accepts
  // connections. UNAVAILABLE when the port cannot be bound; FAILED_PRECONDITION when started.
  absl::Status Start(const std::string& host, int port);
  // Readiness answered by /health (thread-safe; starts false).
  void SetReady(bool ready) { ready_ = ready; }
  // Stops serving (idempotent; the destructor calls it).
  void Stop();

  int port() const { return port_; }             // the bound port, after Start
  const std::string& address() const { return address_; }  // host:port

 private:
  common::MetricsRegistry* registry_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> ready_{false};
};

}  // namespace estuary::rpc
