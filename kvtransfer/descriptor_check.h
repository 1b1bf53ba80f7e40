#pragma once
// CheckTransferDescriptor: the prefill side's checks of a TransferDescriptor, the control
// message in which a decode worker describes the pages it reserved (its Reserve answer, carried
// to the prefill worker in the PrefillRequest). KvPusher::Create runs them before it connects or
// posts a byte; kept apart from the pusher and its pool (in estuary::kvtransfer, no kvcache) so
// that the fuzz build checks exactly what a prefill worker checks
// (fuzz/transfer_descriptor_fuzzer.cc).

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "estuary/v1/kv_transfer.pb.h"

namespace estuary::kvtransfer {

// Bytes of one KV element (f32, the only KV dtype).
inline constexpr int kKvDtypeBytes = sizeof(float);
// The most a descriptor's transport address (its own, each rank's) or packed rkey may have: the
// transport unpacks them, so nothing larger reaches it. UCX 1.13's tcp worker addresses here are
// 100-300 bytes and its rkeys under 100; 4 KiB leaves room for many devices and RDMA transports.
inline constexpr size_t kMaxDescriptorAddressBytes = 4096;
inline constexpr size_t kMaxDescriptorRkeyBytes = 4096;

// Checks, in order: the fingerprints match (FAILED_PRECONDITION naming both, fingerprint.h);
// then the descriptor against the local fingerprint (the whole model's layout) and this worker's
// transport kind: transport, worker address (1 to kMaxDescriptorAddressBytes bytes, as is every
// rank's own), a reservation epoch and a lease (the fencing:
// kvtransfer/README.md "Fencing"), per-rank layout == whole-model heads / tp_size, layers,
// head_dim, block size, dtype, enough page ids for `num_prompt_tokens`, no negative or repeated
// page id, one region per layer per rank, each region large enough for the largest page id, not
// wrapping around the address space, with a packed rkey of 1 to kMaxDescriptorRkeyBytes bytes.
// INVALID_ARGUMENT naming the field otherwise. The seal (descriptor_seal.h) is checked before.
[[nodiscard]] absl::Status CheckTransferDescriptor(
    const estuary::v1::TransferDescriptor& descriptor,
    const estuary::v1::KvFormatFingerprint& local_fingerprint, std::string_view transport_kind,
    int num_prompt_tokens);

}  // namespace estuary::kvtransfer
