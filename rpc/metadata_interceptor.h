#pragma once
// A client interceptor factory that puts one metadata entry on every call of a channel: for
// credentials sent on calls made elsewhere (the API key on the HTTP door's in-process channel,
// the cluster token on every channel between Estuary processes).

#include <memory>
#include <string>

#include "grpcpp/support/client_interceptor.h"

namespace estuary::rpc {

// Every call gets `key: value` (key in lower case, as gRPC metadata keys are).
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> MetadataInterceptorFactory(
    std::string key, std::string value);

}  // namespace estuary::rpc
