#pragma once
// absl::Status <-> grpc::Status at the service edges: the code numbers are the same (both follow
// google.rpc.Code), the message is carried over.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace estuary::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// A status from a proto's (code, message) pair (KvCompletion, DecodeResponse).
absl::Status StatusFromCode(int code, const std::string& message);

}  // namespace estuary::rpc
