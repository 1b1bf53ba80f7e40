#include "router/openai/api_error.h"



#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace estuary::openai {
namespace {

constexpr char kParamPayload[] = "type.estuary/openai.param";

std::string ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 413:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return "server_error";
  }
}

}  // namespace

absl::Status InvalidField(absl::string_view param, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(param, ": ", message));
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

nlohmann::json ErrorJson(const absl::Status& status) {
  nlohmann::json error = ErrorJson(HttpStatusOf(status), status.message());
  const auto param = status.GetPayload(kParamPayload);
  if (param.has_value()) error["error"]["param"] = std::string(*param);
  return error;
}

nlohmann::json ErrorJson(int http_status, absl::string_view message) {
  return {{"error",
           {{"message", std::string(message)},
            {"type", ErrorType(http_status)},
            {"param", nullptr},
            {"code", http_status}}}};
}

}  // namespace estuary::openai
