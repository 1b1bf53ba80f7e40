#include "rpc/cluster_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "core/common/logging.h"
#include "rpc/cluster_security.h"

ABSL_FLAG(std::string, cluster_token, "",
          "shared secret of the cluster's processes: sent on every internal call, demanded by "
          "every internal port and by worker registration (UNAUTHENTICATED otherwise); the "
          "workers also derive from it the key that seals KV transfer descriptors; at least "
          "16 characters; default: $ESTUARY_CLUSTER_TOKEN (preferred: argv is visible to local "
          "users), else none");
ABSL_FLAG(std::string, cluster_ca_file, "",
          "mutual TLS between Estuary processes: the cluster CA (PEM) that every peer's "
          "certificate must chain to; with --cluster-cert-file and --cluster-key-file");
ABSL_FLAG(std::string, cluster_cert_file, "",
          "mutual TLS: this process's certificate chain (PEM), presented as server and client");
ABSL_FLAG(std::string, cluster_key_file, "", "mutual TLS: this process's private key (PEM)");
ABSL_FLAG(absl::Duration, tls_refresh_interval, absl::Seconds(60),
          "how often certificate and key files are re-read (a rotation needs no restart; new "
          "connections take the new files)");

namespace estuary::rpc {

absl::Status ConfigureClusterSecurityFromFlags() {
  ClusterSecurity security;
  security.token = absl::GetFlag(FLAGS_cluster_token);
  if (security.token.empty()) {
    if (const char* env = std::getenv(kClusterTokenEnv); env != nullptr) security.token = env;
  }
  security.tls.ca_file = absl::GetFlag(FLAGS_cluster_ca_file);
  security.tls.cert_file = absl::GetFlag(FLAGS_cluster_cert_file);
  security.tls.key_file = absl::GetFlag(FLAGS_cluster_key_file);
  security.refresh = absl::GetFlag(FLAGS_tls_refresh_interval);
  if (absl::Status s = ConfigureClusterSecurity(security); !s.ok()) return s;
  if (security.tls.enabled()) {
    ESTUARY_LOG(INFO) << "cluster: mutual TLS on internal ports and calls (CA "
                      << security.tls.ca_file << ", files re-read every "
                      << absl::FormatDuration(security.refresh) << ")"
                      << (security.token.empty() ? "" : ", cluster token required");
  } else if (!security.token.empty()) {
    ESTUARY_LOG(INFO) << "cluster: token required on internal ports (no TLS: it travels in "
                         "clear text)";
  } else {
    ESTUARY_LOG(WARNING) << "cluster: no token and no mutual TLS: internal ports are open to "
                            "anyone who reaches them (--cluster-token, --cluster-ca-file)";
  }
  return absl::OkStatus();
}

}  // namespace estuary::rpc
