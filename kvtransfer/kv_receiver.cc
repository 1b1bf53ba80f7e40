#include "kvtransfer/kv_receiver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "kvtransfer/fingerprint.h"

namespace estuary::kvtransfer {

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Create(
    Transport& transport, KvPool& pool, estuary::v1::KvFormatFingerprint fingerprint,
    DescriptorSeal seal) {
  const KvLayout& layout = pool.layout();
  const estuary::v1::KvLayoutSpec& f = fingerprint.layout();
  if (f.n_layers() != layout.n_layers || f.head_dim() != layout.head_dim ||
      f.block_size() != layout.block_size ||
      f.n_kv_heads() != layout.n_kv_heads * pool.num_shards() || fingerprint.dtype() != "f32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV fingerprint <", FingerprintString(fingerprint), "> does not describe the pool (layers=",
        layout.n_layers, " kv_heads=", layout.n_kv_heads, "x", pool.num_shards(),
        " shards head_dim=", layout.head_dim, " block=", layout.block_size, " dtype=f32)"));
  }
  std::unique_ptr<KvReceiver> r(
      new KvReceiver(transport, pool, std::move(fingerprint), std::move(seal)));
  r->regions_.resize(static_cast<size_t>(pool.num_shards()));
  for (int shard = 0; shard < pool.num_shards(); ++shard) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      const KvRegion region = pool.layer_region(layer, shard);
      ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<RegisteredRegion> handle,
                               transport.RegisterRegion(region.data, region.bytes));
      r->regions_[static_cast<size_t>(shard)].push_back(std::move(handle));
    }
  }
  return r;
}

KvReceiver::KvReceiver(Transport& transport, KvPool& pool,
                       estuary::v1::KvFormatFingerprint fingerprint, DescriptorSeal seal)
    : transport_(transport),
      pool_(pool),
      fingerprint_(std::move(fingerprint)),
      seal_(std::move(seal)),
      writers_(transport) {}

KvReceiver::~KvReceiver() { Stop(); }

estuary::v1::TransferDescriptor KvReceiver::Describe(const std::string& request_id,
                                                     absl::Span<const int32_t> pages,
                                                     absl::Time lease_deadline,
                                                     uint64_t epoch) const {
  estuary::v1::TransferDescriptor d = Unsealed(request_id, pages, lease_deadline, epoch);
  seal_.Seal(&d);
  return d;
}

estuary::v1::TransferDescriptor KvReceiver::Unsealed(const std::string& request_id,
                                                     absl::Span<const int32_t> pages,
                                                     absl::Time lease_deadline,
                                                     uint64_t epoch) const {
  const KvLayout& layout = pool_.layout();
  estuary::v1::TransferDescriptor d;
  d.set_transport(std::string(transport_.kind()));
  d.set_worker_address(transport_.Address());
  d.set_request_id(request_id);
  for (int32_t page : pages) d.add_page_ids(page);
  estuary::v1::KvLayoutSpec* spec = d.mutable_layout();
  spec->set_n_layers(layout.n_layers);
  spec->set_n_kv_heads(layout.n_kv_heads);
  spec->set_head_dim(layout.head_dim);
  spec->set_block_size(layout.block_size);
  spec->set_dtype(fingerprint_.dtype());
  d.set_tp_size(pool_.num_shards());
  for (int shard = 0; shard < pool_.num_shards(); ++shard) {
    estuary::v1::KvRankRegions* rank = d.add_ranks();
    rank->set_tp_rank(shard);
    for (const std::unique_ptr<RegisteredRegion>& region :
         regions_[static_cast<size_t>(shard)]) {
      const RegionDescriptor rd = region->Describe();
      estuary::v1::KvRemoteRegion* out = rank->add_layers();
      out->set_base_address(rd.base);
      out->set_bytes(rd.bytes);
      out->set_rkey(rd.rkey);
    }
  }
  *d.mutable_fingerprint() = fingerprint_;
  d.set_lease_deadline_unix_ms(absl::ToUnixMillis(lease_deadline));
  d.set_reservation_epoch(epoch);
  return d;
}

absl::Status KvReceiver::Start(KvReceiverCallbacks callbacks) {
  absl::MutexLock lock(&thread_mu_);
  if (started_) return absl::FailedPreconditionError("KvReceiver already started");
  started_ = true;
  thread_ = std::thread([this, cb = std::move(callbacks)] { Loop(cb); });
  return absl::OkStatus();
}

void KvReceiver::Stop() {
  absl::MutexLock lock(&thread_mu_);
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void KvReceiver::Loop(const KvReceiverCallbacks& callbacks) {
  while (!stop_.load()) {
    absl::StatusOr<Message> m = transport_.PollMessage(absl::Now() + kPollSlice);
    if (!m.ok()) {
      if (!absl::IsDeadlineExceeded(m.status())) {
        ESTUARY_LOG(WARNING) << "KV receiver: polling failed: " << m.status();
        absl::SleepFor(kPollSlice);  // do not spin on a persistent error
      }
      continue;
    }
    absl::Status dropped;
    switch (PeekKvControlKind(m->payload)) {
      case KvControlKind::kCompletion: {
        absl::StatusOr<estuary::v1::KvCompletion> c = DecodeKvCompletion(m->payload);
        if (!c.ok()) {
          dropped = c.status();
          break;
        }
        completions_.fetch_add(1);
        if (callbacks.on_completion) callbacks.on_completion(*c, m->sender_id);
        break;
      }
      case KvControlKind::kAttach: {
        absl::StatusOr<estuary::v1::KvAttach> a = DecodeKvAttach(m->payload);
        if (!a.ok()) {
          dropped = a.status();
        } else if (Transport::PeerId(a->writer_address()) != m->sender_id) {
          dropped = absl::InvalidArgumentError(absl::StrCat(
              "KV attach for ", a->request_id(), " names another transport's address"));
        } else {
          HandleAttach(*a, m->sender_id, callbacks);
        }
        break;
      }
      default:
        dropped = absl::InvalidArgumentError(
            absl::StrCat("not a KV control message for the decode side (", m->payload.size(),
                         " bytes)"));
    }
    if (!dropped.ok()) {
      dropped_.fetch_add(1);
      ESTUARY_LOG(WARNING) << "KV receiver: dropped a message from peer " << m->sender_id << ": "
                           << dropped;
    }
  }
}

absl::Status KvReceiver::CheckIssued(const estuary::v1::KvAttach& attach,
                                     const KvReceiverCallbacks& callbacks) const {
  if (!callbacks.issued) {
    return absl::UnimplementedError("this receiver cannot tell which descriptors it issued");
  }
  ESTUARY_ASSIGN_OR_RETURN(const IssuedReservation issued,
                           callbacks.issued(attach.request_id(), attach.reservation_epoch()));
  const std::string digest = DescriptorDigest(
      Unsealed(attach.request_id(), issued.pages, issued.lease_deadline,
               attach.reservation_epoch()));
  if (digest.empty() || attach.descriptor_digest() != digest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the attach for reservation '", attach.request_id(), "' (epoch ",
        absl::Hex(attach.reservation_epoch()),
        ") holds a transfer descriptor this decode worker did not issue (its pages, lease, "
        "regions or addresses differ): no put may follow"));
  }
  return absl::OkStatus();
}

void KvReceiver::HandleAttach(const estuary::v1::KvAttach& attach, uint64_t sender,
                              const KvReceiverCallbacks& callbacks) {
  attaches_.fetch_add(1);
  absl::Status verdict = CheckIssued(attach, callbacks);
  if (verdict.ok()) {
    verdict = callbacks.on_attach ? callbacks.on_attach(attach, sender)
                                  : absl::UnimplementedError("this receiver takes no writers");
  }
  estuary::v1::KvAttachReply reply;
  reply.set_request_id(attach.request_id());
  reply.set_reservation_epoch(attach.reservation_epoch());
  reply.set_status_code(static_cast<int>(verdict.code()));
  reply.set_status_message(std::string(verdict.message().substr(0, kMaxKvStatusMessageBytes)));
  const absl::Time deadline = absl::Now() + kReplyTimeout;
  absl::StatusOr<std::shared_ptr<CachedEndpoint>> back =
      writers_.Get(attach.writer_address(), /*src_rank=*/0, deadline);
  absl::Status sent =
      back.ok() ? (*back)->SendMessage(EncodeKvAttachReply(reply), deadline) : back.status();
  if (!sent.ok()) {
    // The writer hears nothing: it stops at its deadline and aborts; an attached reservation
    // keeps its pages until then (its completion) or lease + grace.
    ESTUARY_LOG(WARNING) << "KV receiver: could not answer the attach of "
                         << attach.request_id() << ": " << sent;
  }
}

}  // namespace estuary::kvtransfer
