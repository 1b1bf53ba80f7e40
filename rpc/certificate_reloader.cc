#include "rpc/certificate_reloader.h"

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "rpc/tls_files.h"

namespace estuary::rpc {

// One loaded certificate chain and key; owns its OpenSSL objects (SSL_use_* take references).
struct CertificateReloader::Pair {
  X509* cert = nullptr;
  STACK_OF(X509)* chain = nullptr;  // the certificates after the leaf
  EVP_PKEY* key = nullptr;
  Pair() = default;
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  ~Pair() {
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

CertificateReloader::FileStamp CertificateReloader::StampOf(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return {};
  return FileStamp{int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
                   static_cast<int64_t>(st.st_size)};
}

absl::StatusOr<std::shared_ptr<const CertificateReloader::Pair>> CertificateReloader::Load(
    const HttpsFiles& files) {
  if (absl::Status s = CheckCertificateAndKey(
          {files.cert_file, "ssl-certfile", files.key_file, "ssl-keyfile"});
      !s.ok()) {
    return s;
  }
  auto pair = std::make_shared<Pair>();
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
  return std::shared_ptr<const Pair>(std::move(pair));
}

absl::StatusOr<std::unique_ptr<CertificateReloader>> CertificateReloader::Create(
    const HttpsFiles& files) {
  absl::StatusOr<std::shared_ptr<const Pair>> pair = Load(files);
  if (!pair.ok()) return pair.status();
  return std::unique_ptr<CertificateReloader>(new CertificateReloader(files, *std::move(pair)));
}

CertificateReloader::CertificateReloader(HttpsFiles files, std::shared_ptr<const Pair> pair)
    : files_(std::move(files)),
      pair_(std::move(pair)),
      cert_stamp_(StampOf(files_.cert_file)),
      key_stamp_(StampOf(files_.key_file)),
      checked_(absl::Now()) {}

CertificateReloader::~CertificateReloader() = default;

void CertificateReloader::InstallOn(ssl_ctx_st* context) {
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(context, &CertificateReloader::OnHandshake, this);
}

std::shared_ptr<const CertificateReloader::Pair> CertificateReloader::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < files_.refresh) return pair_;
  checked_ = now;
  const FileStamp cert = StampOf(files_.cert_file), key = StampOf(files_.key_file);
  if (cert == cert_stamp_ && key == key_stamp_) return pair_;
  absl::StatusOr<std::shared_ptr<const Pair>> fresh = Load(files_);
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

int CertificateReloader::OnHandshake(SSL* ssl, void* arg) {
  std::shared_ptr<const Pair> pair = static_cast<CertificateReloader*>(arg)->Current();
  if (SSL_use_certificate(ssl, pair->cert) != 1) return 0;
  if (SSL_use_PrivateKey(ssl, pair->key) != 1) return 0;
  return SSL_set1_chain(ssl, pair->chain) == 1 ? 1 : 0;
}

}  // namespace estuary::rpc
