#pragma once
// The cluster's gRPC channels and their keepalive policy. A peer whose host vanishes (a pulled
// cable, a node that died without closing its sockets) sends nothing, not even a reset: only
// HTTP/2 keepalive pings notice it. Every channel between Estuary processes pings after
// kKeepaliveTime without reads and gives up kKeepaliveTimeout later, so a call to a vanished
// peer ends UNAVAILABLE within about kKeepaliveTime + kKeepaliveTimeout (3 s), in flight or
// idle; servers allow pings that often (and ping their clients the same way).

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace estuary::rpc {

inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(1);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(2);
// The largest message a cluster channel sends or receives (between Estuary processes: a worker
// request of a whole context's prompt ids is well under 1 MiB). Servers: rpc/grpc_server.h.
inline constexpr int kMaxClusterMessageBytes = 16 << 20;

// A channel to `address` with the keepalive policy and message limit above, and the cluster's
// credentials (rpc/cluster_security.h: mutual TLS and the cluster token, when configured).
std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address);

// Keepalive on a server: pings its clients, and accepts their pings at kKeepaliveTime.
void ApplyServerKeepalive(grpc::ServerBuilder& builder);

}  // namespace estuary::rpc
