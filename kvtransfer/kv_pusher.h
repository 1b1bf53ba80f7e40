#pragma once
// KvPusher: the prefill worker's end of the KV push protocol (design §7; README "Push protocol").
//
// One KvPusher per request. Create() checks the decode worker's TransferDescriptor against the
// local pool and fingerprint, connects (through an EndpointCache shared by all requests),
// imports the remote layer regions and plans the head re-sharding between the prefill TP size
// (local_pool.num_shards()) and the decode TP size (descriptor.tp_size()). The prefill engine's
// LayerReady handler then calls PushLayer() for every (rank, layer, chunk): it only posts
// one-sided puts. When the prompt is done, Complete() flushes every endpoint and sends one
// KvCompletion; on failure Abort() tells the decode worker to free the reservation.
//
// Puts never overlap with different content: a page fully covered by a PushLayer call goes as
// whole page-layers (the reshard plan's chunks, 1-2 puts per src/dst rank pair); a page only
// partly covered (a chunk that starts or ends mid-page) goes as per-head slot ranges (for each
// head, K slots [a, b) and V slots [a, b)), so two chunks sharing a page write disjoint bytes and
// the transport needs no ordering between them.
//
// Trust (README "Sealed descriptors"): Create() uses nothing of a descriptor whose seal does not
// verify, and bounds what it hands the transport (descriptor_check.h).
//
// Fencing (README "Fencing"): Create() attaches the writer to the reservation (a KvAttach; the
// decode worker's answer comes through AttachReplies) and no put is posted before the decode
// worker said yes. The writer stops at the reservation's lease less kLeaseSkewMargin (its "write
// deadline"): no put is posted from then on, each put is checked against it just before it is
// handed to the transport (which itself never posts past the deadline it is given), and a put
// found to have gone out after it is reported in the completion (late_put).
//
// Errors: every wait is bounded by the deadline given to Create, and puts, flushes and the OK
// completion also by the write deadline (Abort: the deadline, but at least kAbortGrace from the
// call). A dead or failed peer gives UNAVAILABLE for this request only; the EndpointCache
// reconnects for the next request. After the first failed put the pusher keeps failing with that
// status; the caller should then Abort().
//
// Lifetime: the Transport, EndpointCache, AttachReplies and local KvPool must outlive the pusher,
// and the local pages handed to PushLayer must stay allocated (not released, not rewritten) until
// Complete() or Abort() has returned: puts read them asynchronously until the flush.
//
// Threading: PushLayer may be called concurrently for different src ranks (each src rank pushes
// on its own endpoints) and must be called by one thread at a time per src rank. Complete() may
// be called from any thread once every PushLayer has returned; Abort() from any thread at any
// time: it waits for the PushLayer calls that are posting puts, and later ones post nothing, so
// its completion is the writer's word that nothing more will land.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/kvcache/kv_pool.h"
#include "estuary/v1/kv_transfer.pb.h"
#include "kvtransfer/attach_replies.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/endpoint_cache.h"
#include "kvtransfer/reshard.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

class KvPusher {
 public:
  static constexpr absl::Duration kAbortGrace = absl::Seconds(1);
  // The writer stops this long before the reservation's lease: the most the prefill host's clock
  // may run behind the decode host's for the stop to come before the decode worker's lease.
  static constexpr absl::Duration kLeaseSkewMargin = absl::Milliseconds(250);
  // How long the writer waits for the attach answer before it sends the attach again.
  static constexpr absl::Duration kAttachResend = absl::Milliseconds(500);

  // Checks the local pool against the local fingerprint (INVALID_ARGUMENT), then the descriptor's
  // seal with `seal` (descriptor_seal.h: UNAUTHENTICATED when it is missing or does not match;
  // nothing of the descriptor is used before), then the descriptor
  // with CheckTransferDescriptor (descriptor_check.h: the fingerprints, FAILED_PRECONDITION naming
  // both; transport kind, per-rank layout == whole-model heads / tp_size, layers, head_dim, block
  // size, dtype, one region per layer per rank, enough distinct page ids for
  // `num_prompt_tokens`, page ids inside the regions, a reservation epoch, a lease:
  // INVALID_ARGUMENT naming the field); DEADLINE_EXCEEDED when the write deadline has passed.
  // Then connects (UNAVAILABLE / DEADLINE_EXCEEDED), imports the remote regions, plans the
  // re-sharding and sends the attach, with the descriptor's digest (its answer is awaited by the
  // first PushLayer or Complete; the decode worker refuses it unless the descriptor is the one it
  // issued). `deadline` bounds every later wait.
  static absl::StatusOr<std::unique_ptr<KvPusher>> Create(
      Transport& transport, EndpointCache& endpoints, AttachReplies& attach_replies,
      const KvPool& local_pool, const estuary::v1::TransferDescriptor& descriptor,
      const DescriptorSeal& seal, const estuary::v1::KvFormatFingerprint& local_fingerprint,
      int num_prompt_tokens, absl::Time deadline);
  ~KvPusher();
  KvPusher(const KvPusher&) = delete;
  KvPusher& operator=(const KvPusher&) = delete;

  // Posts the puts for positions [first_pos, end_pos) of `layer` held by local shard `src_rank`.
  // `local_pages` are the local page ids covering those positions: the sequence's page table
  // entries [first_page_index, first_page_index + size) with first_page_index ==
  // first_pos / block_size (a LayerReady event's fields). Does not wait for the data to land.
  // INVALID_ARGUMENT for arguments that do not fit; the put's error (UNAVAILABLE for a dead peer);
  // FAILED_PRECONDITION after Complete/Abort; the decode worker's refusal of the attach;
  // DEADLINE_EXCEEDED once the write deadline passed (nothing more is posted).
  [[nodiscard]] absl::Status PushLayer(int src_rank, int layer, int first_pos, int end_pos,
                                       absl::Span<const int32_t> local_pages,
                                       int first_page_index);

  // Flushes every endpoint this request used, then sends the KvCompletion (status OK) to the
  // decode worker (DEADLINE_EXCEEDED instead when the write deadline passed). `provenance` has num_tokens bytes; num_tokens must be num_prompt_tokens.
  // `first_token_logprobs` (may be null) travels with the first token.
  // Returns the first error (the request is then failed; call Abort()).
  [[nodiscard]] absl::Status Complete(
      int32_t first_token, absl::Span<const uint8_t> provenance, int num_tokens,
      const estuary::v1::TokenLogprobs* first_token_logprobs = nullptr);

  // Best effort: flushes the healthy endpoints (so no put lands after the decode worker freed the
  // pages) and sends a KvCompletion carrying `reason`'s code (an OK reason becomes ABORTED),
  // reconnecting once when the cached endpoint failed. The completion is the writer's word that
  // it posts nothing more, so it is not sent when a healthy endpoint did not flush in time (puts
  // may still be in flight). An error means the decode worker was not told; its lease (plus its
  // grace) frees the pages. FAILED_PRECONDITION after a successful Complete.
  absl::Status Abort(const absl::Status& reason);

  const std::string& request_id() const { return descriptor_.request_id(); }
  // The reservation's lease less kLeaseSkewMargin: no put is posted from then on.
  absl::Time write_deadline() const { return write_deadline_; }
  // A put may have been posted after the write deadline (reported in the completion).
  bool late_put() const { return late_put_.load(); }
  int src_tp() const { return src_tp_; }
  int dst_tp() const { return dst_tp_; }
  // Puts posted so far (all ranks).
  int64_t puts() const { return puts_.load(); }
  // Bytes those puts carried.
  int64_t bytes() const { return bytes_.load(); }

 private:
  // One (src rank, dst rank) pair of the plan with its endpoint and the remote layer regions.
  struct Link {
    int dst_rank = 0;
    int head_lo = 0, head_hi = 0;  // whole-model KV heads both ranks hold
    std::vector<CopyChunk> chunks;
    std::shared_ptr<CachedEndpoint> endpoint;
    std::vector<const RemoteRegion*> layers;  // [layer]
  };

  KvPusher(Transport& transport, EndpointCache& endpoints, AttachReplies& attach_replies,
           const KvPool& local_pool, const estuary::v1::TransferDescriptor& descriptor,
           int num_prompt_tokens, absl::Time deadline, absl::Time write_deadline);
  // The decode worker's answer to the attach (waits for it the first time).
  absl::Status Attached();
  // One put, fenced by the write deadline (see the header comment).
  absl::Status FencedPut(CachedEndpoint& endpoint, const void* local, size_t bytes,
                         const RemoteRegion& dst, uint64_t dst_offset);
  // The completion every message of this pusher starts from (request id, epoch, late_put).
  estuary::v1::KvCompletion NewCompletion() const;
  absl::Status PutPage(int src_rank, int layer, int32_t local_page, int32_t remote_page,
                       int slot_begin, int slot_end);
  absl::Status Failed() const;
  void RecordFailure(const absl::Status& status);
  // Sends an encoded control message (attach, completion) on src rank 0's endpoint to the decode
  // worker's main address, trying up to `attempts` endpoints (the cache reconnects when the
  // previous one failed).
  absl::Status Send(const std::string& payload, absl::Time deadline, int attempts);

  Transport& transport_;
  EndpointCache& endpoints_;
  AttachReplies& attach_replies_;
  const KvPool& local_pool_;
  const estuary::v1::TransferDescriptor descriptor_;
  const int num_prompt_tokens_;
  const absl::Time write_deadline_;
  const absl::Time deadline_;  // min(Create's deadline, write_deadline_)
  int src_tp_ = 0, dst_tp_ = 0;
  int block_size_ = 0, head_dim_ = 0;
  int src_heads_ = 0, dst_heads_ = 0;  // per rank
  int64_t src_page_bytes_ = 0, dst_page_bytes_ = 0;  // one layer of one page, per rank
  std::vector<std::vector<Link>> links_;  // [src rank]; immutable after Create
  std::vector<std::shared_ptr<CachedEndpoint>> used_;  // distinct endpoints; immutable

  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool completed_ ABSL_GUARDED_BY(mu_) = false;  // Complete succeeded
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;    // Abort ran
  std::atomic<int64_t> puts_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<bool> late_put_{false};

  // PushLayer holds it shared while it posts puts; Abort takes it exclusively to mark the pusher
  // aborted, so that no put is posted after the abort's flush.
  absl::Mutex push_mu_;
  absl::Mutex attach_mu_;  // held while waiting for the answer (one waiter; the others queue)
  estuary::v1::KvAttach attach_;  // immutable after Create
  bool attach_sent_ ABSL_GUARDED_BY(attach_mu_) = false;
  std::optional<absl::Status> attached_ ABSL_GUARDED_BY(attach_mu_);  // the answer, once known
};

}  // namespace estuary::kvtransfer
