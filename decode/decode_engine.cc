#include "decode/decode_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/forward_batch.h"
#include "core/model/request_checks.h"
#include "decode/engine_sequence.h"

namespace estuary {

absl::Status DecodeEngineOptions::Validate(const LlamaConfig& config) const {
  if (max_num_seqs < 1 || max_num_seqs > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-num-seqs = ", max_num_seqs, " must be in [1, 4096]"));
  }
  if (block_size < 1 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size = ", block_size, " must be in [1, 1024]"));
  }
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("--max-num-batched-tokens must be >= 1");
  }
  if (lease_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the lease grace must not be negative");
  }
  if (kv_cache_bytes <= 0 && gpu_memory_utilization <= 0) {
    return absl::InvalidArgumentError("--kv-cache-bytes must be > 0");
  }
  ESTUARY_RETURN_IF_ERROR(
      ValidateDeviceSettings(cuda_device, device_max_rows, gpu_memory_utilization));
  if (cuda_device >= 0 && kv_allocator) {
    return absl::InvalidArgumentError(
        "a GPU decode engine allocates its KV pool in GPU memory itself; a KV region allocator "
        "cannot be given with a CUDA device");
  }
  ESTUARY_RETURN_IF_ERROR(lossless.Validate(config.n_layers));
  return exit.Validate(config.n_layers);
}

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(
    ShardedModel& model, const DecodeEngineOptions& options, TokenSink sink) {
  ESTUARY_RETURN_IF_ERROR(options.Validate(model.config()));
  ESTUARY_ASSIGN_OR_RETURN(
      std::unique_ptr<StepRunner> runner,
      CreateStepRunner(model, options.device_step(), options.kv_allocator, "decode"));
  return std::unique_ptr<DecodeEngine>(
      new DecodeEngine(nullptr, std::move(runner), options, std::move(sink)));
}

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(
    const LlamaModel& model, const River* river, const DecodeEngineOptions& options,
    TokenSink sink) {
  ESTUARY_RETURN_IF_ERROR(options.Validate(model.config()));
  std::unique_ptr<ShardedModel> borrowed = ShardedModel::Borrow(model, river);
  ESTUARY_ASSIGN_OR_RETURN(
      std::unique_ptr<StepRunner> runner,
      CreateStepRunner(*borrowed, options.device_step(), options.kv_allocator, "decode"));
  return std::unique_ptr<DecodeEngine>(
      new DecodeEngine(std::move(borrowed), std::move(runner), options, std::move(sink)));
}

DecodeEngine::DecodeEngine(std::unique_ptr<ShardedModel> borrowed,
                           std::unique_ptr<StepRunner> runner, const DecodeEngineOptions& options,
                           TokenSink sink)
    : borrowed_(std::move(borrowed)),
      runner_(std::move(runner)),
      use_river_(runner_->has_river()),
      options_(options),
      lossless_(options.lossless),
      sink_(std::move(sink)),
      pool_(runner_->pool()),
      stats_(runner_->config().n_layers),
      epochs_((uint64_t{std::random_device()()} << 32) ^ std::random_device()()) {
  lossless_.policy = options_.exit;
}

// Sequences hold pages of the pool, so they go before it.
DecodeEngine::~DecodeEngine() {
  running_.clear();
  waiting_.clear();
}

absl::Status DecodeEngine::ValidateRequest(const DecodeRequest& request) const {
  ESTUARY_RETURN_IF_ERROR(ValidateEngineRequest(runner_->config(), request.prompt_ids,
                                                request.sampling, request.exit_threshold));
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens = ", request.max_tokens, " must be >= 1"));
  }
  if (request.resumed_output < 0 ||
      request.resumed_output >= static_cast<int>(request.prompt_ids.size()) ||
      request.resumed_output >= request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resumed_output_tokens = ", request.resumed_output, " must be in [0, min(prompt of ",
        request.prompt_ids.size(), " tokens, max_tokens = ", request.max_tokens, "))"));
  }
  if (request.lossless && !use_river_) {
    return absl::InvalidArgumentError(
        "exit_mode lossless drafts on the exit river: start the decode worker with --river");
  }
  if (request.lossless && options_.cuda_device >= 0) {
    return absl::UnimplementedError(
        "exit_mode lossless runs on CPU ranks only: the GPU step has no verification pass yet");
  }
  if (request.lossless) ESTUARY_RETURN_IF_ERROR(lossless_.Validate(runner_->config().n_layers));
  return absl::OkStatus();
}

absl::Status DecodeEngine::Submit(DecodeRequest request) {
  ESTUARY_RETURN_IF_ERROR(ValidateRequest(request));
  const std::string id = request.request_id;
  return inbox_.Push(id, std::move(request));
}

std::unique_ptr<DecodeEngine::Sequence> DecodeEngine::NewSequence(DecodeRequest request) {
  const bool exits = use_river_ && !request.exit_disabled;
  const float tau = exits ? request.exit_threshold.value_or(options_.exit.default_threshold) : 2.0f;
  const int64_t arrival = arrivals_.fetch_add(1);
  const bool lossless = request.lossless;
  auto sequence = std::make_unique<Sequence>(std::move(request), pool_.get(), arrival, tau,
                                             runner_->config().eos_ids);
  if (lossless) sequence->round = std::make_unique<LosslessRound>(runner_->config(), lossless_);
  return sequence;
}

bool DecodeEngine::Abort(const std::string& request_id) {
  {
    // Refuse writers from now on; the engine thread ends the reservation.
    absl::MutexLock lock(&reservations_mu_);
    if (auto it = reservations_.find(request_id); it != reservations_.end()) {
      it->second->aborted = true;
    }
  }
  return inbox_.Abort(request_id);
}

bool DecodeEngine::Idle() const {
  {
    absl::MutexLock lock(&reservations_mu_);
    if (!completed_.empty() || !writer_ended_.empty() || !tainted_pages_.empty()) return false;
  }
  return inbox_.Empty() && waiting_.empty() && running_.empty();
}

void DecodeEngine::DrainInbox() {
  std::vector<DecodeRequest> requests;
  std::vector<std::string> aborts;
  inbox_.Take(&requests, &aborts);
  for (DecodeRequest& request : requests) waiting_.push_back(NewSequence(std::move(request)));
  AbortReservations(aborts);
  for (const std::string& id : aborts) {
    auto cancel = [&](auto& sequences) {
      for (auto& s : sequences) {
        if (s->request.request_id == id && !s->finished) {
          Finish(*s, FinishReason::kCancelled, absl::CancelledError(id));
        }
      }
    };
    cancel(waiting_);
    cancel(running_);
  }
  RemoveFinished();
}

void DecodeEngine::Admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    const int target = s.PrefillTarget();
    if (options_.enable_prefix_caching && s.kv.pages().empty()) {
      const absl::Status adopted =
          s.kv.AdoptPrefix(absl::MakeConstSpan(s.tokens.data(), static_cast<size_t>(target)));
      if (!adopted.ok()) ESTUARY_LOG(WARNING) << "prefix adoption: " << adopted;
    }
    // Room for the prompt and the first generated token.
    const absl::Status reserved = s.kv.Reserve(target + 1);
    if (!reserved.ok()) {
      if (running_.empty()) {
        // Nothing will ever free pages for it: the pool is too small for this prompt.
        Finish(s, FinishReason::kError,
               absl::ResourceExhaustedError(absl::StrCat(
                   "prompt of ", target, " tokens needs more KV pages than the pool has (",
                   pool_->num_pages(), " pages of ", pool_->layout().block_size, " tokens)")));
        waiting_.pop_front();
        continue;
      }
      s.kv.Release();
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

absl::Status DecodeEngine::Forward(const std::vector<Sequence*>& batch,
                                   absl::Span<const BatchEntry> entries, StepKind kind,
                                   absl::Span<float> logits, absl::Span<EntryOutcome> outcomes) {
  std::vector<SequenceKv*> kvs;
  kvs.reserve(batch.size());
  for (Sequence* s : batch) kvs.push_back(&s->kv);
  // Decode and draft steps carry the engine's exit policy; prefill steps run the full backbone
  // under the default one (τ above 1 for every entry): the river is there only for the layers
  // that are not resident (--resident-backbone-layers), where the exit is forced. A
  // verification runs the backbone alone (lossless requests need every layer resident).
  StepOptions step;
  step.use_river = use_river_ && kind != StepKind::kVerify;
  step.exit_policy = kind == StepKind::kDecode || kind == StepKind::kDraft;
  step.chunk_invariant = kind == StepKind::kDraft || kind == StepKind::kVerify;
  return runner_->Forward(entries, kvs, step, logits, outcomes);
}

absl::Status DecodeEngine::ForwardOrFail(const std::vector<Sequence*>& batch,
                                         absl::Span<const BatchEntry> entries, StepKind kind,
                                         size_t logit_rows, std::vector<Sequence*>& fail,
                                         std::vector<float>& logits,
                                         std::vector<EntryOutcome>& outcomes) {
  logits.assign(logit_rows * static_cast<size_t>(runner_->config().vocab_size), 0.0f);
  outcomes.assign(entries.size(), EntryOutcome{});
  absl::Status status =
      Forward(batch, entries, kind, absl::MakeSpan(logits), absl::MakeSpan(outcomes));
  if (!status.ok()) FailAll(fail, status);
  return status;
}

namespace {

// Rows of logits a step returns: one per entry that wants them.
size_t WantedLogitRows(absl::Span<const BatchEntry> entries) {
  size_t rows = 0;
  for (const BatchEntry& e : entries) rows += e.want_logits;
  return rows;
}

}  // namespace

absl::Status DecodeEngine::PrefillStep() {
  std::vector<Sequence*> batch;
  std::vector<BatchEntry> entries;
  std::vector<bool> wants_tokens;  // the chunk ends the prompt: sample the first token
  int budget = options_.max_num_batched_tokens;
  for (auto& owned : running_) {
    Sequence& s = *owned;
    if (s.finished || !s.NeedsPrefill() || budget == 0) continue;
    const int begin = s.kv.length();
    const int end = std::min(s.PrefillTarget(), begin + budget);
    budget -= end - begin;
    BatchEntry entry;
    entry.tokens = absl::MakeConstSpan(s.tokens.data() + begin, static_cast<size_t>(end - begin));
    entry.start_pos = begin;
    entry.exit_threshold = 2.0f;  // prefill runs the full backbone (design §5)
    const bool wants_token = end == s.PrefillTarget() && !s.SampledHere();
    entry.want_logits = wants_token && !TokenOnDevice(s);
    entries.push_back(entry);
    wants_tokens.push_back(wants_token);
    batch.push_back(&s);
  }
  if (entries.empty()) return absl::OkStatus();

  std::vector<float> logits;
  std::vector<EntryOutcome> outcomes;
  ESTUARY_RETURN_IF_ERROR(ForwardOrFail(batch, entries, StepKind::kPrefill,
                                        WantedLogitRows(entries), batch, logits, outcomes));
  size_t logit_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    const int n = static_cast<int>(entries[i].tokens.size());
    s.kv.set_length(s.kv.length() + n);
    stats_.RecordPrefillTokens(n);
    if (!wants_tokens[i]) continue;
    if (options_.enable_prefix_caching) s.kv.RegisterFullPages(s.tokens);
    TakeToken(s, entries[i], outcomes[i], logits, logit_row);
  }
  return absl::OkStatus();
}

bool DecodeEngine::EnsureCapacity(Sequence& sequence, int tokens) {
  while (true) {
    const absl::Status status = sequence.kv.Reserve(tokens);
    if (status.ok()) return true;
    // Preempt the newest running sequence (possibly this one) and try again.
    Sequence* victim = nullptr;
    for (auto& s : running_) {
      if (!s->finished && !s->preempted && (victim == nullptr || s->arrival > victim->arrival)) {
        victim = s.get();
      }
    }
    if (victim == nullptr) return false;
    Preempt(*victim);
    if (victim == &sequence) return false;
  }
}

void DecodeEngine::Preempt(Sequence& sequence) {
  sequence.kv.Release();
  sequence.preempted = true;
  ++preemptions_;
  ESTUARY_VLOG(1) << "preempted " << sequence.request.request_id << " at "
                  << sequence.tokens.size() << " tokens";
}

absl::Status DecodeEngine::DecodeStep() {
  // Oldest first, so that preemption takes the newest.
  std::vector<Sequence*> candidates;
  for (auto& s : running_) {
    if (!s->finished && !s->preempted && s->SampledHere() && !s->NeedsPrefill()) {
      candidates.push_back(s.get());
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  // Lossy sequences take one token per step; lossless ones a round (LosslessStep), with room
  // for the positions it may write.
  std::vector<Sequence*> batch, lossless;
  for (Sequence* s : candidates) {
    if (s->preempted) continue;
    const int positions = s->round != nullptr ? LosslessRoundPositions(*s) : 1;
    if (EnsureCapacity(*s, s->kv.length() + positions)) {
      (s->round != nullptr ? lossless : batch).push_back(s);
    }
  }
  // A sequence admitted to the batch may have been preempted by a later one's need.
  const auto preempted = [](Sequence* s) { return s->preempted; };
  batch.erase(std::remove_if(batch.begin(), batch.end(), preempted), batch.end());
  lossless.erase(std::remove_if(lossless.begin(), lossless.end(), preempted), lossless.end());
  if (!lossless.empty()) ESTUARY_RETURN_IF_ERROR(LosslessStep(lossless));
  if (batch.empty()) return absl::OkStatus();

  std::vector<BatchEntry> entries;
  for (Sequence* s : batch) {
    BatchEntry entry;
    entry.tokens = absl::MakeConstSpan(&s->tokens.back(), 1);
    entry.start_pos = s->kv.length();
    entry.exit_threshold = s->exit_threshold;
    entry.want_logits = !TokenOnDevice(*s);
    entries.push_back(entry);
  }
  std::vector<float> logits;
  std::vector<EntryOutcome> outcomes;
  ESTUARY_RETURN_IF_ERROR(ForwardOrFail(batch, entries, StepKind::kDecode,
                                        WantedLogitRows(entries), batch, logits, outcomes));
  size_t logit_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    s.kv.set_length(s.kv.length() + 1);
    stats_.RecordDecodeToken(outcomes[i].backbone_layers);
    TakeToken(s, entries[i], outcomes[i], logits, logit_row);
  }
  return absl::OkStatus();
}

bool DecodeEngine::TokenOnDevice(const Sequence& s) const {
  return runner_->TokenFromArgmax(s.sampler.greedy());
}

void DecodeEngine::TakeToken(Sequence& s, const BatchEntry& entry, const EntryOutcome& outcome,
                             std::vector<float>& logits, size_t& logit_row) {
  if (!entry.want_logits) {
    EmitToken(s, SampledToken{outcome.argmax, std::nullopt}, outcome.backbone_layers);
    return;
  }
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  AcceptToken(s, absl::MakeSpan(logits.data() + logit_row * vocab, vocab),
              outcome.backbone_layers);
  ++logit_row;
}

void DecodeEngine::AcceptToken(Sequence& s, absl::Span<float> logits, int backbone_layers) {
  EmitToken(s, s.sampler.Sample(logits, s.tokens, s.generated), backbone_layers);
}

void DecodeEngine::EmitToken(Sequence& s, SampledToken token, int backbone_layers) {
  const LlamaConfig& c = runner_->config();
  const int32_t next = token.id;
  if (const auto end = EndsSequence(c, s.sampler, next, s.request.ignore_eos)) {
    return Finish(s, *end, absl::OkStatus());
  }
  s.tokens.push_back(next);
  ++s.generated;
  TokenEvent event;
  event.request_id = s.request.request_id;
  event.token_id = next;
  event.backbone_layers = backbone_layers;
  event.logprobs = std::move(token.logprobs);
  sink_(event);
  if (s.generated >= s.request.max_tokens) {
    Finish(s, FinishReason::kLength, absl::OkStatus());
  } else if (static_cast<int>(s.tokens.size()) >= c.max_seq_len) {
    Finish(s, FinishReason::kContext, absl::OkStatus());
  }
}

void DecodeEngine::Finish(Sequence& s, FinishReason reason, absl::Status status,
                          bool release_pages) {
  s.finished = true;
  if (release_pages) s.kv.Release();
  inbox_.Forget(s.request.request_id);
  TokenEvent event;
  event.request_id = s.request.request_id;
  event.finished = true;
  event.finish_reason = reason;
  event.status = std::move(status);
  if (s.round != nullptr) {
    event.draft_tokens = s.round->counts().draft_tokens;
    event.accepted_tokens = s.round->counts().accepted_tokens;
  }
  sink_(event);
}

void DecodeEngine::FailAll(std::vector<Sequence*>& sequences, const absl::Status& status) {
  for (Sequence* s : sequences) {
    if (!s->finished) Finish(*s, FinishReason::kError, status);
  }
}

void DecodeEngine::RemoveFinished() {
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->finished; };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
  // Preempted sequences go back to the front of the queue, oldest first.
  std::vector<std::unique_ptr<Sequence>> preempted;
  for (auto& s : running_) {
    if (!s->finished && s->preempted) {
      s->preempted = false;
      preempted.push_back(std::move(s));
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::unique_ptr<Sequence>& s) {
                                  return s == nullptr || s->finished;
                                }),
                 running_.end());
  std::sort(preempted.begin(), preempted.end(),
            [](const auto& a, const auto& b) { return a->arrival > b->arrival; });
  for (auto& s : preempted) waiting_.push_front(std::move(s));
}

void DecodeEngine::PublishCounts() {
  live_running_.store(static_cast<int>(running_.size()));
  live_waiting_.store(static_cast<int>(waiting_.size()));
}

absl::Status DecodeEngine::Step() {
  DrainInbox();
  DrainReservations();
  RemoveFinished();  // sequences recomputed because a stale writer touched their pages
  Admit();
  PublishCounts();
  absl::Status status = PrefillStep();
  RemoveFinished();
  if (status.ok()) status = DecodeStep();
  RemoveFinished();
  PublishCounts();
  return status;
}

absl::Status DecodeEngine::RunUntilIdle(absl::Time deadline) {
  while (!Idle()) {
    if (absl::Now() > deadline) return absl::DeadlineExceededError("engine did not drain");
    ESTUARY_RETURN_IF_ERROR(Step());
  }
  return absl::OkStatus();
}

}  // namespace estuary
