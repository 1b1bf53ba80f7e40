#include "rpc/tls_files.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace estuary::rpc {
namespace {

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text (the leaf of a chain), or null.
std::unique_ptr<X509, X509Deleter> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  if (bio == nullptr) return nullptr;
  return std::unique_ptr<X509, X509Deleter>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " = '", path, "': cannot read it"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " = '", path, "' is empty"));
  }
  return text.str();
}

absl::Status CheckCertificateAndKey(const CertificateFiles& files) {
  absl::StatusOr<std::string> cert_pem = ReadPemFile(files.cert_file, files.cert_flag);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPemFile(files.key_file, files.key_flag);
  if (!key_pem.ok()) return key_pem.status();
  std::unique_ptr<X509, X509Deleter> cert = FirstCertificate(*cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--", files.cert_flag, " = '", files.cert_file,
                                                   "' holds no PEM certificate"));
  }
  auto key_bio = MemoryBio(*key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      key_bio == nullptr ? nullptr
                         : PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--", files.key_flag, " = '", files.key_file,
                                                   "' holds no PEM private key (unencrypted)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", files.key_flag, " = '", files.key_file, "' is not the private key of --",
        files.cert_flag, " = '", files.cert_file, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckCaFile(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> pem = ReadPemFile(path, flag);
  if (!pem.ok()) return pem.status();
  if (FirstCertificate(*pem) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " = '", path, "' holds no PEM certificate"));
  }
  return absl::OkStatus();
}

}  // namespace estuary::rpc
