#include "rpc/http_probes.h"

namespace estuary::rpc {
namespace {

HttpResponse Text(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.content_type = "text/plain";
  response.body = std::move(body);
  return response;
}

}  // namespace

bool IsProbePath(const std::string& path) {
  return path == "/metrics" || path == "/health" || path == "/live";
}

std::optional<HttpResponse> AnswerProbe(const HttpRequest& request,
                                        common::MetricsRegistry* registry,
                                        const std::function<bool()>& ready) {
  if (request.method != "GET") return std::nullopt;
  if (request.path == "/metrics") {
    HttpResponse response = Text(200, registry->RenderPrometheusText());
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    return response;
  }
  if (request.path == "/health") {
    return ready() ? Text(200, "ok\n") : Text(503, "not ready\n");
  }
  if (request.path == "/live") return Text(200, "ok\n");
  return std::nullopt;
}

}  // namespace estuary::rpc
