#include "rpc/overload.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "rpc/status_convert.h"

namespace estuary::rpc {

grpc::Status Overloaded(grpc::ServerContextBase* context, const std::string& message,
                        absl::Duration retry_after) {
  if (context != nullptr) {
    context->AddTrailingMetadata(kRetryAfterMetadata,
                                 std::to_string(absl::ToInt64Milliseconds(retry_after)));
  }
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, message);
}

grpc::Status ToGrpcStatusWithRetryHint(grpc::ServerContextBase* context,
                                       const absl::Status& status) {
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    return Overloaded(context, std::string(status.message()));
  }
  return ToGrpcStatus(status);
}

absl::Duration RetryAfter(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto it = trailers.find(kRetryAfterMetadata);
  int64_t ms = 0;
  if (it == trailers.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) || ms < 0) {
    return absl::ZeroDuration();
  }
  return absl::Milliseconds(ms);
}

}  // namespace estuary::rpc
