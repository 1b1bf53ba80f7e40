#pragma once
// Certificate files as Estuary's flags name them (PEM): checked once at start so that a wrong
// path, a key that does not belong to its certificate or a CA file with no certificate is an
// error naming the flag, not a handshake that fails later on every connection. gRPC and
// the HTTP door (rpc/certificate_reloader.h) re-read the files themselves while serving
// (rotation); this only reads them.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace estuary::rpc {

// A certificate chain and its private key, each with the flag that named it (for errors).
struct CertificateFiles {
  std::string cert_file;
  std::string cert_flag;
  std::string key_file;
  std::string key_flag;
};

// The whole file; INVALID_ARGUMENT naming `flag` when it cannot be read or is empty.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

// INVALID_ARGUMENT naming the flag: a file unreadable, not PEM, no certificate in the chain,
// no private key, or a key that is not the certificate's.
absl::Status CheckCertificateAndKey(const CertificateFiles& files);

// INVALID_ARGUMENT naming `flag` when `path` holds no PEM certificate.
absl::Status CheckCaFile(const std::string& path, const std::string& flag);

}  // namespace estuary::rpc
