#pragma once
// CheckTransferDescriptor: the prefill side's checks of a TransferDescriptor, the control
// message in which a decode worker describes the pages it reserved (its Reserve answer, carried
// to the prefill worker in the PrefillRequest). KvPusher::Create runs them before it connects or
// posts a byte; kept apart from the pusher and its pool (in estuary::kvtransfer, no kvcache) so
// that the fuzz build checks exactly what a prefill worker checks
// (fuzz/transfer_descriptor_fuzzer.cc).

#include <string_view>

#include "absl/status/status.h"
#include "estuary/v1/kv_transfer.pb.h"

namespace estuary::kvtransfer {

// Bytes of one KV element (f32, the only KV dtype).
inline constexpr int kKvDtypeBytes = sizeof(float);

// Checks, in order: the fingerprints match (FAILED_PRECONDITION naming both, fingerprint.h);
// then the descriptor against the local fingerprint (the whole model's layout) and this worker's
// transport kind: transport, worker address, a reservation epoch and a lease (the fencing:
// kvtransfer/README.md "Fencing"), per-rank layout == whole-model heads / tp_size, layers,
// head_dim, block size, dtype, enough page ids for `num_prompt_tokens`, no negative or repeated
// page id, one region per layer per rank, each region large enough for the largest page id.
// INVALID_ARGUMENT naming the field otherwise.
[[nodiscard]] absl::Status CheckTransferDescriptor(
    const estuary::v1::TransferDescriptor& descriptor,
    const estuary::v1::KvFormatFingerprint& local_fingerprint, std::string_view transport_kind,
    int num_prompt_tokens);

}  // namespace estuary::kvtransfer
