#include "rpc/metrics_http.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace estuary::rpc {

MetricsHttpServer::MetricsHttpServer(common::MetricsRegistry* registry) : registry_(registry) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::Status MetricsHttpServer::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("metrics server already started");
  auto server = std::make_unique<httplib::Server>();
  common::MetricsRegistry* registry = registry_;
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheusText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_.load()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content("not ready\n", "text/plain");
    }
  });
  server->Get("/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  int bound = -1;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
  } else if (server->bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", host, ":", port));
  }
  port_ = bound;
  address_ = absl::StrCat(host, ":", bound);
  server_ = std::move(server);
  httplib::Server* s = server_.get();
  thread_ = std::thread([s] { s->listen_after_bind(); });
  // stop() is a no-op until the loop runs; wait for it so Stop() never misses it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!s->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace estuary::rpc
