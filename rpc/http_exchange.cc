#include "rpc/http_exchange.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace estuary::rpc {

std::string HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

HttpResponse PlainErrorPage(int status, const std::string& message) {
  HttpResponse response;
  response.status = status;
  response.content_type = "text/plain";
  response.body = absl::StrCat(message, "\n");
  return response;
}

}  // namespace estuary::rpc
