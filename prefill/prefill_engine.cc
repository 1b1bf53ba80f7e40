#include "prefill/prefill_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/model/generator.h"
#include "core/model/request_checks.h"

namespace estuary {

// One request's state, owned by the engine thread.
struct PrefillEngine::Sequence {
  Sequence(PrefillRequest r, KvPool* pool, float threshold, std::vector<int32_t> eos_ids)
      : request(std::move(r)),
        sampler(request.sampling, std::move(eos_ids)),
        kv(pool),
        exit_threshold(threshold) {}

  int prompt_len() const { return static_cast<int>(request.prompt_ids.size()); }

  PrefillRequest request;
  Sampler sampler;
  SequenceKv kv;  // length(): prompt positions whose KV is written
  float exit_threshold;
  std::vector<int> chunk_backbone_layers;
  int32_t first_token = -1;
  std::optional<TokenLogprobs> first_token_logprobs;
  bool finished = false;
};

absl::Status PrefillEngineOptions::Validate(const LlamaConfig& config) const {
  if (max_num_batched_tokens < 1 || max_num_batched_tokens > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-num-batched-tokens = ", max_num_batched_tokens, " must be in [1, 1048576]"));
  }
  if (block_size < 1 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size = ", block_size, " must be in [1, 1024]"));
  }
  if (max_num_seqs < 1 || max_num_seqs > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-num-seqs = ", max_num_seqs, " must be in [1, 4096]"));
  }
  if (kv_cache_bytes <= 0 && gpu_memory_utilization <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-bytes = ", kv_cache_bytes, " must be > 0"));
  }
  ESTUARY_RETURN_IF_ERROR(
      ValidateDeviceSettings(cuda_device, device_max_rows, gpu_memory_utilization));
  if (prefill_exit) return exit.Validate(config.n_layers);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(
    ShardedModel& model, const PrefillEngineOptions& options, PrefillSink sink) {
  const LlamaConfig& config = model.config();
  ESTUARY_RETURN_IF_ERROR(options.Validate(config));
  if (options.prefill_exit && model.river(0) == nullptr) {
    return absl::FailedPreconditionError(
        "--prefill-exit needs the exit river: call ShardedModel::BuildRiver first");
  }
  const int tp = model.tp_size();
  const KvLayout layout = KvLayout::FromConfig(config, options.block_size, tp);
  ESTUARY_RETURN_IF_ERROR(layout.Validate());
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner,
                           CreateStepRunner(model, options.device_step(), {}, "prefill"));
  ESTUARY_VLOG(1) << "prefill engine: tp " << tp << ", " << runner->pool()->num_pages()
                  << " pages of " << options.block_size << " tokens";
  return std::unique_ptr<PrefillEngine>(
      new PrefillEngine(std::move(runner), options, std::move(sink)));
}

PrefillEngine::PrefillEngine(std::unique_ptr<StepRunner> runner,
                             const PrefillEngineOptions& options, PrefillSink sink)
    : runner_(std::move(runner)),
      options_(options),
      sink_(std::move(sink)),
      pool_(runner_->pool()) {}

// Sequences hold pages of the pool, so they go before it.
PrefillEngine::~PrefillEngine() {
  running_.clear();
  waiting_.clear();
}

absl::Status PrefillEngine::Submit(PrefillRequest request) {
  const LlamaConfig& config = runner_->config();
  ESTUARY_RETURN_IF_ERROR(
      ValidateEngineRequest(config, request.prompt_ids, request.sampling, request.exit_threshold));
  if (request.resumed_output < 0 ||
      request.resumed_output >= static_cast<int>(request.prompt_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resumed_output_tokens = ", request.resumed_output, " must be in [0, prompt of ",
        request.prompt_ids.size(), " tokens)"));
  }
  const int64_t block = options_.block_size;
  const int64_t pages = (static_cast<int64_t>(request.prompt_ids.size()) + block - 1) / block;
  if (pages > pool_->num_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", request.prompt_ids.size(), " tokens needs ", pages,
        " KV pages; the prefill pool has ", pool_->num_pages(), " (--kv-cache-bytes = ",
        options_.kv_cache_bytes, ")"));
  }
  const std::string id = request.request_id;
  return inbox_.Push(id, std::move(request));
}

bool PrefillEngine::Abort(const std::string& request_id) { return inbox_.Abort(request_id); }

bool PrefillEngine::Idle() const { return inbox_.Empty() && waiting_.empty() && running_.empty(); }

void PrefillEngine::DrainInbox() {
  std::vector<PrefillRequest> requests;
  std::vector<std::string> aborts;
  inbox_.Take(&requests, &aborts);
  for (PrefillRequest& request : requests) {
    const float tau = options_.prefill_exit
                          ? request.exit_threshold.value_or(options_.exit.default_threshold)
                          : 2.0f;
    waiting_.push_back(std::make_unique<Sequence>(std::move(request), pool_.get(), tau,
                                                  runner_->config().eos_ids));
  }
  for (const std::string& id : aborts) {
    auto cancel = [&](auto& sequences) {
      for (auto& s : sequences) {
        if (s->request.request_id == id && !s->finished) {
          Finish(*s, absl::CancelledError(absl::StrCat("request '", id, "' aborted")));
        }
      }
    };
    cancel(waiting_);
    cancel(running_);
  }
}

void PrefillEngine::ExpireDeadlines() {
  const absl::Time now = absl::Now();
  auto expire = [&](auto& sequences) {
    for (auto& s : sequences) {
      if (!s->finished && s->request.deadline && now > *s->request.deadline) {
        Finish(*s, absl::DeadlineExceededError(absl::StrCat(
                       "request '", s->request.request_id, "' passed its deadline after ",
                       s->kv.length(), " of ", s->prompt_len(), " prompt tokens")));
      }
    }
  };
  expire(waiting_);
  expire(running_);
}

absl::Status PrefillEngine::RunBatch(bool* ran) {
  *ran = false;
  int budget = options_.max_num_batched_tokens;
  std::vector<Sequence*> batch;
  std::vector<int> chunk_begin, chunk_end;
  auto add = [&](Sequence& s) {
    const int begin = s.kv.length();
    const int end = std::min(s.prompt_len(), begin + budget);
    budget -= end - begin;
    batch.push_back(&s);
    chunk_begin.push_back(begin);
    chunk_end.push_back(end);
  };
  // Running prompts first (arrival order), then admissions while the budget and pool allow.
  for (auto& s : running_) {
    if (budget == 0) break;
    if (!s->finished) add(*s);
  }
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    if (!s.kv.Reserve(s.prompt_len()).ok()) {
      s.kv.Release();  // all or nothing already; keep it waiting (FIFO: no overtaking)
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    add(s);
  }
  if (batch.empty()) return absl::OkStatus();

  const int tp = runner_->tp_size();
  const int block = options_.block_size;
  const size_t n = batch.size();
  std::vector<BatchEntry> entries(n);
  std::vector<bool> last_chunk(n);
  size_t with_logits = 0;
  for (size_t i = 0; i < n; ++i) {
    Sequence& s = *batch[i];
    BatchEntry& e = entries[i];
    e.tokens = absl::MakeConstSpan(s.request.prompt_ids.data() + chunk_begin[i],
                                   static_cast<size_t>(chunk_end[i] - chunk_begin[i]));
    e.start_pos = chunk_begin[i];
    e.exit_threshold = s.exit_threshold;
    // The last chunk samples the first token: on the host from its logits, or, greedy on a GPU
    // engine, the device's argmax (no logits downloaded).
    last_chunk[i] = chunk_end[i] == s.prompt_len();
    e.want_logits = last_chunk[i] && !runner_->TokenFromArgmax(s.sampler.greedy());
    with_logits += e.want_logits;
  }
  // Each rank's LayerReady events (one per chunk, `layer` set per call): each rank thread
  // touches only its own row, so the callbacks need no lock.
  std::vector<std::vector<LayerReady>> events(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    for (size_t i = 0; i < n; ++i) {
      Sequence& s = *batch[i];
      LayerReady ready;
      ready.request_id = s.request.request_id;
      ready.rank = r;
      ready.first_pos = chunk_begin[i];
      ready.end_pos = chunk_end[i];
      ready.first_page = chunk_begin[i] / block;
      const int last_page = (chunk_end[i] - 1) / block;
      ready.pages.assign(s.kv.pages().begin() + ready.first_page,
                         s.kv.pages().begin() + last_page + 1);
      events[r].push_back(std::move(ready));
    }
  }
  // The engine's exit policy only with prefill_exit; otherwise no exit at all. Chunk invariance:
  // a prompt prefilled in chunks must give the KV it gives in one go.
  StepOptions forward;
  forward.use_river = options_.prefill_exit;
  forward.exit_policy = options_.prefill_exit;
  forward.chunk_invariant = true;
  if (sink_.on_layer_ready) {
    forward.on_layer_done = [this, &events](int rank, int layer) {
      for (LayerReady& ready : events[static_cast<size_t>(rank)]) {
        ready.layer = layer;
        sink_.on_layer_ready(ready);
      }
    };
  }
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  std::vector<float> logits(with_logits * vocab);
  std::vector<EntryOutcome> outcomes(n);
  *ran = true;
  ++steps_;
  std::vector<SequenceKv*> kvs;
  kvs.reserve(n);
  for (Sequence* s : batch) kvs.push_back(&s->kv);
  const absl::Status status =
      runner_->Forward(entries, kvs, forward, absl::MakeSpan(logits), absl::MakeSpan(outcomes));
  if (!status.ok()) {
    ESTUARY_LOG(WARNING) << "prefill step over " << n << " chunks failed: " << status;
    for (Sequence* s : batch) {
      if (!s->finished) Finish(*s, status);
    }
    return status;
  }
  size_t logit_row = 0;
  for (size_t i = 0; i < n; ++i) {
    Sequence& s = *batch[i];
    s.kv.set_length(chunk_end[i]);
    s.chunk_backbone_layers.push_back(outcomes[i].backbone_layers);
    prefill_tokens_ += chunk_end[i] - chunk_begin[i];
    if (!last_chunk[i]) continue;
    if (entries[i].want_logits) {
      SampledToken first = s.sampler.Sample(
          absl::MakeSpan(logits.data() + logit_row * vocab, vocab), s.request.prompt_ids,
          s.request.resumed_output);
      s.first_token = first.id;
      s.first_token_logprobs = std::move(first.logprobs);
      ++logit_row;
    } else {
      s.first_token = outcomes[i].argmax;
    }
    Finish(s, absl::OkStatus());
  }
  return absl::OkStatus();
}

void PrefillEngine::Finish(Sequence& s, absl::Status status) {
  s.finished = true;
  inbox_.Forget(s.request.request_id);
  PrefillDone done;
  done.request_id = s.request.request_id;
  done.status = std::move(status);
  if (done.status.ok()) {
    done.first_token = s.first_token;
    done.first_token_logprobs = std::move(s.first_token_logprobs);
  }
  done.num_tokens = s.kv.length();
  done.pages = s.kv.pages();
  done.provenance.reserve(static_cast<size_t>(done.num_tokens));
  for (int pos = 0; pos < done.num_tokens; ++pos) done.provenance.push_back(s.kv.provenance(pos));
  done.chunk_backbone_layers = std::move(s.chunk_backbone_layers);
  done.pool = pool_;
  done.kv = std::move(s.kv);
  if (sink_.on_done) sink_.on_done(done);
  // `done.kv`, unless the consumer moved it out, releases its pages here.
}

void PrefillEngine::RemoveFinished() {
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->finished; };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
}

absl::Status PrefillEngine::Step() {
  DrainInbox();
  ExpireDeadlines();
  RemoveFinished();
  bool ran = false;
  const absl::Status status = RunBatch(&ran);
  RemoveFinished();
  return status;
}

absl::Status PrefillEngine::RunUntilIdle(absl::Time deadline) {
  while (!Idle()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("prefill engine did not drain: ",
                                                      waiting_.size(), " waiting, ",
                                                      running_.size(), " running"));
    }
    const int64_t before = steps_;
    ESTUARY_RETURN_IF_ERROR(Step());
    // Nothing could run: the pool is full of pages that consumers still hold.
    if (steps_ == before && !Idle()) absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

}  // namespace estuary
