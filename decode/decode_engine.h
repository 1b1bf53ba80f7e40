#pragma once
// DecodeEngine: continuous batching over the paged KV pool with the exit river (design §4-§5).
//
// Each Step() admits waiting sequences while pages and --max-num-seqs allow, prefills admitted
// prompts in chunks of at most max_num_batched_tokens (full backbone), then runs one decode
// forward over every running sequence, samples a token for each and emits it with its exit
// layer. Sequences retire on EOS, a stop token, max_tokens, the context length or abort, and
// their pages are freed at once. When a running sequence needs a page and none is left, the
// newest running sequence is preempted: its pages are freed and it is recomputed later from its
// tokens (nothing the client saw changes).
//
// Tensor parallelism: the engine drives a ShardedModel; its pool has one shard per rank (one
// page table), and every forward step runs on all ranks (sharded_model.h).
//
// Threading: Submit() and Abort() may be called from any thread; Step() and the TokenSink run
// on one engine thread. The model and river must outlive the engine; the engine owns the pool.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/request_inbox.h"
#include "core/kvcache/kv_pool.h"
#include "core/model/draft_payoff.h"
#include "core/model/exit_policy.h"
#include "core/model/lossless_round.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "core/model/device_step.h"
#include "core/model/step_runner.h"
#include "decode/decode_request.h"
#include "decode/exit_stats.h"

namespace estuary {

struct DecodeEngineOptions {
  int max_num_seqs = 64;
  int block_size = 16;
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int max_num_batched_tokens = 512;  // prefill tokens per step
  bool enable_prefix_caching = true;
  // How long past its lease a reservation whose writer attached keeps its pages fenced when the
  // writer's completion does not come (kvtransfer/README.md "Fencing"): covers puts the writer
  // posted just before its stop (the lease less KvPusher::kLeaseSkewMargin) and still in flight,
  // and clock skew between the hosts.
  absl::Duration lease_grace = absl::Seconds(1);
  ExitPolicy exit;                   // used only when a river is given
  // Lossless requests' draft settings (k, the confidence floor, adaptation, the drafts' depth
  // cap); their exits follow `exit` and each request's τ (the policy here is ignored).
  LosslessOptions lossless;
  // Where the pool's memory comes from (kv_pool.h); default: anonymous mappings. A decode
  // worker passes its transport's allocator so that prefill peers on the host write directly.
  KvRegionAllocator kv_allocator;
  // >= 0: run the forward steps on this CUDA device (device_step.h), TP 1 only, with the pool in
  // GPU memory; needs a build with ESTUARY_CUDA. -1: on the CPU ranks.
  int cuda_device = -1;
  // With cuda_device: > 0 sizes the KV pool from the device's memory instead of kv_cache_bytes
  // (DeviceStepOptions::gpu_memory_utilization).
  double gpu_memory_utilization = 0;
  int device_max_rows = 64;  // rows per device step (CUDA graph buckets up to this)
  DeviceStepOptions device_step() const {
    return {cuda_device, kv_cache_bytes, block_size, device_max_rows, exit, gpu_memory_utilization};
  }

  absl::Status Validate(const LlamaConfig& config) const;
};

class DecodeEngine {
 public:
  // Runs on `model`'s ranks, with its exit river when one was built (BuildRiver). Allocates the
  // KV pool once, `options.kv_cache_bytes` over all ranks.
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(ShardedModel& model,
                                                              const DecodeEngineOptions& options,
                                                              TokenSink sink);
  // TP 1 over a plain model; `river` may be null (no early exit).
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const LlamaModel& model,
                                                              const River* river,
                                                              const DecodeEngineOptions& options,
                                                              TokenSink sink);
  ~DecodeEngine();

  // Queues a request. INVALID_ARGUMENT (naming the limit) for an empty prompt, ids outside the
  // vocabulary, a prompt that fills the context, bad sampling or exit parameters, or a
  // duplicate live request id.
  absl::Status Submit(DecodeRequest request);
  // Ends a waiting, running or reserved request with CANCELLED and frees its pages (a reserved
  // request's pages stay fenced while its writer may write them: see Reserve). False when
  // unknown. A reservation refuses writers from this call on.
  bool Abort(const std::string& request_id);

  // Disaggregated serving (design §1, §7): the decode side of a KV push, fenced (kvtransfer/
  // README.md "Fencing"; decode/decode_reservations.cc).
  //
  // Reserve() validates `request` as Submit() does and takes pages for its prompt plus the first
  // generated token, under a lease, and names the reservation with a random epoch. A writer (the
  // prefill side) attaches (AttachWriter) before its first put, writes the prompt's K/V straight
  // into those pages (every layer, every shard), then CompleteReservation() hands over the first
  // token it sampled and each prompt slot's provenance; the sequence joins the running batch at
  // the next Step() and the first token is emitted like any other. Or the writer gives up
  // (EndReservation, after its last flush) and the request ends with the writer's status.
  //
  // Pages are never given back while an attached writer may still write them: when the request
  // ends first (Abort, or the lease passes: DEADLINE_EXCEEDED at the next Step) its stream ends
  // at once, but the pages stay fenced until the writer's completion arrives (it flushed and
  // posts nothing more) or `lease + options.lease_grace` passes. Without an attached writer they
  // return at once (a later attach is refused). Everything from a writer is matched on the
  // request id AND the epoch AND the writer's id, and is ignored when it names nothing live.
  struct Reservation {
    std::vector<int32_t> pages;  // page ids, in position order (same ids on every shard)
    absl::Time lease_deadline;
    uint64_t epoch = 0;          // nonzero; TransferDescriptor.reservation_epoch
  };
  // RESOURCE_EXHAUSTED when the pool cannot hold the prompt now. Thread-safe (any thread).
  absl::StatusOr<Reservation> Reserve(DecodeRequest request, absl::Duration lease);

  // The live reservation `request_id` named `epoch` as Reserve issued it (what its transfer
  // descriptor was made from: the KV receiver checks a writer's attach against it); NOT_FOUND
  // when none is live. Thread-safe.
  absl::StatusOr<Reservation> FindReservation(const std::string& request_id, uint64_t epoch) const;

  // Who speaks for a reservation: its epoch, the writer's transport id (kvtransfer::Transport::id),
  // and, on its completion, whether a put may have been posted after the writer's stop.
  struct Writer {
    uint64_t epoch = 0;
    uint64_t id = 0;
    bool late_put = false;
  };
  // The writer asks to push (KvAttach). OK (again for the same writer); FAILED_PRECONDITION when
  // the reservation was aborted, its lease passed or another writer holds it; NOT_FOUND when no
  // live reservation has this id and epoch. Thread-safe.
  absl::Status AttachWriter(const std::string& request_id, const Writer& writer);
  // The attached writer's KV is complete. `provenance` has one byte per prompt position
  // (kvcache/kv_pool.h), each a backbone layer index or kProvenanceFullDepth. INVALID_ARGUMENT for
  // a token outside the vocabulary, a provenance of the wrong length or values, or
  // log-probabilities that name ids outside the vocabulary or more than kMaxLogprobs of them (the
  // request then ends with that error; its pages return, the writer being done). NOT_FOUND when
  // nothing live matches (expired, aborted, stale epoch, never made): ignored, but a fenced
  // reservation of this epoch gets its pages back now, and a late put into pages already given
  // back marks their new owners for recomputation. FAILED_PRECONDITION from a writer that is not
  // the attached one. Thread-safe.
  absl::Status CompleteReservation(const std::string& request_id, const Writer& writer,
                                   int32_t first_token, absl::Span<const uint8_t> provenance,
                                   std::optional<TokenLogprobs> first_token_logprobs = {});
  // The attached writer gave up after its last flush (its abort completion): the request ends
  // with `writer_status` (not OK) and the pages return. NOT_FOUND / FAILED_PRECONDITION as above.
  // Thread-safe.
  absl::Status EndReservation(const std::string& request_id, const Writer& writer,
                              absl::Status writer_status);
  // Reservations still waiting for their KV.
  int reserved() const;
  // Reservations whose request ended but whose pages wait for their writer (fenced).
  int fenced() const;
  // Writers' late-put reports that named pages already given back (their holders recomputed).
  int64_t stale_writer_reports() const;

  // One scheduling iteration (admit, prefill, decode). A model error ends the affected requests
  // with that status and is returned.
  absl::Status Step();
  // True when nothing is waiting or running.
  bool Idle() const;
  // Steps until idle; DEADLINE_EXCEEDED when `deadline` passes first.
  absl::Status RunUntilIdle(absl::Time deadline = absl::InfiniteFuture());

  const ExitStats& exit_stats() const { return stats_; }
  // The lossless rounds' counts over every sequence so far (the worker's metrics).
  const LosslessCounts& lossless_totals() const { return lossless_totals_; }
  const KvPool& pool() const { return *pool_; }
  KvPool& mutable_pool() { return *pool_; }
  int running() const { return static_cast<int>(running_.size()); }
  // Sequences queued for the batch (new and preempted). Engine thread.
  int waiting() const { return static_cast<int>(waiting_.size()); }
  // The same two counts from any thread, as of now (a worker's load, asked for by heartbeats
  // while a step may be running): the batch as of the step's latest scheduling phase, and the
  // queue with the requests submitted since.
  int live_running() const { return live_running_.load(); }
  int live_waiting() const { return live_waiting_.load() + static_cast<int>(inbox_.Queued()); }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Sequence;

  DecodeEngine(std::unique_ptr<ShardedModel> borrowed, std::unique_ptr<StepRunner> runner,
               const DecodeEngineOptions& options, TokenSink sink);
  // What a forward step is for: a prompt chunk (no exit), a decode step (the engine's exit
  // policy), or a lossless round's draft step (the same, batch-invariant kernels) or
  // verification (backbone only, batch-invariant kernels).
  enum class StepKind { kPrefill, kDecode, kDraft, kVerify };
  // One forward step of `entries` over the sequences' pages (every rank's, on the CPU); entry i
  // belongs to batch[i] (a sequence may own two entries of a verification).
  absl::Status Forward(const std::vector<Sequence*>& batch, absl::Span<const BatchEntry> entries,
                       StepKind kind, absl::Span<float> logits, absl::Span<EntryOutcome> outcomes);
  // Forward into `logits` (logit_rows x vocab, zeroed) and `outcomes` (one per entry, reset). A
  // failed step ends every sequence of `fail` with its status (FailAll) and returns it.
  absl::Status ForwardOrFail(const std::vector<Sequence*>& batch,
                             absl::Span<const BatchEntry> entries, StepKind kind,
                             size_t logit_rows, std::vector<Sequence*>& fail,
                             std::vector<float>& logits, std::vector<EntryOutcome>& outcomes);

  void DrainInbox();
  // Moves completed reservations into the running batch, ends those whose writer gave up or
  // whose lease lapsed, gives back fenced pages whose writer confirmed or whose grace passed, and
  // recomputes sequences on pages a stale writer touched (decode_reservations.cc).
  void DrainReservations();
  // Ends the reservations among `aborts` (DrainInbox).
  void AbortReservations(const std::vector<std::string>& aborts);
  struct Reserved;
  // Ends a reserved request that has no KV: its pages return now without an attached writer, else
  // they are fenced until its writer confirms or lease + grace. Engine thread, lock not held.
  void EndReserved(std::unique_ptr<Reserved> reserved, FinishReason reason, absl::Status status);
  // A writer's word that matches no live reservation: confirms a fenced one, or reports a late
  // put into pages given back; NOT_FOUND either way.
  absl::Status WriterGoneLocked(const std::string& request_id, const Writer& writer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reservations_mu_);
  // Preempts (recomputes from their tokens) the running sequences holding any of `pages`.
  void RecomputeTainted(absl::Span<const int32_t> pages);
  // Emits `token` for `sequence` (or ends it on EOS / a stop token) and retires it when done.
  void EmitToken(Sequence& sequence, SampledToken token, int backbone_layers);
  // Submit's checks; also used by Reserve.
  absl::Status ValidateRequest(const DecodeRequest& request) const;
  std::unique_ptr<Sequence> NewSequence(DecodeRequest request);
  void Admit();
  absl::Status PrefillStep();
  absl::Status DecodeStep();
  // One round for each lossless sequence of `batch` (capacity ensured): draft steps, one
  // verification, the kept tokens emitted, the rejected positions rolled back
  // (decode/lossless_step.cc).
  absl::Status LosslessStep(std::vector<Sequence*>& batch);
  // Positions a lossless sequence's next round may write from its pending token on.
  int LosslessRoundPositions(const Sequence& sequence) const;
  class LosslessAdapter;
  bool EnsureCapacity(Sequence& sequence, int tokens);
  void Preempt(Sequence& sequence);
  // Samples from `logits`, emits the token, and retires the sequence when it is done.
  void AcceptToken(Sequence& sequence, absl::Span<float> logits, int backbone_layers);
  // Whether `sequence`'s next token is the device's argmax (a GPU engine, greedy sampling): its
  // entries then ask for no logits and none are downloaded.
  bool TokenOnDevice(const Sequence& sequence) const;
  // Emits the token of a step's entry that wants one: the device's argmax when the entry asked
  // for no logits, else sampled from its row of `logits` (rows in entry order; advances
  // logit_row).
  void TakeToken(Sequence& sequence, const BatchEntry& entry, const EntryOutcome& outcome,
                 std::vector<float>& logits, size_t& logit_row);
  // Ends the request (its final event); its pages return unless `release_pages` is false (a
  // fenced reservation's pages, which return later).
  void Finish(Sequence& sequence, FinishReason reason, absl::Status status,
              bool release_pages = true);
  void FailAll(std::vector<Sequence*>& sequences, const absl::Status& status);
  void RemoveFinished();
  // Copies the batch and queue sizes to live_running_ / live_waiting_ (engine thread).
  void PublishCounts();

  std::unique_ptr<ShardedModel> borrowed_;  // Create(LlamaModel&, ...) only; runner_ runs it
  // The forward steps, on the CPU ranks or a GPU (CreateStepRunner); it made the pool.
  std::unique_ptr<StepRunner> runner_;
  const bool use_river_;
  DecodeEngineOptions options_;
  LosslessOptions lossless_;  // options_.lossless under options_.exit; the rounds refer to it
  DraftPayoff payoff_;        // the lossless steps' timings, for Drafting::kAuto
  LosslessCounts lossless_totals_;
  TokenSink sink_;
  std::shared_ptr<KvPool> pool_;  // runner_->pool()
  ExitStats stats_;
  int64_t preemptions_ = 0;
  std::atomic<int64_t> arrivals_{0};
  std::atomic<int> live_running_{0};
  std::atomic<int> live_waiting_{0};

  // Requests and aborts from other threads, taken by the engine thread at the start of Step().
  RequestInbox<DecodeRequest> inbox_;
  // Reservations (decode_reservations.cc), under one mutex: those waiting for their KV, those
  // whose KV arrived (for the engine thread to run), those whose writer gave up or sent a
  // refused completion (for the engine thread to end), and fenced ones: their request ended,
  // their pages wait for their writer, by epoch. `given_back_` remembers the pages of the last
  // reservations given back without their writer's word, so that a late report can find them;
  // `tainted_pages_` are pages a stale writer may have written, for the engine thread.
  struct Fenced;
  mutable absl::Mutex reservations_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Reserved>> reservations_
      ABSL_GUARDED_BY(reservations_mu_);
  std::vector<std::unique_ptr<Reserved>> completed_ ABSL_GUARDED_BY(reservations_mu_);
  std::vector<std::unique_ptr<Reserved>> writer_ended_ ABSL_GUARDED_BY(reservations_mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Fenced>> fenced_ ABSL_GUARDED_BY(reservations_mu_);
  std::deque<std::pair<uint64_t, std::vector<int32_t>>> given_back_
      ABSL_GUARDED_BY(reservations_mu_);
  std::vector<int32_t> tainted_pages_ ABSL_GUARDED_BY(reservations_mu_);
  int64_t stale_writer_reports_ ABSL_GUARDED_BY(reservations_mu_) = 0;
  std::mt19937_64 epochs_ ABSL_GUARDED_BY(reservations_mu_);  // seeded from std::random_device

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting_;   // admission order; preempted go first
  std::vector<std::unique_ptr<Sequence>> running_;  // admitted, holding pages
};

}  // namespace estuary
