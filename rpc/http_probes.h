#pragma once
// What every HTTP port of a process answers the same way (the metrics port, the router's OpenAI
// port), at once on the server's I/O thread (rpc/http_server.h):
//
//   GET /metrics  `registry` in the text exposition format (text/plain; version=0.0.4)
//   GET /health   readiness: 200 "ok" while `ready()`, else 503 "not ready"
//   GET /live     liveness: 200 "ok" while the process serves (never depends on peers)

#include <functional>
#include <optional>

#include "core/common/metrics.h"
#include "rpc/http_exchange.h"

namespace estuary::rpc {

// True for the three paths above (whatever the method).
bool IsProbePath(const std::string& path);

// The answer to a GET of one of the three paths; nullopt for anything else. `registry` and
// whatever `ready` reads must outlive the server.
std::optional<HttpResponse> AnswerProbe(const HttpRequest& request,
                                        common::MetricsRegistry* registry,
                                        const std::function<bool()>& ready);

}  // namespace estuary::rpc
