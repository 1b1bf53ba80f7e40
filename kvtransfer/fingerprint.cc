#include "kvtransfer/fingerprint.h"

#include "absl/strings/str_cat.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

estuary::v1::KvFormatFingerprint MakeFingerprint(const std::string& model_id, int n_layers,
                                                 int n_kv_heads_total, int head_dim,
                                                 int block_size, const std::string& dtype) {
  estuary::v1::KvFormatFingerprint f;
  f.set_model_id(model_id);
  f.set_dtype(dtype);
  estuary::v1::KvLayoutSpec* layout = f.mutable_layout();
  layout->set_n_layers(n_layers);
  layout->set_n_kv_heads(n_kv_heads_total);
  layout->set_head_dim(head_dim);
  layout->set_block_size(block_size);
  layout->set_dtype(dtype);
  return f;
}

std::string FingerprintString(const estuary::v1::KvFormatFingerprint& f) {
  const estuary::v1::KvLayoutSpec& l = f.layout();
  std::string s = absl::StrCat("model=", f.model_id(), " dtype=", f.dtype(),
                               " layers=", l.n_layers(), " kv_heads=", l.n_kv_heads(),
                               " head_dim=", l.head_dim(), " block=", l.block_size());
  if (!l.dtype().empty() && l.dtype() != f.dtype()) absl::StrAppend(&s, " layout_dtype=", l.dtype());
  return s;
}

uint64_t FingerprintHash(const estuary::v1::KvFormatFingerprint& f) {
  return Transport::PeerId(FingerprintString(f));
}

absl::Status CheckFingerprintsMatch(const estuary::v1::KvFormatFingerprint& local,
                                    const estuary::v1::KvFormatFingerprint& remote) {
  const std::string a = FingerprintString(local);
  const std::string b = FingerprintString(remote);
  if (a == b) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("KV format mismatch: local <", a, "> vs remote <", b, ">"));
}

}  // namespace estuary::kvtransfer
