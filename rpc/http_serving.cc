#include "rpc/http_serving.h"

#include <sys/socket.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace estuary::rpc {
namespace {

// Connections waiting to be accepted (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 4096;

}  // namespace

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
  // Debian's libcpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled
  // into the shared library): a burst of connections then overflows the accept queue and each
  // dropped SYN costs its client a 1 s retransmit. Linux lets a second listen() on the bound
  // socket raise the backlog, so the socket is kept from the options hook and listened again.
  // The hook stays stored in the server: it owns what it writes, and is reset after the bind.
  auto listening = std::make_shared<int>(-1);
  server.set_socket_options([listening](socket_t sock) {
    httplib::default_socket_options(sock);
    *listening = static_cast<int>(sock);
  });
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot listen on ", host, ":", port));
  }
  server.set_socket_options(httplib::default_socket_options);
  if (*listening >= 0) ::listen(*listening, kListenBacklog);
  httplib::Server* s = &server;
  thread = std::thread([s] { s->listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!s->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

}  // namespace estuary::rpc
