#include "router/openai/error_response.h"

#include <string>

#include "httplib.h"
#include "router/openai/api_error.h"
#include "router/openai/response_json.h"

namespace estuary::openai {

void SetErrorResponse(httplib::Response& response, const absl::Status& status) {
  response.status = HttpStatusOf(status);
  if (response.status == 429 || response.status == 503) {
    response.set_header("Retry-After", std::to_string(kRetryAfterSeconds));
  }
  response.set_content(Dump(ErrorJson(status)), "application/json");
}

}  // namespace estuary::openai
