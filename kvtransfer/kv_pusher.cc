#include "kvtransfer/kv_pusher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/common/status_macros.h"
#include "kvtransfer/descriptor_check.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/fingerprint.h"
#include "kvtransfer/kv_control_codec.h"

namespace estuary::kvtransfer {
namespace {

static_assert(kDescriptorDigestBytes == kKvAttachDigestBytes);

constexpr size_t kMaxStatusMessage = 1024;

// Status messages go into a proto3 string (must be UTF-8): keep printable ASCII only.
std::string AsciiMessage(absl::string_view message) {
  std::string out;
  for (char c : message.substr(0, kMaxStatusMessage)) {
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// KvPusher

KvPusher::KvPusher(Transport& transport, EndpointCache& endpoints, AttachReplies& attach_replies,
                   const KvPool& local_pool, const estuary::v1::TransferDescriptor& descriptor,
                   int num_prompt_tokens, absl::Time deadline, absl::Time write_deadline)
    : transport_(transport),
      endpoints_(endpoints),
      attach_replies_(attach_replies),
      local_pool_(local_pool),
      descriptor_(descriptor),
      num_prompt_tokens_(num_prompt_tokens),
      write_deadline_(write_deadline),
      deadline_(std::min(deadline, write_deadline)) {}

KvPusher::~KvPusher() {
  absl::MutexLock lock(&attach_mu_);
  if (attach_sent_ && !attached_.has_value()) {
    attach_replies_.Forget(descriptor_.request_id(), descriptor_.reservation_epoch());
  }
}

absl::StatusOr<std::unique_ptr<KvPusher>> KvPusher::Create(
    Transport& transport, EndpointCache& endpoints, AttachReplies& attach_replies,
    const KvPool& local_pool, const estuary::v1::TransferDescriptor& descriptor,
    const DescriptorSeal& seal, const estuary::v1::KvFormatFingerprint& local_fingerprint,
    int num_prompt_tokens, absl::Time deadline) {
  // 1. The local pool is what the local fingerprint says.
  const KvLayout& local = local_pool.layout();
  const estuary::v1::KvLayoutSpec& whole = local_fingerprint.layout();
  const int total_heads = whole.n_kv_heads();
  const int src_tp = local_pool.num_shards();
  if (local.n_layers != whole.n_layers() || local.head_dim != whole.head_dim() ||
      local.block_size != whole.block_size() || local.n_kv_heads * src_tp != total_heads ||
      local_fingerprint.dtype() != "f32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "local KV pool (layers=", local.n_layers, " kv_heads=", local.n_kv_heads, "x", src_tp,
        " head_dim=", local.head_dim, " block=", local.block_size,
        ") does not match the local fingerprint <", FingerprintString(local_fingerprint), ">"));
  }

  // 2. The descriptor is the one a decode worker issued (descriptor_seal.h), then it fits
  // (descriptor_check.h: the fingerprints, the layout, the reservation's epoch and lease,
  // distinct page ids inside every region, addresses and rkeys of bounded size), then the write
  // deadline: the lease less the clocks' skew margin.
  ESTUARY_RETURN_IF_ERROR(seal.Verify(descriptor));
  ESTUARY_RETURN_IF_ERROR(CheckTransferDescriptor(descriptor, local_fingerprint, transport.kind(),
                                                  num_prompt_tokens));
  const std::string& id = descriptor.request_id();
  const absl::Time write_deadline =
      absl::FromUnixMillis(descriptor.lease_deadline_unix_ms()) - kLeaseSkewMargin;
  if (absl::Now() >= write_deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        "transfer descriptor for '", id, "': the reservation's lease ends at ",
        absl::FormatTime(absl::FromUnixMillis(descriptor.lease_deadline_unix_ms())),
        "; nothing may be written after ", absl::FormatDuration(kLeaseSkewMargin), " before it"));
  }
  const int dst_tp = descriptor.tp_size();
  ReshardShape shape{total_heads, local.head_dim, local.block_size, kKvDtypeBytes};
  const int64_t dst_page_bytes = PageLayerBytes(shape, dst_tp);

  // 3. Plan, connect, import.
  ESTUARY_ASSIGN_OR_RETURN(std::vector<RankPairPlan> plan, PlanReshard(shape, src_tp, dst_tp));
  std::unique_ptr<KvPusher> p(new KvPusher(transport, endpoints, attach_replies, local_pool,
                                           descriptor, num_prompt_tokens, deadline,
                                           write_deadline));
  p->src_tp_ = src_tp;
  p->dst_tp_ = dst_tp;
  p->block_size_ = local.block_size;
  p->head_dim_ = local.head_dim;
  p->src_heads_ = total_heads / src_tp;
  p->dst_heads_ = total_heads / dst_tp;
  p->src_page_bytes_ = PageLayerBytes(shape, src_tp);
  p->dst_page_bytes_ = dst_page_bytes;
  p->links_.resize(static_cast<size_t>(src_tp));
  for (RankPairPlan& pair : plan) {
    const estuary::v1::KvRankRegions& rank = descriptor.ranks(pair.dst_rank);
    const std::string& address =
        rank.worker_address().empty() ? descriptor.worker_address() : rank.worker_address();
    Link link;
    link.dst_rank = pair.dst_rank;
    link.head_lo = std::max(pair.src_rank * p->src_heads_, pair.dst_rank * p->dst_heads_);
    link.head_hi =
        std::min((pair.src_rank + 1) * p->src_heads_, (pair.dst_rank + 1) * p->dst_heads_);
    link.chunks = std::move(pair.chunks);
    ESTUARY_ASSIGN_OR_RETURN(link.endpoint, endpoints.Get(address, pair.src_rank, deadline));
    for (int l = 0; l < local.n_layers; ++l) {
      const estuary::v1::KvRemoteRegion& r = rank.layers(l);
      ESTUARY_ASSIGN_OR_RETURN(const RemoteRegion* remote,
                               link.endpoint->Import({r.base_address(), r.bytes(), r.rkey()}));
      link.layers.push_back(remote);
    }
    if (std::find(p->used_.begin(), p->used_.end(), link.endpoint) == p->used_.end()) {
      p->used_.push_back(link.endpoint);
    }
    p->links_[static_cast<size_t>(pair.src_rank)].push_back(std::move(link));
  }

  // 5. Attach: the decode worker's answer is awaited before the first put.
  p->attach_.set_request_id(id);
  p->attach_.set_reservation_epoch(descriptor.reservation_epoch());
  p->attach_.set_writer_address(transport.Address());
  p->attach_.set_descriptor_digest(DescriptorDigest(descriptor));
  attach_replies.Expect(id, descriptor.reservation_epoch());
  if (absl::Status sent = p->Send(EncodeKvAttach(p->attach_), p->deadline_, 1); !sent.ok()) {
    attach_replies.Forget(id, descriptor.reservation_epoch());
    return sent;
  }
  absl::MutexLock lock(&p->attach_mu_);
  p->attach_sent_ = true;
  return p;
}

absl::Status KvPusher::Attached() {
  absl::MutexLock lock(&attach_mu_);
  const std::string& id = descriptor_.request_id();
  const uint64_t epoch = descriptor_.reservation_epoch();
  // Waits in slices, so that a decode worker that dies meanwhile ends the wait at once, and sends
  // the attach again now and then: a message lost with a broken connection costs a resend
  // interval, not the whole deadline (the decode worker answers every copy).
  absl::Time resend = absl::Now() + kAttachResend;
  while (!attached_.has_value()) {
    const absl::Time slice = std::min(deadline_, absl::Now() + absl::Milliseconds(50));
    absl::Status answer = attach_replies_.Await(id, epoch, slice);
    if (absl::IsDeadlineExceeded(answer) && slice < deadline_) {
      for (const std::shared_ptr<CachedEndpoint>& ep : used_) {
        if (absl::Status health = ep->Health(); !health.ok()) answer = health;
      }
      if (absl::IsDeadlineExceeded(answer)) {
        if (absl::Now() >= resend) {
          resend = absl::Now() + kAttachResend;
          if (absl::Status sent = Send(EncodeKvAttach(attach_), deadline_, 2); !sent.ok()) {
            answer = sent;
          }
        }
        if (absl::IsDeadlineExceeded(answer)) continue;
      }
    }
    if (!answer.ok()) {
      attach_replies_.Forget(id, epoch);
      answer = absl::Status(answer.code(),
                            absl::StrCat("KV push of '", id, "': attach: ", answer.message()));
    }
    attached_ = std::move(answer);
  }
  return *attached_;
}

absl::Status KvPusher::FencedPut(CachedEndpoint& endpoint, const void* local, size_t bytes,
                                 const RemoteRegion& dst, uint64_t dst_offset) {
  if (absl::Now() >= write_deadline_) {
    return absl::DeadlineExceededError(absl::StrCat(
        "KV push of '", descriptor_.request_id(), "': the reservation's lease ends (writes stop ",
        absl::FormatDuration(kLeaseSkewMargin), " before it)"));
  }
  // The endpoint does not post past deadline_ <= write_deadline_ either; a stall between that
  // check and the post is caught below.
  ESTUARY_RETURN_IF_ERROR(endpoint.Put(local, bytes, dst, dst_offset, deadline_));
  if (absl::Now() >= write_deadline_) late_put_.store(true);
  puts_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return absl::OkStatus();
}

estuary::v1::KvCompletion KvPusher::NewCompletion() const {
  estuary::v1::KvCompletion c;
  c.set_request_id(descriptor_.request_id());
  c.set_reservation_epoch(descriptor_.reservation_epoch());
  c.set_late_put(late_put_.load());
  return c;
}

absl::Status KvPusher::Failed() const {
  absl::MutexLock lock(&mu_);
  if (completed_ || aborted_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV push of '", descriptor_.request_id(), "' already ", completed_ ? "completed" : "aborted"));
  }
  return failure_;
}

void KvPusher::RecordFailure(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = status;
}

absl::Status KvPusher::PushLayer(int src_rank, int layer, int first_pos, int end_pos,
                                 absl::Span<const int32_t> local_pages, int first_page_index) {
  if (src_rank < 0 || src_rank >= src_tp_ || layer < 0 ||
      layer >= local_pool_.layout().n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushLayer: src_rank ", src_rank, " / layer ", layer, " out of range"));
  }
  if (first_pos < 0 || end_pos <= first_pos || end_pos > num_prompt_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("PushLayer: positions [", first_pos, ", ",
                                                   end_pos, ") outside the prompt of ",
                                                   num_prompt_tokens_));
  }
  const int b = block_size_;
  const int first_page = first_pos / b;
  const int end_page = (end_pos + b - 1) / b;
  if (first_page_index != first_page ||
      local_pages.size() != static_cast<size_t>(end_page - first_page)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PushLayer: positions [", first_pos, ", ", end_pos, ") span pages [", first_page, ", ",
        end_page, ") but got ", local_pages.size(), " pages from index ", first_page_index));
  }
  ESTUARY_RETURN_IF_ERROR(Failed());
  if (absl::Status attached = Attached(); !attached.ok()) {
    RecordFailure(attached);
    return attached;
  }
  // Abort() waits for the puts posted under this lock, and none is posted after it.
  absl::ReaderMutexLock pushing(&push_mu_);
  ESTUARY_RETURN_IF_ERROR(Failed());
  for (int i = first_page; i < end_page; ++i) {
    const int32_t local_page = local_pages[static_cast<size_t>(i - first_page)];
    if (local_page < 0 || local_page >= local_pool_.num_pages()) {
      return absl::InvalidArgumentError(absl::StrCat("PushLayer: local page ", local_page,
                                                     " outside the pool"));
    }
    const int slot_begin = std::max(first_pos, i * b) - i * b;
    const int slot_end = std::min(end_pos, (i + 1) * b) - i * b;
    absl::Status s =
        PutPage(src_rank, layer, local_page, descriptor_.page_ids(i), slot_begin, slot_end);
    if (!s.ok()) {
      RecordFailure(s);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status KvPusher::PutPage(int src_rank, int layer, int32_t local_page, int32_t remote_page,
                               int slot_begin, int slot_end) {
  const char* src = static_cast<const char*>(local_pool_.layer_region(layer, src_rank).data) +
                    int64_t{local_page} * src_page_bytes_;
  const uint64_t dst_page = static_cast<uint64_t>(remote_page) * dst_page_bytes_;
  const bool full = slot_begin == 0 && slot_end == block_size_;
  const int64_t slot_bytes = int64_t{head_dim_} * kKvDtypeBytes;
  const int64_t head_bytes = slot_bytes * block_size_;
  for (const Link& link : links_[static_cast<size_t>(src_rank)]) {
    const RemoteRegion& dst = *link.layers[static_cast<size_t>(layer)];
    if (full) {
      // Whole page-layer: the plan's chunks (K and V of the overlapping heads).
      for (const CopyChunk& c : link.chunks) {
        ESTUARY_RETURN_IF_ERROR(FencedPut(*link.endpoint, src + c.src_offset,
                                          static_cast<size_t>(c.bytes), dst,
                                          dst_page + c.dst_offset));
      }
      continue;
    }
    // Partly covered page: only slots [slot_begin, slot_end) of each head's K and V, so that
    // another chunk's puts into the same page touch disjoint bytes.
    const int src_lo = src_rank * src_heads_;
    const int dst_lo = link.dst_rank * dst_heads_;
    const int64_t bytes = (slot_end - slot_begin) * slot_bytes;
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = link.head_lo; h < link.head_hi; ++h) {
        const int64_t src_off =
            (int64_t{kv} * src_heads_ + (h - src_lo)) * head_bytes + slot_begin * slot_bytes;
        const int64_t dst_off =
            (int64_t{kv} * dst_heads_ + (h - dst_lo)) * head_bytes + slot_begin * slot_bytes;
        ESTUARY_RETURN_IF_ERROR(FencedPut(*link.endpoint, src + src_off,
                                          static_cast<size_t>(bytes), dst, dst_page + dst_off));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvPusher::Send(const std::string& payload, absl::Time deadline, int attempts) {
  absl::Status last;
  for (int i = 0; i < attempts; ++i) {
    absl::StatusOr<std::shared_ptr<CachedEndpoint>> ep =
        endpoints_.Get(descriptor_.worker_address(), 0, deadline);
    if (!ep.ok()) return ep.status();
    last = (*ep)->SendMessage(payload, deadline);
    if (last.ok() || !absl::IsUnavailable(last)) return last;
  }
  return last;
}

absl::Status KvPusher::Complete(int32_t first_token, absl::Span<const uint8_t> provenance,
                                int num_tokens,
                                const estuary::v1::TokenLogprobs* first_token_logprobs) {
  if (num_tokens != num_prompt_tokens_ || provenance.size() != static_cast<size_t>(num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Complete: ", num_tokens, " tokens with ", provenance.size(),
        " provenance bytes for a prompt of ", num_prompt_tokens_));
  }
  ESTUARY_RETURN_IF_ERROR(Failed());
  absl::Status status = Attached();
  for (const std::shared_ptr<CachedEndpoint>& ep : used_) {
    if (status.ok()) status = ep->Flush(deadline_);
  }
  if (status.ok() && absl::Now() >= write_deadline_) {
    status = absl::DeadlineExceededError(absl::StrCat(
        "KV push of '", descriptor_.request_id(), "': the reservation's lease ended before the "
        "KV was complete"));
  }
  if (status.ok()) {
    estuary::v1::KvCompletion c = NewCompletion();
    c.set_num_tokens(num_tokens);
    c.set_first_token(first_token);
    c.set_provenance(std::string(provenance.begin(), provenance.end()));
    c.set_status_code(0);
    if (first_token_logprobs != nullptr) *c.mutable_first_token_logprobs() = *first_token_logprobs;
    status = Send(EncodeKvCompletion(c), deadline_, 1);
  }
  if (!status.ok()) {
    RecordFailure(status);
    return status;
  }
  absl::MutexLock lock(&mu_);
  completed_ = true;
  return absl::OkStatus();
}

absl::Status KvPusher::Abort(const absl::Status& reason) {
  {
    absl::WriterMutexLock no_more_puts(&push_mu_);
    absl::MutexLock lock(&mu_);
    if (completed_) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV push of '", descriptor_.request_id(), "' already completed"));
    }
    if (aborted_) return absl::OkStatus();
    aborted_ = true;
  }
  const absl::Time deadline = std::max(deadline_, absl::Now() + kAbortGrace);
  // Let posted puts land before the decode worker frees (and reuses) the pages: the completion
  // below says that nothing more will land, so it is not sent while puts may be in flight.
  for (const std::shared_ptr<CachedEndpoint>& ep : used_) {
    if (!ep->Health().ok()) continue;  // a failed endpoint delivers nothing more
    if (absl::Status flushed = ep->Flush(deadline); !flushed.ok() && ep->Health().ok()) {
      return absl::Status(flushed.code(),
                          absl::StrCat("KV push of '", descriptor_.request_id(),
                                       "': abort not sent, a flush failed: ", flushed.message()));
    }
  }
  estuary::v1::KvCompletion c = NewCompletion();
  c.set_status_code(static_cast<int>(reason.ok() ? absl::StatusCode::kAborted : reason.code()));
  c.set_status_message(AsciiMessage(reason.ok() ? "aborted" : reason.message()));
  return Send(EncodeKvCompletion(c), deadline, 2);
}

}  // namespace estuary::kvtransfer
