#include "kvtransfer/descriptor_seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace estuary::kvtransfer {
namespace {

namespace pb = ::google::protobuf;

constexpr char kCanonicalTag[] = "EKD1";  // bumps with the encoding below
constexpr size_t kMaxIdInMessage = 256;

// The fields of `type` in field-number order. Declared in that order (all of ours are), they
// are taken as they are: no allocation per message.
absl::InlinedVector<const pb::FieldDescriptor*, 16> ByNumber(const pb::Descriptor& type) {
  absl::InlinedVector<const pb::FieldDescriptor*, 16> fields;
  for (int i = 0; i < type.field_count(); ++i) fields.push_back(type.field(i));
  if (!std::is_sorted(fields.begin(), fields.end(), [](const auto* a, const auto* b) {
        return a->number() < b->number();
      })) {
    std::sort(fields.begin(), fields.end(),
              [](const auto* a, const auto* b) { return a->number() < b->number(); });
  }
  return fields;
}

// The canonical encoding (header): every field by number, then its value, recursively.
class CanonicalWriter {
 public:
  explicit CanonicalWriter(std::string* out) : out_(*out) {}

  void Fields(const pb::Message& message, const pb::FieldDescriptor* skip) {
    const pb::Reflection& reflection = *message.GetReflection();
    for (const pb::FieldDescriptor* field : ByNumber(*message.GetDescriptor())) {
      if (field == skip) continue;
      Word(static_cast<uint64_t>(field->number()));
      if (field->is_repeated()) {
        const int n = reflection.FieldSize(message, field);
        Word(static_cast<uint64_t>(n));
        for (int i = 0; i < n; ++i) Value(message, reflection, field, i);
      } else {
        Value(message, reflection, field, -1);
      }
    }
  }

 private:
  void Word(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void Signed(int64_t v) { Word(static_cast<uint64_t>(v)); }
  void Bytes(std::string_view bytes) {
    Word(bytes.size());
    out_.append(bytes);
  }

  // One value of `field`: element `index` of a repeated field, or the singular one (index -1).
  void Value(const pb::Message& m, const pb::Reflection& r, const pb::FieldDescriptor* f,
             int index) {
    const bool rep = index >= 0;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        return Signed(rep ? r.GetRepeatedInt32(m, f, index) : r.GetInt32(m, f));
      case pb::FieldDescriptor::CPPTYPE_INT64:
        return Signed(rep ? r.GetRepeatedInt64(m, f, index) : r.GetInt64(m, f));
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        return Word(rep ? r.GetRepeatedUInt32(m, f, index) : r.GetUInt32(m, f));
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        return Word(rep ? r.GetRepeatedUInt64(m, f, index) : r.GetUInt64(m, f));
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        return Word(rep ? r.GetRepeatedBool(m, f, index) : r.GetBool(m, f));
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        return Signed(rep ? r.GetRepeatedEnumValue(m, f, index) : r.GetEnumValue(m, f));
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        return Word(std::bit_cast<uint32_t>(rep ? r.GetRepeatedFloat(m, f, index)
                                                : r.GetFloat(m, f)));
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        return Word(std::bit_cast<uint64_t>(rep ? r.GetRepeatedDouble(m, f, index)
                                                : r.GetDouble(m, f)));
      case pb::FieldDescriptor::CPPTYPE_STRING: {
        std::string scratch;
        return Bytes(rep ? r.GetRepeatedStringReference(m, f, index, &scratch)
                         : r.GetStringReference(m, f, &scratch));
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        if (rep) return Fields(r.GetRepeatedMessage(m, f, index), nullptr);
        // Presence too: the decode worker sets every message field.
        out_.push_back(r.HasField(m, f) ? 1 : 0);
        if (r.HasField(m, f)) Fields(r.GetMessage(m, f), nullptr);
        return;
    }
  }

  std::string& out_;
};

std::string Quoted(const std::string& request_id) {
  return absl::StrCat("'", request_id.substr(0, kMaxIdInMessage), "'");
}

}  // namespace

std::string CanonicalDescriptorBytes(const estuary::v1::TransferDescriptor& descriptor) {
  std::string out(kCanonicalTag);
  CanonicalWriter(&out).Fields(
      descriptor, estuary::v1::TransferDescriptor::descriptor()->FindFieldByNumber(
                      estuary::v1::TransferDescriptor::kSealFieldNumber));
  return out;
}

// A failure of OpenSSL (out of memory) gives an empty digest or seal: it matches nothing, so the
// descriptor or attach is refused rather than trusted.
std::string DescriptorDigest(const estuary::v1::TransferDescriptor& descriptor) {
  const std::string bytes = CanonicalDescriptorBytes(descriptor);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1 ||
      size != kDescriptorDigestBytes) {
    ESTUARY_LOG(ERROR) << "SHA-256 of a transfer descriptor failed";
    return "";
  }
  return std::string(reinterpret_cast<const char*>(digest), size);
}

std::string DescriptorSeal::SealOf(const estuary::v1::TransferDescriptor& descriptor) const {
  const std::string bytes = CanonicalDescriptorBytes(descriptor);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
           reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), mac,
           &size) == nullptr ||
      size != kDescriptorSealBytes) {
    ESTUARY_LOG(ERROR) << "HMAC-SHA256 of a transfer descriptor failed";
    return "";
  }
  return std::string(reinterpret_cast<const char*>(mac), size);
}

void DescriptorSeal::Seal(estuary::v1::TransferDescriptor* descriptor) const {
  descriptor->clear_seal();
  if (enabled()) descriptor->set_seal(SealOf(*descriptor));
}

absl::Status DescriptorSeal::Verify(const estuary::v1::TransferDescriptor& descriptor) const {
  if (!enabled()) return absl::OkStatus();
  const std::string& seal = descriptor.seal();
  if (seal.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "transfer descriptor for ", Quoted(descriptor.request_id()),
        " carries no seal, and this worker checks seals (it has the cluster token): it was not "
        "issued by a decode worker of this cluster, or that worker runs without "
        "--cluster-token"));
  }
  const std::string want = SealOf(descriptor);
  if (want.empty() || seal.size() != want.size() || CRYPTO_memcmp(seal.data(), want.data(), want.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "transfer descriptor for ", Quoted(descriptor.request_id()),
        ": its seal does not match its fields: it was altered after its decode worker issued it, "
        "or issued under another cluster token"));
  }
  return absl::OkStatus();
}

}  // namespace estuary::kvtransfer
