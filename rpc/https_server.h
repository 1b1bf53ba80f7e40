#pragma once
// HTTPS for a process's HTTP server (the router's OpenAI door with --ssl-certfile /
// --ssl-keyfile): cpp-httplib's SSLServer whose certificate callback hands each new connection
// the files' current certificate chain and key. The files are re-read when their modification
// time or size changes (looked at no more often than every `refresh`), so a rotated certificate
// serves new connections without a restart; a pair that fails to load (half written, a key of
// another certificate) is logged and the previous pair stays in use.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
}

namespace estuary::rpc {

struct HttpsFiles {
  std::string cert_file;  // PEM certificate chain, leaf first; empty: plain HTTP
  std::string key_file;   // PEM private key (unencrypted)
  absl::Duration refresh = absl::Seconds(60);
};

// A plain httplib::Server when `files.cert_file` is empty, else an httplib::SSLServer (TLS 1.2
// or later). INVALID_ARGUMENT when the files do not load (naming them).
absl::StatusOr<std::unique_ptr<httplib::Server>> NewHttpServer(const HttpsFiles& files);

}  // namespace estuary::rpc
