#pragma once
// The wire codec of the KV push protocol's control messages (README "Push protocol",
// "Fencing"): what travels through Transport::SendMessage besides the bytes of the puts.
//
//   KvCompletion   prefill -> decode  "EKC1"  the writer is done (OK: the KV is complete; else it
//                                             aborted); sent after the writer's last flush
//   KvAttach       prefill -> decode  "EKA1"  the writer asks to push into a reservation
//   KvAttachReply  decode -> prefill  "EKR1"  yes (OK) or no
//
// Every message is its 4-byte magic + the serialized proto + 8 bytes little-endian FNV-1a-64 of
// the serialized bytes. Decoding never trusts the peer: besides the framing (magic, checksum,
// parse) every field is bounded (request ids, messages and addresses by length, status codes to
// absl's, token counts, a nonzero epoch), so what comes out can be checked against the
// receiver's own state (the reservation) without overflow or oversized allocations.
// INVALID_ARGUMENT, naming what is wrong, otherwise.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "estuary/v1/kv_transfer.pb.h"

namespace estuary::kvtransfer {

// Bounds on what a peer may send (the receiver rejects anything larger).
inline constexpr size_t kMaxKvRequestIdBytes = 256;
inline constexpr size_t kMaxKvStatusMessageBytes = 1024;
inline constexpr size_t kMaxKvWriterAddressBytes = 4096;
inline constexpr int32_t kMaxKvPromptTokens = 1 << 20;
// KvAttach.descriptor_digest: a SHA-256 (descriptor_seal.h).
inline constexpr size_t kKvAttachDigestBytes = 32;

// Which control message a payload is, by its magic (no other check).
enum class KvControlKind { kUnknown, kCompletion, kAttach, kAttachReply };
KvControlKind PeekKvControlKind(std::string_view payload);

// KvCompletion. Decode also requires: a request id, 0 <= num_tokens <= kMaxKvPromptTokens, a
// status code within absl::StatusCode, a nonzero reservation epoch, and (status OK) exactly
// num_tokens provenance bytes.
std::string EncodeKvCompletion(const estuary::v1::KvCompletion& completion);
absl::StatusOr<estuary::v1::KvCompletion> DecodeKvCompletion(std::string_view payload);

// KvAttach. Decode also requires: a request id, a nonzero epoch, a writer address, a descriptor
// digest of kKvAttachDigestBytes.
std::string EncodeKvAttach(const estuary::v1::KvAttach& attach);
absl::StatusOr<estuary::v1::KvAttach> DecodeKvAttach(std::string_view payload);

// KvAttachReply. Decode also requires: a request id, a nonzero epoch, a status code within
// absl::StatusCode.
std::string EncodeKvAttachReply(const estuary::v1::KvAttachReply& reply);
absl::StatusOr<estuary::v1::KvAttachReply> DecodeKvAttachReply(std::string_view payload);

}  // namespace estuary::kvtransfer
