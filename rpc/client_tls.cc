#include "rpc/client_tls.h"

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "rpc/tls_files.h"

namespace estuary::rpc {

absl::Status CheckClientPortTls(const ClientPortTls& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS on the client port needs both --ssl-certfile and --ssl-keyfile");
  }
  if (tls.refresh < absl::Seconds(1) || tls.refresh > absl::Hours(1)) {
    return absl::InvalidArgumentError("--tls-refresh-interval must be in [1s, 1h]");
  }
  return CheckCertificateAndKey({tls.cert_file, "ssl-certfile", tls.key_file, "ssl-keyfile"});
}

std::shared_ptr<grpc::ServerCredentials> ClientPortCredentials(const ClientPortTls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  auto certificates = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, static_cast<unsigned int>(absl::ToInt64Seconds(tls.refresh)));
  grpc::experimental::TlsServerCredentialsOptions options(certificates);
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateRouterChannel(const std::string& address,
                                                                  const std::string& ca_file) {
  if (ca_file.empty()) return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  absl::StatusOr<std::string> roots = ReadPemFile(ca_file, "ssl-ca-certs");
  if (!roots.ok()) return roots.status();
  if (absl::Status s = CheckCaFile(ca_file, "ssl-ca-certs"); !s.ok()) return s;
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *roots;
  return grpc::CreateChannel(address, grpc::SslCredentials(options));
}

}  // namespace estuary::rpc
