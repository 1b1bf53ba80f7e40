#pragma once
// The KV completion message codec: what KvPusher sends the decode worker's KvReceiver after the
// last put of a request (or to abort it); the receiver decodes every message from a peer with
// DecodeKvCompletion before anything acts on it.
//
// Wire format: "EKC1" + the serialized KvCompletion + 8 bytes little-endian FNV-1a-64 of the
// serialized bytes (Transport::PeerId). Kept apart from the receiver and its pool (in
// estuary::kvtransfer, no kvcache) so that the fuzz build decodes exactly what the decode worker
// decodes (fuzz/kv_completion_fuzzer.cc).

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "estuary/v1/kv_transfer.pb.h"

namespace estuary::kvtransfer {

std::string EncodeKvCompletion(const estuary::v1::KvCompletion& completion);
// INVALID_ARGUMENT for anything but a well-formed completion: wrong magic or checksum,
// unparsable proto, an empty request id, a negative token count, a status code outside
// absl::StatusCode, or (for an OK completion) a provenance length other than num_tokens.
absl::StatusOr<estuary::v1::KvCompletion> DecodeKvCompletion(std::string_view payload);

}  // namespace estuary::kvtransfer
