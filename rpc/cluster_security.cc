#include "rpc/cluster_security.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "rpc/api_key.h"
#include "rpc/metadata_interceptor.h"
#include "rpc/tls_files.h"

namespace estuary::rpc {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

// What ConfigureClusterSecurity installed; replaced whole, read by every channel and server.
struct State {
  ClusterSecurity settings;
  std::shared_ptr<FileWatcherCertificateProvider> certificates;  // null without mTLS
};

ABSL_CONST_INIT absl::Mutex state_mu(absl::kConstInit);
std::shared_ptr<const State>& StateSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu) {
  static auto* state = new std::shared_ptr<const State>(std::make_shared<State>());
  return *state;
}

std::shared_ptr<const State> CurrentState() {
  absl::MutexLock lock(&state_mu);
  return StateSlot();
}

absl::Status CheckToken(const std::string& token) {
  if (token.empty()) return absl::OkStatus();
  if (token.size() < kMinClusterTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-token (or $", kClusterTokenEnv, ") has ", token.size(),
        " characters; use at least ", kMinClusterTokenLength,
        " random ones (e.g. `openssl rand -hex 32`)"));
  }
  for (char c : token) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster-token (or $", kClusterTokenEnv,
          ") must be printable ASCII without spaces (it travels as gRPC metadata)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTlsFiles(const ClusterTlsFiles& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.ca_file.empty() || tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "mutual TLS between Estuary processes needs all three of --cluster-ca-file, "
        "--cluster-cert-file and --cluster-key-file");
  }
  if (absl::Status s = CheckCaFile(tls.ca_file, "cluster-ca-file"); !s.ok()) return s;
  return CheckCertificateAndKey(
      {tls.cert_file, "cluster-cert-file", tls.key_file, "cluster-key-file"});
}

}  // namespace

absl::Status ConfigureClusterSecurity(const ClusterSecurity& security) {
  if (absl::Status s = CheckToken(security.token); !s.ok()) return s;
  if (absl::Status s = CheckTlsFiles(security.tls); !s.ok()) return s;
  if (security.refresh < absl::Seconds(1) || security.refresh > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-refresh-interval = ",
                                                   absl::FormatDuration(security.refresh),
                                                   " outside [1s, 1h]"));
  }
  auto state = std::make_shared<State>();
  state->settings = security;
  if (security.tls.enabled()) {
    state->certificates = std::make_shared<FileWatcherCertificateProvider>(
        security.tls.key_file, security.tls.cert_file, security.tls.ca_file,
        static_cast<unsigned int>(absl::ToInt64Seconds(security.refresh)));
  }
  absl::MutexLock lock(&state_mu);
  StateSlot() = std::move(state);
  return absl::OkStatus();
}

bool ClusterTlsEnabled() { return CurrentState()->certificates != nullptr; }
bool ClusterTokenSet() { return !CurrentState()->settings.token.empty(); }

std::shared_ptr<grpc::ChannelCredentials> ClusterChannelCredentials() {
  std::shared_ptr<const State> state = CurrentState();
  if (state->certificates == nullptr) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(state->certificates);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  // The chain is verified against the cluster CA; host names are not (see the header).
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  options.set_check_call_host(false);
  return grpc::experimental::TlsCredentials(options);
}

std::shared_ptr<grpc::ServerCredentials> ClusterServerCredentials() {
  std::shared_ptr<const State> state = CurrentState();
  if (state->certificates == nullptr) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(state->certificates);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
ClusterInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  const std::string& token = CurrentState()->settings.token;
  if (!token.empty()) factories.push_back(MetadataInterceptorFactory(kClusterTokenMetadata, token));
  return factories;
}

absl::StatusOr<std::string> ClusterSubkey(std::string_view label) {
  const std::string& token = CurrentState()->settings.token;
  if (token.empty()) return std::string();
  unsigned char key[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(label.data()), label.size(), key,
           &size) == nullptr ||
      size == 0) {
    return absl::InternalError(absl::StrCat("HMAC-SHA256 failed deriving the cluster key '",
                                            absl::string_view(label.data(), label.size()), "'"));
  }
  return std::string(reinterpret_cast<const char*>(key), size);
}

grpc::Status CheckClusterToken(const grpc::ServerContext* context) {
  std::shared_ptr<const State> state = CurrentState();
  const std::string& token = state->settings.token;
  if (token.empty() || context == nullptr) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kClusterTokenMetadata);
  if (it != metadata.end() &&
      ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), token)) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat("this is an internal port of an Estuary cluster: calls need "
                                   "the cluster's token (--cluster-token or $",
                                   kClusterTokenEnv, " on every process of the cluster)"));
}

}  // namespace estuary::rpc
