#include "rpc/peer_failure.h"

#include "rpc/status_convert.h"

namespace estuary::rpc {

grpc::Status PeerFailed(grpc::ServerContextBase* context, const absl::Status& status) {
  if (context != nullptr) context->AddTrailingMetadata(kPeerFailedMetadata, "1");
  return ToGrpcStatus(status);
}

bool ServerBlamedItsPeer(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto it = trailers.find(kPeerFailedMetadata);
  return it != trailers.end() && it->second == "1";
}

}  // namespace estuary::rpc
