#pragma once
// TLS on the router's client port (estuary-router --ssl-certfile / --ssl-keyfile, vLLM's names)
// and for the clients that dial it (estuary client / bench-serve --ssl-ca-certs). Server-side
// TLS only: clients are authenticated by their API key (rpc/api_key.h), not by certificates.
// The certificate and key are re-read every `refresh` (gRPC's FileWatcherCertificateProvider;
// the HTTP door: rpc/certificate_reloader.h), so a rotation needs no restart.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace estuary::rpc {

struct ClientPortTls {
  std::string cert_file;  // --ssl-certfile: the router's certificate chain (PEM)
  std::string key_file;   // --ssl-keyfile: its private key
  absl::Duration refresh = absl::Seconds(60);
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Both files or neither, readable, the key the certificate's; INVALID_ARGUMENT naming the flag.
absl::Status CheckClientPortTls(const ClientPortTls& tls);

// TLS with the files (no client certificate asked), or insecure credentials when not enabled.
std::shared_ptr<grpc::ServerCredentials> ClientPortCredentials(const ClientPortTls& tls);

// A channel to a router's client port: TLS verified against the CA in `ca_file` (PEM; the
// certificate must name the host dialled) when it is set, plaintext otherwise. INVALID_ARGUMENT
// when the file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateRouterChannel(const std::string& address,
                                                                  const std::string& ca_file);

}  // namespace estuary::rpc
