#include "kvtransfer/kv_completion.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {
namespace {

constexpr char kMagic[4] = {'E', 'K', 'C', '1'};
constexpr size_t kChecksumBytes = 8;

uint64_t Checksum(std::string_view bytes) { return Transport::PeerId(bytes); }  // FNV-1a 64

}  // namespace

std::string EncodeKvCompletion(const estuary::v1::KvCompletion& completion) {
  std::string body = completion.SerializeAsString();
  std::string out;
  out.reserve(sizeof(kMagic) + body.size() + kChecksumBytes);
  out.append(kMagic, sizeof(kMagic));
  out.append(body);
  const uint64_t sum = Checksum(body);
  for (size_t i = 0; i < kChecksumBytes; ++i) out.push_back(static_cast<char>(sum >> (8 * i)));
  return out;
}

absl::StatusOr<estuary::v1::KvCompletion> DecodeKvCompletion(std::string_view payload) {
  if (payload.size() < sizeof(kMagic) + kChecksumBytes ||
      std::memcmp(payload.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a KV completion message (", payload.size(), " bytes, bad magic)"));
  }
  const std::string_view body =
      payload.substr(sizeof(kMagic), payload.size() - sizeof(kMagic) - kChecksumBytes);
  uint64_t sum = 0;
  for (size_t i = 0; i < kChecksumBytes; ++i) {
    sum |= uint64_t{static_cast<uint8_t>(payload[payload.size() - kChecksumBytes + i])} << (8 * i);
  }
  if (sum != Checksum(body)) {
    return absl::InvalidArgumentError("KV completion message checksum mismatch (corrupted)");
  }
  estuary::v1::KvCompletion c;
  if (!c.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("KV completion message does not parse");
  }
  if (c.request_id().empty()) {
    return absl::InvalidArgumentError("KV completion without a request id");
  }
  if (c.num_tokens() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV completion for ", c.request_id(), ": negative num_tokens"));
  }
  if (c.status_code() < 0 || c.status_code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(absl::StrCat("KV completion for ", c.request_id(),
                                                   ": unknown status code ", c.status_code()));
  }
  if (c.status_code() == 0 && c.provenance().size() != static_cast<size_t>(c.num_tokens())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV completion for ", c.request_id(), ": ", c.provenance().size(),
        " provenance bytes for ", c.num_tokens(), " tokens"));
  }
  return c;
}

}  // namespace estuary::kvtransfer
