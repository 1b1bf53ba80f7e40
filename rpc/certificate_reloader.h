#pragma once
// HTTPS certificates that rotate without a restart (the router's OpenAI door with --ssl-certfile
// / --ssl-keyfile). A CertificateReloader installed on an OpenSSL server context hands each new
// connection's handshake the files' current certificate chain and key. The files are re-read
// when their modification time or size changes (looked at no more often than every `refresh`),
// so a rotated certificate serves new connections at once; a pair that fails to load (half
// written, a key of another certificate) is logged and the previous pair stays in use.
// rpc/http_server.h installs one on its Asio TLS context; OpenSSL only here.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // OpenSSL's SSL

namespace estuary::rpc {

struct HttpsFiles {
  std::string cert_file;  // PEM certificate chain, leaf first; empty: plain HTTP
  std::string key_file;   // PEM private key (unencrypted)
  absl::Duration refresh = absl::Seconds(60);

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

class CertificateReloader {
 public:
  // Loads the pair once; INVALID_ARGUMENT naming the files when it does not load.
  static absl::StatusOr<std::unique_ptr<CertificateReloader>> Create(const HttpsFiles& files);
  ~CertificateReloader();
  CertificateReloader(const CertificateReloader&) = delete;
  CertificateReloader& operator=(const CertificateReloader&) = delete;

  // Makes every handshake on `context` (TLS 1.2 or later from here on) take the current pair.
  // The reloader must outlive the context's connections.
  void InstallOn(ssl_ctx_st* context);

 private:
  struct Pair;  // one loaded chain and key (OpenSSL objects)
  // What identifies a version of a file: its modification time and size.
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    bool operator==(const FileStamp& o) const { return mtime_ns == o.mtime_ns && size == o.size; }
  };
  static FileStamp StampOf(const std::string& path);
  static absl::StatusOr<std::shared_ptr<const Pair>> Load(const HttpsFiles& files);

  CertificateReloader(HttpsFiles files, std::shared_ptr<const Pair> pair);
  std::shared_ptr<const Pair> Current();
  // SSL_CTX_set_cert_cb's callback: `arg` is the reloader.
  static int OnHandshake(ssl_st* ssl, void* arg);

  const HttpsFiles files_;
  absl::Mutex mu_;
  std::shared_ptr<const Pair> pair_ ABSL_GUARDED_BY(mu_);
  FileStamp cert_stamp_ ABSL_GUARDED_BY(mu_);
  FileStamp key_stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary::rpc
