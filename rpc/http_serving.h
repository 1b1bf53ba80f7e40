#pragma once
// What every HTTP server of a process shares (the metrics port, the router's OpenAI port):
// the /health, /live and /metrics routes, and binding then serving on a thread of its own.
// cpp-httplib stays behind these two functions.

#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "core/common/metrics.h"

namespace httplib {
class Server;
}

namespace estuary::rpc {

//   GET /metrics  `registry` in the text exposition format (text/plain; version=0.0.4)
//   GET /health   readiness: 200 "ok" while `ready()`, else 503 "not ready"
//   GET /live     liveness: 200 "ok" while the process serves (never depends on peers)
// `registry` and whatever `ready` reads must outlive the server.
void AddHealthAndMetricsRoutes(httplib::Server& server, common::MetricsRegistry* registry,
                               std::function<bool()> ready);

// Binds host:port (0: any free port), starts `server`'s loop on `thread` and waits (up to 5 s)
// until it runs, so that a stop() right after never misses it. The bound port, or UNAVAILABLE
// naming `what` and the address.
absl::StatusOr<int> BindAndServe(httplib::Server& server, const std::string& host, int port,
                                 const std::string& what, std::thread& thread);

}  // namespace estuary::rpc
