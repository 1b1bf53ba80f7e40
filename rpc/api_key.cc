#include "rpc/api_key.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/metadata_interceptor.h"

namespace estuary::rpc {
namespace {

constexpr char kAuthorization[] = "authorization";  // gRPC metadata keys are lower case

}  // namespace

std::string ApiKeyFromFlagOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv(kApiKeyEnv);
  return env == nullptr ? std::string() : std::string(env);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of the longer string is visited whatever the contents; a length difference is
  // folded into the same accumulator.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool BearerMatches(absl::string_view authorization, absl::string_view key) {
  if (key.empty()) return true;
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  return ConstantTimeEquals(absl::StripLeadingAsciiWhitespace(authorization.substr(kScheme.size())),
                            key);
}

grpc::Status CheckApiKey(const grpc::ServerContextBase* context, const std::string& key) {
  if (key.empty()) return grpc::Status::OK;
  if (context != nullptr) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kAuthorization);
    if (it != metadata.end() &&
        BearerMatches(absl::string_view(it->second.data(), it->second.size()), key)) {
      return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this router needs an API key: send metadata `authorization: Bearer KEY` "
                      "(estuary client --api-key KEY or $ESTUARY_API_KEY)");
}

void AttachApiKey(grpc::ClientContext& context, const std::string& key) {
  if (!key.empty()) context.AddMetadata(kAuthorization, absl::StrCat("Bearer ", key));
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> ApiKeyInterceptorFactory(
    const std::string& key) {
  return MetadataInterceptorFactory(kAuthorization, absl::StrCat("Bearer ", key));
}

}  // namespace estuary::rpc
