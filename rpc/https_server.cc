#include "rpc/https_server.h"

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "httplib.h"
#include "rpc/tls_files.h"

namespace estuary::rpc {
namespace {

// One loaded certificate chain and key; owns its OpenSSL objects (SSL_use_* take references).
struct LoadedPair {
  X509* cert = nullptr;
  STACK_OF(X509)* chain = nullptr;  // the certificates after the leaf
  EVP_PKEY* key = nullptr;
  LoadedPair() = default;
  LoadedPair(const LoadedPair&) = delete;
  LoadedPair& operator=(const LoadedPair&) = delete;
  ~LoadedPair() {
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

// What identifies a version of a file: its modification time and size.
struct FileStamp {
  timespec mtime{};
  off_t size = -1;
  bool operator==(const FileStamp& o) const {
    return mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec && size == o.size;
  }
};

FileStamp Stamp(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return {};
  return FileStamp{st.st_mtim, st.st_size};
}

absl::StatusOr<std::shared_ptr<const LoadedPair>> LoadPair(const HttpsFiles& files) {
  if (absl::Status s = CheckCertificateAndKey(
          {files.cert_file, "ssl-certfile", files.key_file, "ssl-keyfile"});
      !s.ok()) {
    return s;
  }
  auto pair = std::make_shared<LoadedPair>();
  absl::StatusOr<std::string> cert_pem = ReadPemFile(files.cert_file, "ssl-certfile");
  absl::StatusOr<std::string> key_pem = ReadPemFile(files.key_file, "ssl-keyfile");
  if (!cert_pem.ok()) return cert_pem.status();
  if (!key_pem.ok()) return key_pem.status();
  BIO* cert_bio = BIO_new_mem_buf(cert_pem->data(), static_cast<int>(cert_pem->size()));
  pair->cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  pair->chain = sk_X509_new_null();
  while (X509* more = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr)) {
    sk_X509_push(pair->chain, more);
  }
  BIO_free(cert_bio);
  BIO* key_bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
  pair->key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  if (pair->cert == nullptr || pair->key == nullptr ||
      X509_check_private_key(pair->cert, pair->key) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load --ssl-certfile = '",
                                                   files.cert_file, "' with --ssl-keyfile = '",
                                                   files.key_file, "'"));
  }
  return pair;
}

// Serves the current pair to the TLS handshakes of every connection; thread-safe.
class CertificateReloader {
 public:
  static absl::StatusOr<std::unique_ptr<CertificateReloader>> Create(const HttpsFiles& files) {
    absl::StatusOr<std::shared_ptr<const LoadedPair>> pair = LoadPair(files);
    if (!pair.ok()) return pair.status();
    return std::unique_ptr<CertificateReloader>(new CertificateReloader(files, *std::move(pair)));
  }

  std::shared_ptr<const LoadedPair> Current() {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - checked_ < files_.refresh) return pair_;
    checked_ = now;
    const FileStamp cert = Stamp(files_.cert_file), key = Stamp(files_.key_file);
    if (cert == cert_stamp_ && key == key_stamp_) return pair_;
    absl::StatusOr<std::shared_ptr<const LoadedPair>> fresh = LoadPair(files_);
    if (!fresh.ok()) {
      ESTUARY_LOG(WARNING) << "HTTPS certificate changed but does not load (keeping the previous "
                              "one): " << fresh.status();
      return pair_;
    }
    ESTUARY_LOG(INFO) << "HTTPS certificate reloaded from " << files_.cert_file;
    pair_ = *std::move(fresh);
    cert_stamp_ = cert;
    key_stamp_ = key;
    return pair_;
  }

  // SSL_CTX_set_cert_cb's callback: `arg` is the reloader.
  static int OnHandshake(SSL* ssl, void* arg) {
    std::shared_ptr<const LoadedPair> pair = static_cast<CertificateReloader*>(arg)->Current();
    if (SSL_use_certificate(ssl, pair->cert) != 1) return 0;
    if (SSL_use_PrivateKey(ssl, pair->key) != 1) return 0;
    return SSL_set1_chain(ssl, pair->chain) == 1 ? 1 : 0;
  }

 private:
  CertificateReloader(HttpsFiles files, std::shared_ptr<const LoadedPair> pair)
      : files_(std::move(files)),
        pair_(std::move(pair)),
        cert_stamp_(Stamp(files_.cert_file)),
        key_stamp_(Stamp(files_.key_file)),
        checked_(absl::Now()) {}

  const HttpsFiles files_;
  absl::Mutex mu_;
  std::shared_ptr<const LoadedPair> pair_ ABSL_GUARDED_BY(mu_);
  FileStamp cert_stamp_ ABSL_GUARDED_BY(mu_);
  FileStamp key_stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

// An SSLServer that owns the reloader its SSL_CTX calls back into.
class ReloadingSslServer final : public httplib::SSLServer {
 public:
  explicit ReloadingSslServer(std::unique_ptr<CertificateReloader> reloader)
      : httplib::SSLServer([r = reloader.get()](SSL_CTX& ctx) {
          SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
          SSL_CTX_set_cert_cb(&ctx, &CertificateReloader::OnHandshake, r);
          return true;
        }),
        reloader_(std::move(reloader)) {}

 private:
  std::unique_ptr<CertificateReloader> reloader_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<httplib::Server>> NewHttpServer(const HttpsFiles& files) {
  if (files.cert_file.empty() && files.key_file.empty()) {
    return std::make_unique<httplib::Server>();
  }
  absl::StatusOr<std::unique_ptr<CertificateReloader>> reloader =
      CertificateReloader::Create(files);
  if (!reloader.ok()) return reloader.status();
  auto server = std::make_unique<ReloadingSslServer>(*std::move(reloader));
  if (!server->is_valid()) {
    return absl::InternalError("cannot set up TLS for the HTTP server (OpenSSL)");
  }
  return std::unique_ptr<httplib::Server>(std::move(server));
}

}  // namespace estuary::rpc
