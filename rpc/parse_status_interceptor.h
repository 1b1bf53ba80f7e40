#pragma once
// ParseStatusInterceptorFactory: makes a server's answer to a request message that does not
// parse a typed, named one. gRPC's own answer (grpcpp's GenericDeserialize) is INTERNAL with an
// empty message, which reads as a server bug to a client and to alerting; this interceptor
// replaces it with INVALID_ARGUMENT "the request message of /pkg.Service/Method did not parse
// (malformed protobuf)". StartGrpcServer (grpc_server.h) installs it on every server, so every
// gRPC port of every process answers malformed requests alike (reliability.md C10).
//
// How: a sync server hands interceptors the deserialized request at POST_RECV_MESSAGE, and a
// null one when deserialization failed; at PRE_SEND_STATUS the interceptor rewrites the status of
// such a call. Calls whose request parsed pass through untouched.

#include "grpcpp/support/server_interceptor.h"

namespace estuary::rpc {

class ParseStatusInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace estuary::rpc
