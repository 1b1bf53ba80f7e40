// libFuzzer target for the KV push protocol's control messages, decoded as the workers decode
// them before anything acts on them (kvtransfer/kv_control_codec.h). The first byte picks the
// message:
//   0: a KV completion message as it arrives from a peer (DecodeKvCompletion, the decode
//      worker's KvReceiver entry point): the rest of the input;
//   1: the same, with the input as the serialized KvCompletion, framed as the wire format says
//      ("EKC1" + bytes + FNV-1a-64), so that mutations reach the field checks past the checksum;
//   2: a TransferDescriptor (the decode worker's Reserve answer) checked as a prefill worker of
//      a stories260K-shaped model checks it (kvtransfer/descriptor_check.h,
//      CheckTransferDescriptor, from KvPusher::Create): the second byte gives the prompt length,
//      the third the prefill TP size, the rest is the serialized descriptor;
//   3, 4: a KvAttach (a writer asking for a reservation; the decode worker's receiver), as
//      received / its serialized body framed with "EKA1";
//   5, 6: a KvAttachReply (the decode worker's answer; the prefill worker's AttachReplies), as
//      received / framed with "EKR1".
// What decodes must hold what the decoders promise (a completion: an id, a token count >= 0, a
// status code in range, a nonzero epoch, one provenance byte per token when OK; an attach and a
// reply: bounded ids and addresses, a nonzero epoch, an attach's descriptor digest of
// kKvAttachDigestBytes; each re-encodes to a message that decodes the same; a descriptor: every
// described page lies inside every rank's layer region, and the re-sharding plan exists). Seeds: fuzz/corpus/kv_control/ (fuzz/make_seeds.py).
// Run (see fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/kv_control_fuzzer -max_total_time=60 fuzz/corpus/kv_control

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "kvtransfer/descriptor_check.h"
#include "kvtransfer/fingerprint.h"
#include "kvtransfer/kv_control_codec.h"
#include "kvtransfer/reshard.h"
#include "kvtransfer/transport.h"

namespace {

namespace kv = ::estuary::kvtransfer;

void CheckCompletion(std::string_view payload) {
  auto c = kv::DecodeKvCompletion(payload);
  if (!c.ok()) return;
  if (c->request_id().empty() || c->request_id().size() > kv::kMaxKvRequestIdBytes ||
      c->num_tokens() < 0 || c->num_tokens() > kv::kMaxKvPromptTokens || c->status_code() < 0 ||
      c->status_code() > static_cast<int>(absl::StatusCode::kUnauthenticated) ||
      c->reservation_epoch() == 0) {
    __builtin_trap();
  }
  if (c->status_code() == 0 && c->provenance().size() != static_cast<size_t>(c->num_tokens())) {
    __builtin_trap();
  }
  auto again = kv::DecodeKvCompletion(kv::EncodeKvCompletion(*c));
  if (!again.ok() || again->SerializeAsString() != c->SerializeAsString()) __builtin_trap();
}

void CheckAttach(std::string_view payload) {
  auto a = kv::DecodeKvAttach(payload);
  if (!a.ok()) return;
  if (a->request_id().empty() || a->request_id().size() > kv::kMaxKvRequestIdBytes ||
      a->reservation_epoch() == 0 || a->writer_address().empty() ||
      a->writer_address().size() > kv::kMaxKvWriterAddressBytes ||
      a->descriptor_digest().size() != kv::kKvAttachDigestBytes) {
    __builtin_trap();
  }
  auto again = kv::DecodeKvAttach(kv::EncodeKvAttach(*a));
  if (!again.ok() || again->SerializeAsString() != a->SerializeAsString()) __builtin_trap();
}

void CheckAttachReply(std::string_view payload) {
  auto r = kv::DecodeKvAttachReply(payload);
  if (!r.ok()) return;
  if (r->request_id().empty() || r->request_id().size() > kv::kMaxKvRequestIdBytes ||
      r->reservation_epoch() == 0 || r->status_code() < 0 ||
      r->status_code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    __builtin_trap();
  }
  auto again = kv::DecodeKvAttachReply(kv::EncodeKvAttachReply(*r));
  if (!again.ok() || again->SerializeAsString() != r->SerializeAsString()) __builtin_trap();
}

// `magic` + body + FNV-1a-64 of the body: the control messages' framing.
std::string Framed(std::string_view body, const char* magic = "EKC1") {
  std::string out(magic);
  out.append(body);
  const uint64_t sum = kv::Transport::PeerId(body);  // FNV-1a 64
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(sum >> (8 * i)));
  return out;
}

void CheckDescriptor(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const int num_prompt_tokens = data[0];  // 0 included: refused
  const int src_tp = 1 << (data[1] % 3);  // 1, 2 or 4 of the model's 4 KV heads
  estuary::v1::TransferDescriptor descriptor;
  if (!descriptor.ParseFromArray(data + 2, static_cast<int>(size - 2))) return;
  // stories260K's KV format: 5 layers, 4 KV heads of 8, pages of 16 slots.
  static const estuary::v1::KvFormatFingerprint* const local =
      new estuary::v1::KvFormatFingerprint(kv::MakeFingerprint("stories260K", 5, 4, 8, 16));
  if (!kv::CheckTransferDescriptor(descriptor, *local, "ucx", num_prompt_tokens).ok()) return;
  const kv::ReshardShape shape{4, 8, 16, kv::kKvDtypeBytes};
  const int dst_tp = descriptor.tp_size();
  if (!kv::PlanReshard(shape, src_tp, dst_tp).ok()) __builtin_trap();
  // What the pusher relies on: every put it may post stays inside the described region.
  const uint64_t page_bytes = static_cast<uint64_t>(kv::PageLayerBytes(shape, dst_tp));
  if (descriptor.ranks_size() != dst_tp) __builtin_trap();
  for (const estuary::v1::KvRankRegions& rank : descriptor.ranks()) {
    if (rank.layers_size() != 5) __builtin_trap();
    for (const estuary::v1::KvRemoteRegion& region : rank.layers()) {
      for (const int32_t page : descriptor.page_ids()) {
        if (page < 0 || (static_cast<uint64_t>(page) + 1) * page_bytes > region.bytes()) {
          __builtin_trap();
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 7) {
    case 0:
      CheckCompletion(rest);
      break;
    case 1:
      CheckCompletion(Framed(rest));
      break;
    case 2:
      CheckDescriptor(data + 1, size - 1);
      break;
    case 3:
      CheckAttach(rest);
      break;
    case 4:
      CheckAttach(Framed(rest, "EKA1"));
      break;
    case 5:
      CheckAttachReply(rest);
      break;
    case 6:
      CheckAttachReply(Framed(rest, "EKR1"));
      break;
  }
  return 0;
}
