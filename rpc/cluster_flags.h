#pragma once
// The flags of cluster security (rpc/cluster_security.h), shared by estuary-router,
// estuary-prefill and estuary-decode (cli/command_tables.cc names them for each):
//   --cluster-token T (or $ESTUARY_CLUSTER_TOKEN): every internal call carries it, every
//       internal port and the router's worker registration demand it;
//   --cluster-ca-file / --cluster-cert-file / --cluster-key-file: mutual TLS on every internal
//       port and every call between Estuary processes;
//   --tls-refresh-interval D: how often certificate files are re-read (also the router's
//       client-port TLS, rpc/client_tls.h).
// Each binary calls ConfigureClusterSecurityFromFlags once, before it serves or dials.

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(std::string, cluster_token);
ABSL_DECLARE_FLAG(std::string, cluster_ca_file);
ABSL_DECLARE_FLAG(std::string, cluster_cert_file);
ABSL_DECLARE_FLAG(std::string, cluster_key_file);
ABSL_DECLARE_FLAG(absl::Duration, tls_refresh_interval);

namespace estuary::rpc {

// Reads the flags (the token from $ESTUARY_CLUSTER_TOKEN when the flag is empty), installs
// them (ConfigureClusterSecurity: INVALID_ARGUMENT naming the flag) and logs what is on.
absl::Status ConfigureClusterSecurityFromFlags();

}  // namespace estuary::rpc
