#pragma once
// How every Estuary server says "too busy now, not broken": RESOURCE_EXHAUSTED, a message that
// names the cap (the flag) that refused, and a retry hint in the trailing metadata
// kRetryAfterMetadata (milliseconds, like HTTP's Retry-After). The router reads the hint of a
// worker's refusal to place the request elsewhere; clients back off by it.

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace estuary::rpc {

inline constexpr char kRetryAfterMetadata[] = "retry-after-ms";
inline constexpr absl::Duration kDefaultRetryAfter = absl::Seconds(1);

// RESOURCE_EXHAUSTED with `message`; adds the hint to `context` (when not null).
grpc::Status Overloaded(grpc::ServerContextBase* context, const std::string& message,
                        absl::Duration retry_after = kDefaultRetryAfter);

// ToGrpcStatus (status_convert.h), with the hint added to `context` when `status` is
// RESOURCE_EXHAUSTED.
grpc::Status ToGrpcStatusWithRetryHint(grpc::ServerContextBase* context,
                                       const absl::Status& status);

// The hint a refused call carried (kRetryAfterMetadata), or zero when none.
absl::Duration RetryAfter(const grpc::ClientContext& context);

}  // namespace estuary::rpc
