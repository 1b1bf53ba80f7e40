#pragma once
// KV format fingerprints: what must agree between a prefill worker and a decode worker before
// KV bytes move between them (model, dtype, whole-model layout; not TP sizes).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "estuary/v1/kv_transfer.pb.h"

namespace estuary::kvtransfer {

// A fingerprint for `model_id` with the whole model's layout (n_kv_heads = all KV heads).
estuary::v1::KvFormatFingerprint MakeFingerprint(const std::string& model_id, int n_layers,
                                                 int n_kv_heads_total, int head_dim,
                                                 int block_size, const std::string& dtype = "f32");

// Canonical text, e.g. "model=llama-3.2-1b dtype=f32 layers=16 kv_heads=8 head_dim=64 block=16".
std::string FingerprintString(const estuary::v1::KvFormatFingerprint& fingerprint);
// FNV-1a of FingerprintString: a compact value for logs and caches.
uint64_t FingerprintHash(const estuary::v1::KvFormatFingerprint& fingerprint);

// OK when both describe the same KV format; otherwise FAILED_PRECONDITION
// "KV format mismatch: local <...> vs remote <...>".
[[nodiscard]] absl::Status CheckFingerprintsMatch(const estuary::v1::KvFormatFingerprint& local,
                                                  const estuary::v1::KvFormatFingerprint& remote);

}  // namespace estuary::kvtransfer
