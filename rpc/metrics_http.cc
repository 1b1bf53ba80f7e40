#include "rpc/metrics_http.h"

#include "absl/strings/str_cat.h"
#include "rpc/http_probes.h"

namespace estuary::rpc {

MetricsHttpServer::MetricsHttpServer(common::MetricsRegistry* registry) : registry_(registry) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::Status MetricsHttpServer::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("metrics server already started");
  HttpServerOptions options;
  options.host = host;
  options.port = port;
  options.what = "metrics";
  options.io_threads = 1;
  options.long_handler_threads = 1;  // never used: nothing runs on a pool
  options.short_handler_threads = 1;
  auto ready = [this] { return ready_.load(); };
  auto server = std::make_unique<HttpServer>(options, [this, ready](const HttpRequest& request) {
    if (std::optional<HttpResponse> probe = AnswerProbe(request, registry_, ready)) {
      return HttpDispatch::Answer(*std::move(probe));
    }
    return HttpDispatch::Answer(
        PlainErrorPage(404, absl::StrCat("no such endpoint: ", request.method, " ", request.path)));
  });
  if (absl::Status started = server->Start(); !started.ok()) return started;
  port_ = server->port();
  address_ = server->address();
  server_ = std::move(server);
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->Stop();
  server_.reset();
}

}  // namespace estuary::rpc
