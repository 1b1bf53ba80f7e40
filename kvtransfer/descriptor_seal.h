#pragma once
// Sealed transfer descriptors (issue 14, reliability C10; kvtransfer/README.md "Sealed
// descriptors"). A TransferDescriptor names remote memory: a UCX worker address, packed rkeys,
// base addresses, page ids. The prefill worker hands them to its transport, and UCX trusts them:
// a corrupted worker address aborts the prefill process inside ucp_address_unpack, and a put to a
// corrupted base address lands wherever it points in the decode process (UCX 1.13's software
// transports check no put against the registration). So the prefill worker must only ever use a
// descriptor exactly as a decode worker issued it:
//   - the decode worker seals what it issues (KvReceiver::Describe): TransferDescriptor.seal =
//     HMAC-SHA256(key, CanonicalDescriptorBytes(descriptor));
//   - the prefill worker verifies the seal, in constant time, before any other check and before
//     any field reaches the transport (KvPusher::Create): a missing or wrong seal is
//     UNAUTHENTICATED naming it;
//   - independently of any key, the writer's KvAttach carries DescriptorDigest() of the
//     descriptor it holds, and the decode worker refuses the attach unless it is the digest of
//     the descriptor it issued for that reservation (KvReceiver): no put follows a refused attach.
// The key is secret bytes every worker of a cluster holds: the workers derive it from the
// cluster token with kDescriptorKeyLabel (rpc::ClusterSubkey; never the token itself). kvtransfer
// takes the key bytes only; where they come from is the worker processes' business.
//
// Without a key (a cluster without a token) descriptors are neither sealed nor checked: the
// workers log a warning at start. The attach digest still keeps an altered descriptor from
// reaching the decode worker's memory, but the prefill worker then gives UCX whatever worker
// address and rkeys it is sent (bounded in size only: descriptor_check.h).
//
// Canonical bytes: a version tag, then every field of the descriptor except `seal`, found by
// reflection in field-number order, recursively: each field as its number, then its value;
// integers as 8 bytes little-endian (signed ones sign-extended), strings and bytes as an 8-byte
// length and the bytes, a message field as a presence byte and its fields, a repeated field as a
// count and its elements. So a field added to the proto is covered without a change here, and
// unknown fields (which nothing reads) are not covered.
//
// Thread-safety: a DescriptorSeal is immutable; use it from any thread.

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "estuary/v1/kv_transfer.pb.h"

namespace estuary::kvtransfer {

// What the workers derive the seal key from the cluster token with (HMAC-SHA256(token, label)).
inline constexpr char kDescriptorKeyLabel[] = "estuary kv descriptor v1";
inline constexpr size_t kDescriptorSealBytes = 32;    // HMAC-SHA256
inline constexpr size_t kDescriptorDigestBytes = 32;  // SHA-256

// Every field a prefill worker uses, in a fixed unambiguous encoding (above).
std::string CanonicalDescriptorBytes(const estuary::v1::TransferDescriptor& descriptor);
// SHA-256 of the canonical bytes: what a KvAttach carries.
std::string DescriptorDigest(const estuary::v1::TransferDescriptor& descriptor);

class DescriptorSeal {
 public:
  // `key`: secret bytes shared by the cluster's workers (32 from rpc::ClusterSubkey); empty: no
  // sealing and no checks.
  explicit DescriptorSeal(std::string key) : key_(std::move(key)) {}
  static DescriptorSeal None() { return DescriptorSeal(""); }

  bool enabled() const { return !key_.empty(); }
  // Sets descriptor->seal over the other fields (clears it without a key).
  void Seal(estuary::v1::TransferDescriptor* descriptor) const;
  // OK without a key. Otherwise UNAUTHENTICATED when the seal is missing or is not the HMAC of
  // the descriptor's fields under this key (compared in constant time), naming which.
  absl::Status Verify(const estuary::v1::TransferDescriptor& descriptor) const;

 private:
  std::string SealOf(const estuary::v1::TransferDescriptor& descriptor) const;

  std::string key_;
};

}  // namespace estuary::kvtransfer
