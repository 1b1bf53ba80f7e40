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
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/request_inbox.h"
#include "core/kvcache/kv_pool.h"
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
  ExitPolicy exit;                   // used only when a river is given
  // Lossless requests' draft settings (k, the confidence floor, adaptation); their exits follow
  // `exit` and each request's τ (the policy here is ignored).
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
  // Ends a waiting, running or reserved request with CANCELLED and frees its pages. False when
  // unknown.
  bool Abort(const std::string& request_id);

  // Disaggregated serving (design §1, §7): the decode side of a KV push.
  //
  // Reserve() validates `request` as Submit() does and takes pages for its prompt plus the first
  // generated token, under a lease: if CompleteReservation() does not come before `lease`
  // passes, the next Step() frees the pages and ends the request with DEADLINE_EXCEEDED. The
  // prefill side writes the prompt's K/V straight into those pages (every layer, every shard),
  // then CompleteReservation() hands over the first token it sampled and each prompt slot's
  // provenance; the sequence joins the running batch at the next Step() and the first token is
  // emitted like any other. RESOURCE_EXHAUSTED when the pool cannot hold the prompt now.
  // Thread-safe (any thread).
  struct Reservation {
    std::vector<int32_t> pages;  // page ids, in position order (same ids on every shard)
    absl::Time lease_deadline;
  };
  absl::StatusOr<Reservation> Reserve(DecodeRequest request, absl::Duration lease);
  // `provenance` has one byte per prompt position (kvcache/kv_pool.h). NOT_FOUND when the
  // reservation is unknown (expired, aborted, or never made); INVALID_ARGUMENT for a token
  // outside the vocabulary, a provenance of the wrong length, or log-probabilities that name
  // ids outside the vocabulary or more than kMaxLogprobs of them. `first_token_logprobs` (from
  // the prefill side, when the request asked for logprobs) travels with the first token.
  absl::Status CompleteReservation(const std::string& request_id, int32_t first_token,
                                   absl::Span<const uint8_t> provenance,
                                   std::optional<TokenLogprobs> first_token_logprobs = {});
  // Reservations still waiting for their KV.
  int reserved() const;

  // One scheduling iteration (admit, prefill, decode). A model error ends the affected requests
  // with that status and is returned.
  absl::Status Step();
  // True when nothing is waiting or running.
  bool Idle() const;
  // Steps until idle; DEADLINE_EXCEEDED when `deadline` passes first.
  absl::Status RunUntilIdle(absl::Time deadline = absl::InfiniteFuture());

  const ExitStats& exit_stats() const { return stats_; }
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

  void DrainInbox();
  // Moves completed reservations into the running batch and expires lapsed leases.
  void DrainReservations();
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
  void Finish(Sequence& sequence, FinishReason reason, absl::Status status);
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
  TokenSink sink_;
  std::shared_ptr<KvPool> pool_;  // runner_->pool()
  ExitStats stats_;
  int64_t preemptions_ = 0;
  std::atomic<int64_t> arrivals_{0};
  std::atomic<int> live_running_{0};
  std::atomic<int> live_waiting_{0};

  // Requests and aborts from other threads, taken by the engine thread at the start of Step().
  RequestInbox<DecodeRequest> inbox_;
  // Reserved sequences waiting for their KV (their pages held), and those whose KV arrived.
  struct Reserved;
  mutable absl::Mutex reservations_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Reserved>> reservations_
      ABSL_GUARDED_BY(reservations_mu_);
  std::vector<std::unique_ptr<Reserved>> completed_ ABSL_GUARDED_BY(reservations_mu_);

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting_;   // admission order; preempted go first
  std::vector<std::unique_ptr<Sequence>> running_;  // admitted, holding pages
};

}  // namespace estuary
