#pragma once
// Who made a gRPC call, for binding what a call creates to its caller (the router's request
// ids: only the caller that made a Generate may Abort it). A caller is what its call presented:
// its `authorization` metadata (the API key, or any bearer value a client chooses to send) and
// its TLS peer identity (the client certificate's subject alternative names, else its common
// name) when it presented a certificate. Identities hold credentials: compare them with
// SameCaller, never log them.

#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace estuary::rpc {

// The peer certificate's identity (SANs, else CN; comma-separated); "" without one.
std::string PeerIdentity(const grpc::ServerContextBase& context);

// The caller's identity as above; "" for a null context (an in-process call) or a call that
// presented nothing.
std::string CallerIdentity(const grpc::ServerContextBase* context);

// Whether two identities are the same caller, in time that depends on their lengths only.
bool SameCaller(absl::string_view a, absl::string_view b);

}  // namespace estuary::rpc
