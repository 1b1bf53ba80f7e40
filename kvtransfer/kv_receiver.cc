#include "kvtransfer/kv_receiver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "kvtransfer/fingerprint.h"

namespace estuary::kvtransfer {

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Create(
    Transport& transport, KvPool& pool, estuary::v1::KvFormatFingerprint fingerprint) {
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
  std::unique_ptr<KvReceiver> r(new KvReceiver(transport, pool, std::move(fingerprint)));
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
                       estuary::v1::KvFormatFingerprint fingerprint)
    : transport_(transport), pool_(pool), fingerprint_(std::move(fingerprint)) {}

KvReceiver::~KvReceiver() { Stop(); }

estuary::v1::TransferDescriptor KvReceiver::Describe(const std::string& request_id,
                                                     absl::Span<const int32_t> pages,
                                                     absl::Time lease_deadline) const {
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
  return d;
}

absl::Status KvReceiver::Start(
    std::function<void(const estuary::v1::KvCompletion&)> on_completion) {
  absl::MutexLock lock(&thread_mu_);
  if (started_) return absl::FailedPreconditionError("KvReceiver already started");
  started_ = true;
  thread_ = std::thread([this, cb = std::move(on_completion)]() mutable { Loop(std::move(cb)); });
  return absl::OkStatus();
}

void KvReceiver::Stop() {
  absl::MutexLock lock(&thread_mu_);
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void KvReceiver::Loop(std::function<void(const estuary::v1::KvCompletion&)> on_completion) {
  while (!stop_.load()) {
    absl::StatusOr<Message> m = transport_.PollMessage(absl::Now() + kPollSlice);
    if (!m.ok()) {
      if (!absl::IsDeadlineExceeded(m.status())) {
        ESTUARY_LOG(WARNING) << "KV receiver: polling failed: " << m.status();
        absl::SleepFor(kPollSlice);  // do not spin on a persistent error
      }
      continue;
    }
    absl::StatusOr<estuary::v1::KvCompletion> c = DecodeKvCompletion(m->payload);
    if (!c.ok()) {
      dropped_.fetch_add(1);
      ESTUARY_LOG(WARNING) << "KV receiver: dropped a message from peer " << m->sender_id << ": "
                           << c.status();
      continue;
    }
    completions_.fetch_add(1);
    if (on_completion) on_completion(*c);
  }
}

}  // namespace estuary::kvtransfer
