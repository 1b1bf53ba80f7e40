#include "rpc/metrics_http.h"

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "rpc/http_serving.h"

namespace estuary::rpc {

MetricsHttpServer::MetricsHttpServer(common::MetricsRegistry* registry) : registry_(registry) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::Status MetricsHttpServer::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("metrics server already started");
  auto server = std::make_unique<httplib::Server>();
  AddHealthAndMetricsRoutes(*server, registry_, [this] { return ready_.load(); });
  absl::StatusOr<int> bound = BindAndServe(*server, host, port, "metrics", thread_);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  address_ = absl::StrCat(host, ":", port_);
  server_ = std::move(server);
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace estuary::rpc
