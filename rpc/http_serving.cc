#include "rpc/http_serving.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace estuary::rpc {

void AddHealthAndMetricsRoutes(httplib::Server& server, common::MetricsRegistry* registry,
                               std::function<bool()> ready) {
  server.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheusText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/health", [ready = std::move(ready)](const httplib::Request&, httplib::Response& res) {
    if (ready()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content("not ready\n", "text/plain");
    }
  });
  server.Get("/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
}

absl::StatusOr<int> BindAndServe(httplib::Server& server, const std::string& host, int port,
                                 const std::string& what, std::thread& thread) {
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot listen on ", host, ":", port));
  }
  httplib::Server* s = &server;
  thread = std::thread([s] { s->listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!s->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

}  // namespace estuary::rpc
