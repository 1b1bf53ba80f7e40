#include "rpc/caller_identity.h"

#include "absl/strings/str_cat.h"
#include "rpc/api_key.h"

namespace estuary::rpc {

std::string PeerIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::string identity;
  for (const grpc::string_ref& value : auth->GetPeerIdentity()) {
    if (!identity.empty()) identity += ",";
    identity.append(value.data(), value.size());
  }
  return identity;
}

std::string CallerIdentity(const grpc::ServerContextBase* context) {
  if (context == nullptr) return "";
  std::string authorization;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization.assign(it->second.data(), it->second.size());
  }
  // A separator no header value holds, so that the two parts cannot run into each other.
  return absl::StrCat(authorization, "\n", PeerIdentity(*context));
}

bool SameCaller(absl::string_view a, absl::string_view b) { return ConstantTimeEquals(a, b); }

}  // namespace estuary::rpc
