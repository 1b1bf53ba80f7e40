#include "kvtransfer/kv_control_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {
namespace {

constexpr size_t kMagicBytes = 4;
constexpr size_t kChecksumBytes = 8;
constexpr char kCompletionMagic[kMagicBytes] = {'E', 'K', 'C', '1'};
constexpr char kAttachMagic[kMagicBytes] = {'E', 'K', 'A', '1'};
constexpr char kAttachReplyMagic[kMagicBytes] = {'E', 'K', 'R', '1'};

uint64_t Checksum(std::string_view bytes) { return Transport::PeerId(bytes); }  // FNV-1a 64

std::string Frame(const char (&magic)[kMagicBytes], const google::protobuf::MessageLite& message) {
  const std::string body = message.SerializeAsString();
  std::string out;
  out.reserve(kMagicBytes + body.size() + kChecksumBytes);
  out.append(magic, kMagicBytes);
  out.append(body);
  const uint64_t sum = Checksum(body);
  for (size_t i = 0; i < kChecksumBytes; ++i) out.push_back(static_cast<char>(sum >> (8 * i)));
  return out;
}

// Checks the magic and checksum and parses the body into `out`.
absl::Status Unframe(const char (&magic)[kMagicBytes], const char* what, std::string_view payload,
                     google::protobuf::MessageLite* out) {
  if (payload.size() < kMagicBytes + kChecksumBytes ||
      std::memcmp(payload.data(), magic, kMagicBytes) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a ", what, " message (", payload.size(), " bytes, bad magic)"));
  }
  const std::string_view body =
      payload.substr(kMagicBytes, payload.size() - kMagicBytes - kChecksumBytes);
  uint64_t sum = 0;
  for (size_t i = 0; i < kChecksumBytes; ++i) {
    sum |= uint64_t{static_cast<uint8_t>(payload[payload.size() - kChecksumBytes + i])} << (8 * i);
  }
  if (sum != Checksum(body)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " message checksum mismatch (corrupted)"));
  }
  if (!out->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(what, " message does not parse"));
  }
  return absl::OkStatus();
}

absl::Status CheckRequestId(const char* what, const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " without a request id"));
  if (id.size() > kMaxKvRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " with a request id of ", id.size(),
                                                   " bytes (at most ", kMaxKvRequestIdBytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckStatus(const char* what, const std::string& id, int32_t code,
                         const std::string& message) {
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " for ", id, ": unknown status code ", code));
  }
  if (message.size() > kMaxKvStatusMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " for ", id, ": status message of ",
                                                   message.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckEpoch(const char* what, const std::string& id, uint64_t epoch) {
  if (epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " for ", id, " without a reservation epoch"));
  }
  return absl::OkStatus();
}

}  // namespace

KvControlKind PeekKvControlKind(std::string_view payload) {
  if (payload.size() < kMagicBytes) return KvControlKind::kUnknown;
  if (std::memcmp(payload.data(), kCompletionMagic, kMagicBytes) == 0) {
    return KvControlKind::kCompletion;
  }
  if (std::memcmp(payload.data(), kAttachMagic, kMagicBytes) == 0) return KvControlKind::kAttach;
  if (std::memcmp(payload.data(), kAttachReplyMagic, kMagicBytes) == 0) {
    return KvControlKind::kAttachReply;
  }
  return KvControlKind::kUnknown;
}

std::string EncodeKvCompletion(const estuary::v1::KvCompletion& completion) {
  return Frame(kCompletionMagic, completion);
}

absl::StatusOr<estuary::v1::KvCompletion> DecodeKvCompletion(std::string_view payload) {
  static constexpr char kWhat[] = "KV completion";
  estuary::v1::KvCompletion c;
  ESTUARY_RETURN_IF_ERROR(Unframe(kCompletionMagic, kWhat, payload, &c));
  ESTUARY_RETURN_IF_ERROR(CheckRequestId(kWhat, c.request_id()));
  if (c.num_tokens() < 0 || c.num_tokens() > kMaxKvPromptTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV completion for ", c.request_id(), ": num_tokens ", c.num_tokens()));
  }
  ESTUARY_RETURN_IF_ERROR(CheckStatus(kWhat, c.request_id(), c.status_code(), c.status_message()));
  ESTUARY_RETURN_IF_ERROR(CheckEpoch(kWhat, c.request_id(), c.reservation_epoch()));
  if (c.status_code() == 0 && c.provenance().size() != static_cast<size_t>(c.num_tokens())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV completion for ", c.request_id(), ": ", c.provenance().size(),
        " provenance bytes for ", c.num_tokens(), " tokens"));
  }
  return c;
}

std::string EncodeKvAttach(const estuary::v1::KvAttach& attach) {
  return Frame(kAttachMagic, attach);
}

absl::StatusOr<estuary::v1::KvAttach> DecodeKvAttach(std::string_view payload) {
  static constexpr char kWhat[] = "KV attach";
  estuary::v1::KvAttach a;
  ESTUARY_RETURN_IF_ERROR(Unframe(kAttachMagic, kWhat, payload, &a));
  ESTUARY_RETURN_IF_ERROR(CheckRequestId(kWhat, a.request_id()));
  ESTUARY_RETURN_IF_ERROR(CheckEpoch(kWhat, a.request_id(), a.reservation_epoch()));
  if (a.writer_address().empty() || a.writer_address().size() > kMaxKvWriterAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV attach for ", a.request_id(), ": writer address of ", a.writer_address().size(),
        " bytes (1 to ", kMaxKvWriterAddressBytes, ")"));
  }
  if (a.descriptor_digest().size() != kKvAttachDigestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV attach for ", a.request_id(), ": descriptor digest of ",
        a.descriptor_digest().size(), " bytes (want ", kKvAttachDigestBytes, ")"));
  }
  return a;
}

std::string EncodeKvAttachReply(const estuary::v1::KvAttachReply& reply) {
  return Frame(kAttachReplyMagic, reply);
}

absl::StatusOr<estuary::v1::KvAttachReply> DecodeKvAttachReply(std::string_view payload) {
  static constexpr char kWhat[] = "KV attach reply";
  estuary::v1::KvAttachReply r;
  ESTUARY_RETURN_IF_ERROR(Unframe(kAttachReplyMagic, kWhat, payload, &r));
  ESTUARY_RETURN_IF_ERROR(CheckRequestId(kWhat, r.request_id()));
  ESTUARY_RETURN_IF_ERROR(CheckEpoch(kWhat, r.request_id(), r.reservation_epoch()));
  ESTUARY_RETURN_IF_ERROR(CheckStatus(kWhat, r.request_id(), r.status_code(), r.status_message()));
  return r;
}

}  // namespace estuary::kvtransfer
