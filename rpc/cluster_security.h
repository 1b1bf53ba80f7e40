#pragma once
// Security between Estuary processes (issue 14, item 4): who may call a worker's gRPC port or
// the router's worker registration, and how Estuary processes call each other. Each process
// configures it once at start, from its flags (rpc/cluster_flags.h), before any server or
// channel exists; from then on
//   - CreateClusterChannel (channels.h) dials with mutual TLS when it is configured, and sends
//     the cluster token on every call (metadata kClusterTokenMetadata);
//   - StartGrpcServer (grpc_server.h) serves with mutual TLS when it is configured: a client
//     must present a certificate that chains to the cluster CA
//     (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY), or its TLS handshake fails
//     and no call reaches a handler;
//   - every internal handler starts with CheckClusterToken (UNAUTHENTICATED without the token).
// The token is the gate where mTLS is not configured (a local cluster, a network you trust; it
// then travels in clear text) and a second factor where it is. gRPC health checking carries
// no token (Kubernetes probes send none) and is not gated by it; under mTLS it needs a
// certificate like every other call (probe over the HTTP metrics port then: /live, /health).
//
// Certificates: gRPC's FileWatcherCertificateProvider re-reads the CA, certificate and key every
// `refresh`; new connections use what it read last (open ones keep theirs), so a rotation needs
// no restart. Write a new key and certificate by renaming them into place: a key that does not
// match its certificate is not taken. Servers are verified by chain only (the cluster CA), not by
// host name, since workers are dialled by pod IP, which certificates rarely name: keep the
// cluster CA for this cluster's processes alone.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"

namespace estuary::rpc {

inline constexpr char kClusterTokenEnv[] = "ESTUARY_CLUSTER_TOKEN";
inline constexpr char kClusterTokenMetadata[] = "x-estuary-cluster-token";
// Shorter tokens are refused: a guessable token is no gate.
inline constexpr size_t kMinClusterTokenLength = 16;

struct ClusterTlsFiles {
  std::string ca_file;    // the cluster CA: every peer's certificate must chain to it
  std::string cert_file;  // this process's certificate chain, as a server and as a client
  std::string key_file;   // its private key (PEM, unencrypted)
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

struct ClusterSecurity {
  std::string token;  // empty: no token asked or sent
  ClusterTlsFiles tls;
  absl::Duration refresh = absl::Seconds(60);  // how often certificate files are re-read
};

// Checks (all three files or none, each readable, the key the certificate's, a token of
// kMinClusterTokenLength printable characters or none, refresh in [1 s, 1 h]) and installs
// `security` for this process. INVALID_ARGUMENT naming the flag; nothing changes then.
absl::Status ConfigureClusterSecurity(const ClusterSecurity& security);

bool ClusterTlsEnabled();
bool ClusterTokenSet();

// Mutual TLS with the configured files, or insecure credentials when none are configured.
std::shared_ptr<grpc::ChannelCredentials> ClusterChannelCredentials();
std::shared_ptr<grpc::ServerCredentials> ClusterServerCredentials();
// What every cluster channel's calls carry: the token (nothing when none is configured).
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
ClusterInterceptors();

// A key for one purpose, derived from the cluster token: HMAC-SHA256(token, label), 32 bytes
// (e.g. the KV descriptor seal's, kvtransfer/descriptor_seal.h). Every process of the cluster
// derives the same one; the token itself never serves as a key. Empty when no token is set;
// INTERNAL when OpenSSL fails (out of memory).
absl::StatusOr<std::string> ClusterSubkey(std::string_view label);

// OK when no token is configured, for in-process calls (`context` null), and for calls that
// carry the token (compared in constant time); UNAUTHENTICATED otherwise.
grpc::Status CheckClusterToken(const grpc::ServerContext* context);

}  // namespace estuary::rpc
