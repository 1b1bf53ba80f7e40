#include "router/openai/error_response.h"

#include "router/openai/api_error.h"
#include "router/openai/response_json.h"

namespace estuary::openai {
namespace {

void AddRetryAfter(rpc::HttpResponse& response) {
  if (response.status == 429 || response.status == 503) {
    response.headers.emplace_back("Retry-After", std::to_string(kRetryAfterSeconds));
  }
}

}  // namespace

rpc::HttpResponse JsonResponse(int status, const nlohmann::json& body) {
  rpc::HttpResponse response;
  response.status = status;
  response.content_type = "application/json";
  response.body = Dump(body);
  return response;
}

rpc::HttpResponse ErrorResponse(const absl::Status& status) {
  rpc::HttpResponse response = JsonResponse(HttpStatusOf(status), ErrorJson(status));
  AddRetryAfter(response);
  return response;
}

rpc::HttpResponse ErrorPage(int http_status, const std::string& message) {
  rpc::HttpResponse response = JsonResponse(http_status, ErrorJson(http_status, message));
  AddRetryAfter(response);
  return response;
}

}  // namespace estuary::openai
