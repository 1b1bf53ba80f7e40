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
// Errors: every wait is bounded by the deadline given to Create (Abort: that deadline, but at
// least kAbortGrace from the call). A dead or failed peer gives UNAVAILABLE for this request
// only; the EndpointCache reconnects for the next request. After the first failed put the pusher
// keeps failing with that status; the caller should then Abort().
//
// Lifetime: the Transport, EndpointCache and local KvPool must outlive the pusher, and the local
// pages handed to PushLayer must stay allocated (not released, not rewritten) until Complete() or
// Abort() has returned: puts read them asynchronously until the flush.
//
// Threading: PushLayer may be called concurrently for different src ranks (each src rank pushes
// on its own endpoints) and must be called by one thread at a time per src rank. Complete() and
// Abort() may be called from any thread once every PushLayer has returned.

#include <atomic>
#include <cstdint>
#include <memory>
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
#include "kvtransfer/reshard.h"
#include "kvtransfer/transport.h"

namespace estuary::kvtransfer {

// One connected endpoint shared by the requests that push from one src rank to one peer. Every
// operation on it takes its mutex (an Endpoint is used by one thread at a time: a rank thread's
// puts for one request may meet another request's flush from the engine thread). Immutable
// identity: when the endpoint fails, the cache makes a new CachedEndpoint; requests that used the
// old one keep it and see its failure.
class CachedEndpoint {
 public:
  explicit CachedEndpoint(std::unique_ptr<Endpoint> endpoint) : endpoint_(std::move(endpoint)) {}

  // Imports `region` once per endpoint (the decode worker registers its pool once, so every
  // request describes the same regions; re-importing per request would grow the endpoint).
  absl::StatusOr<const RemoteRegion*> Import(const RegionDescriptor& region);
  [[nodiscard]] absl::Status Put(const void* local, size_t bytes, const RemoteRegion& dst,
                                 uint64_t dst_offset, absl::Time deadline);
  [[nodiscard]] absl::Status Flush(absl::Time deadline);
  [[nodiscard]] absl::Status SendMessage(std::string_view payload, absl::Time deadline);
  absl::Status Health() const;

 private:
  mutable absl::Mutex mu_;
  std::unique_ptr<Endpoint> endpoint_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, const RemoteRegion*> imported_ ABSL_GUARDED_BY(mu_);
};

// Endpoints of one prefill process, by (peer address, src rank), connected on first use and
// replaced when unhealthy. Thread-safe.
class EndpointCache {
 public:
  explicit EndpointCache(Transport& transport) : transport_(transport) {}

  // The healthy endpoint for (peer_address, src_rank), connecting (bounded by `deadline`) when
  // there is none or the cached one failed.
  absl::StatusOr<std::shared_ptr<CachedEndpoint>> Get(std::string_view peer_address, int src_rank,
                                                      absl::Time deadline);
  // Number of connections made so far (for tests and metrics).
  int64_t connects() const;

 private:
  struct Slot {
    absl::Mutex mu;  // held while connecting
    std::shared_ptr<CachedEndpoint> current ABSL_GUARDED_BY(mu);
  };
  Transport& transport_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, int>, std::shared_ptr<Slot>> slots_
      ABSL_GUARDED_BY(mu_);
  int64_t connects_ ABSL_GUARDED_BY(mu_) = 0;
};

class KvPusher {
 public:
  static constexpr absl::Duration kAbortGrace = absl::Seconds(1);

  // Checks the local pool against the local fingerprint (INVALID_ARGUMENT), then the descriptor
  // with CheckTransferDescriptor (descriptor_check.h: the fingerprints, FAILED_PRECONDITION naming
  // both; transport kind, per-rank layout == whole-model heads / tp_size, layers, head_dim, block
  // size, dtype, one region per layer per rank, enough page ids for `num_prompt_tokens`, page ids
  // inside the regions: INVALID_ARGUMENT naming the field). Then connects (UNAVAILABLE / DEADLINE_EXCEEDED), imports
  // the remote regions and plans the re-sharding. `deadline` bounds every later wait.
  static absl::StatusOr<std::unique_ptr<KvPusher>> Create(
      Transport& transport, EndpointCache& endpoints, const KvPool& local_pool,
      const estuary::v1::TransferDescriptor& descriptor,
      const estuary::v1::KvFormatFingerprint& local_fingerprint, int num_prompt_tokens,
      absl::Time deadline);
  ~KvPusher() = default;
  KvPusher(const KvPusher&) = delete;
  KvPusher& operator=(const KvPusher&) = delete;

  // Posts the puts for positions [first_pos, end_pos) of `layer` held by local shard `src_rank`.
  // `local_pages` are the local page ids covering those positions: the sequence's page table
  // entries [first_page_index, first_page_index + size) with first_page_index ==
  // first_pos / block_size (a LayerReady event's fields). Does not wait for the data to land.
  // INVALID_ARGUMENT for arguments that do not fit; the put's error (UNAVAILABLE for a dead peer);
  // FAILED_PRECONDITION after Complete/Abort.
  [[nodiscard]] absl::Status PushLayer(int src_rank, int layer, int first_pos, int end_pos,
                                       absl::Span<const int32_t> local_pages,
                                       int first_page_index);

  // Flushes every endpoint this request used, then sends the KvCompletion (status OK) to the
  // decode worker. `provenance` has num_tokens bytes; num_tokens must be num_prompt_tokens.
  // `first_token_logprobs` (may be null) travels with the first token.
  // Returns the first error (the request is then failed; call Abort()).
  [[nodiscard]] absl::Status Complete(
      int32_t first_token, absl::Span<const uint8_t> provenance, int num_tokens,
      const estuary::v1::TokenLogprobs* first_token_logprobs = nullptr);

  // Best effort: flushes the healthy endpoints (so no put lands after the decode worker freed the
  // pages) and sends a KvCompletion carrying `reason`'s code (an OK reason becomes ABORTED),
  // reconnecting once when the cached endpoint failed. An error means the decode worker was not
  // told; its lease frees the pages. FAILED_PRECONDITION after a successful Complete.
  absl::Status Abort(const absl::Status& reason);

  const std::string& request_id() const { return descriptor_.request_id(); }
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

  KvPusher(Transport& transport, EndpointCache& endpoints, const KvPool& local_pool,
           const estuary::v1::TransferDescriptor& descriptor, int num_prompt_tokens,
           absl::Time deadline);
  absl::Status PutPage(int src_rank, int layer, int32_t local_page, int32_t remote_page,
                       int slot_begin, int slot_end);
  absl::Status Failed() const;
  void RecordFailure(const absl::Status& status);
  // Sends `completion` on src rank 0's endpoint to the decode worker's main address, trying up to
  // `attempts` endpoints (the cache reconnects when the previous one failed).
  absl::Status Send(const estuary::v1::KvCompletion& completion, absl::Time deadline,
                    int attempts);

  Transport& transport_;
  EndpointCache& endpoints_;
  const KvPool& local_pool_;
  const estuary::v1::TransferDescriptor descriptor_;
  const int num_prompt_tokens_;
  const absl::Time deadline_;
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
};

}  // namespace estuary::kvtransfer
