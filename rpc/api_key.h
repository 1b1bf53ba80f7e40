#pragma once
// API keys on the client-facing ports (--api-key KEY or $ESTUARY_API_KEY): the router's gRPC
// port wants metadata `authorization: Bearer KEY` (else UNAUTHENTICATED), its HTTP port the
// header `Authorization: Bearer KEY` (else 401). Keys are compared in constant time, so the
// time an answer takes says nothing about how much of a guess was right. Clients (estuary client,
// bench-serve, the router's own HTTP door calling its gRPC service) attach the key with
// AttachApiKey.

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"

namespace estuary::rpc {

inline constexpr char kApiKeyEnv[] = "ESTUARY_API_KEY";

// `flag` when not empty, else $ESTUARY_API_KEY, else "" (no key).
std::string ApiKeyFromFlagOrEnv(const std::string& flag);

// Equal strings, in time that depends on the lengths only (not on where they differ).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Whether an Authorization value carries `key`: "Bearer KEY" (the scheme case-insensitive, one
// or more spaces). An empty `key` accepts everything (no key configured).
bool BearerMatches(absl::string_view authorization, absl::string_view key);

// OK when `key` is empty or the call's `authorization` metadata matches it; UNAUTHENTICATED
// otherwise (missing or wrong, without saying which part was wrong).
grpc::Status CheckApiKey(const grpc::ServerContextBase* context, const std::string& key);

// Adds `authorization: Bearer KEY` to a call (nothing when `key` is empty).
void AttachApiKey(grpc::ClientContext& context, const std::string& key);

// For channels whose calls are made elsewhere (the HTTP door's in-process channel): every call
// gets the metadata AttachApiKey adds.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> ApiKeyInterceptorFactory(
    const std::string& key);

}  // namespace estuary::rpc
