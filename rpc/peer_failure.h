#pragma once
// How a server says "this call failed because the peer it worked with for the call failed, not
// I": the status as it is, plus the trailing metadata kPeerFailedMetadata. A prefill worker says
// so when its KV push to the request's decode worker fails; the router then counts the failure
// against the decode worker and keeps the prefill worker, which is healthy (a failed peer ends
// its own requests and nothing else).

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace estuary::rpc {

inline constexpr char kPeerFailedMetadata[] = "peer-failed";

// ToGrpcStatus(status) (status_convert.h), with kPeerFailedMetadata added to `context` (when not
// null).
grpc::Status PeerFailed(grpc::ServerContextBase* context, const absl::Status& status);

// Whether the server's answer on `context` carried kPeerFailedMetadata.
bool ServerBlamedItsPeer(const grpc::ClientContext& context);

}  // namespace estuary::rpc
