#include "core/model/self_speculative.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/model/kv_cache.h"

namespace estuary {

absl::Status LosslessOptions::Validate(int n_layers) const {
  if (max_draft_tokens < 1 || max_draft_tokens > kMaxDraftTokens) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-tokens = ", max_draft_tokens,
                                                   " must be in [1, ", kMaxDraftTokens, "]"));
  }
  if (!(min_draft_confidence >= 0.0f && min_draft_confidence <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min-draft-confidence = ", min_draft_confidence, " must be in [0, 1]"));
  }
  if (policy.resident_backbone_layers > 0 && policy.resident_backbone_layers < n_layers) {
    return absl::InvalidArgumentError(
        "--exit-mode lossless verifies on every backbone layer: --resident-backbone-layers "
        "cannot drop any");
  }
  return policy.Validate(n_layers);
}

namespace {

// Random streams of one output position (Sampler::Uniform); 0 is Sampler::Sample's own.
constexpr uint32_t kDraftStream = 1;
constexpr uint32_t kAcceptStream = 2;
constexpr uint32_t kResidualStream = 3;

// softmax(logits)[id] at temperature 1.
double SoftmaxProbability(absl::Span<const float> logits, int32_t id) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (float l : logits) total += std::exp(static_cast<double>(l) - max);
  return std::exp(static_cast<double>(logits[static_cast<size_t>(id)]) - max) / total;
}

// One sequence's state across rounds: its caches (one per rank), its sampler, the tokens so far,
// the current round's drafts and the result being built. The last token of `history_` is
// pending: its KV is not written yet. LosslessBatch (below) drives the rounds and batches every
// sequence's steps into one forward pass.
class LosslessSequence {
 public:
  LosslessSequence(const LlamaConfig& config, const GenerateRequest& request,
                   const LosslessOptions& options, TokenCallback on_token)
      : config_(config),
        request_(request),
        options_(options),
        on_token_(std::move(on_token)),
        sampler_(request.sampling, config.eos_ids),
        history_(request.prompt_ids),
        draft_length_(options.max_draft_tokens) {}

  absl::Status CreateCaches(int tp_size) {
    for (int r = 0; r < tp_size; ++r) {
      ESTUARY_ASSIGN_OR_RETURN(
          ContiguousKvCache cache,
          ContiguousKvCache::Create(config_, GenerateCacheCapacity(config_, request_), tp_size));
      caches_.push_back(std::move(cache));
    }
    return absl::OkStatus();
  }

  KvView* kv(int rank) { return &caches_[static_cast<size_t>(rank)]; }
  bool done() const { return done_; }
  bool drafting() const { return drafting_; }
  int n_drafts() const { return static_cast<int>(drafts_.size()); }
  // Rows of logits the verification gives: one per draft, and the bonus row.
  int verify_rows() const { return n_drafts() + (bonus_ ? 1 : 0); }

  BatchEntry PrefillEntry() const {
    BatchEntry entry;
    entry.tokens = request_.prompt_ids;
    return entry;
  }

  // The prompt's logits give the first token (unless max_tokens is 0).
  void AfterPrefill(absl::Span<float> logits) {
    done_ = Finished() || Emit(sampler_.Sample(logits, history_, 0).id);
  }

  // Starts a round: at most the tokens still wanted, within the context.
  void BeginRound() {
    const int n_layers = config_.n_layers;
    pending_pos_ = static_cast<int>(history_.size()) - 1;
    room_ = std::min(request_.max_tokens - generated(), config_.max_seq_len - pending_pos_);
    round_length_ = std::max(1, std::min(draft_length_, room_));
    drafts_.clear();
    draft_probs_.clear();
    draft_history_ = history_;
    layer_inputs_.assign(static_cast<size_t>(round_length_) * n_layers * config_.dim, 0.0f);
    resume_layer_ = n_layers - 1;
    drafting_ = true;
  }

  // The next draft step: the last token so far (pending, then each draft), saving its residual
  // stream at every layer.
  BatchEntry DraftEntry() {
    const int i = static_cast<int>(drafts_.size());
    BatchEntry entry;
    entry.tokens = absl::MakeConstSpan(&draft_history_.back(), 1);
    entry.start_pos = pending_pos_ + i;
    entry.exit_threshold = options_.policy.default_threshold;
    entry.layer_inputs =
        layer_inputs_.data() + static_cast<int64_t>(i) * config_.n_layers * config_.dim;
    return entry;
  }

  // Drafts from the river's logits; drafting stops at the round's length, at a token that
  // would end the sequence, or below the confidence floor.
  void AfterDraft(absl::Span<float> logits, const EntryOutcome& outcome) {
    resume_layer_ = std::min(resume_layer_, outcome.backbone_layers);
    result_.draft_backbone_layers += outcome.backbone_layers;
    const int out_index = generated() + static_cast<int>(drafts_.size());
    int32_t draft;
    double confidence;
    if (greedy()) {
      const std::vector<float> raw(logits.begin(), logits.end());
      draft = sampler_.Sample(logits, draft_history_, out_index).id;
      confidence = SoftmaxProbability(raw, draft);
    } else {
      std::vector<double> q = sampler_.Distribution(logits, draft_history_, out_index);
      draft = DrawFrom(q, sampler_.Uniform(out_index, kDraftStream));
      confidence = q[static_cast<size_t>(draft)];
      draft_probs_.push_back(std::move(q));
    }
    drafts_.push_back(draft);
    draft_history_.push_back(draft);
    drafting_ = static_cast<int>(drafts_.size()) < round_length_ &&
                !EndsSequence(config_, sampler_, draft, request_.ignore_eos) &&
                confidence >= options_.min_draft_confidence;
  }

  // The verification entries: the pending token and every draft but the last, resumed at the
  // round's smallest exit from the residual streams saved there; then, when one more token fits
  // and the last draft does not end the sequence, the last draft from layer 0 (no draft step
  // ran it), whose logits give the bonus token if every draft is accepted. The second entry
  // follows the first in the step, so it attends to the KV the first writes at each layer
  // (ForwardBatch's entry order).
  std::vector<BatchEntry> VerifyEntries() {
    const int n_layers = config_.n_layers;
    const int64_t dim = config_.dim;
    const int n = n_drafts();
    bonus_ = n < room_ && !EndsSequence(config_, sampler_, drafts_.back(), request_.ignore_eos);
    verify_tokens_.assign(1, history_.back());
    verify_tokens_.insert(verify_tokens_.end(), drafts_.begin(), drafts_.end() - 1);
    BatchEntry verify;
    verify.tokens = verify_tokens_;
    verify.start_pos = pending_pos_;
    verify.logits_every_token = true;
    if (resume_layer_ > 0) {
      resume_hidden_.resize(static_cast<size_t>(n) * dim);
      for (int i = 0; i < n; ++i) {
        const float* row =
            layer_inputs_.data() + (static_cast<int64_t>(i) * n_layers + resume_layer_) * dim;
        std::copy_n(row, dim, resume_hidden_.begin() + static_cast<int64_t>(i) * dim);
      }
      verify.start_layer = resume_layer_;
      verify.start_hidden = resume_hidden_.data();
    }
    result_.draft_tokens += n;
    ++result_.verifications;
    result_.verified_layers += n_layers - resume_layer_;
    std::vector<BatchEntry> entries = {verify};
    if (bonus_) {
      BatchEntry last;
      last.tokens = absl::MakeConstSpan(&drafts_.back(), 1);
      last.start_pos = pending_pos_ + n;
      entries.push_back(last);
      result_.verified_layers += resume_layer_;  // its layers below the resume layer
    }
    return entries;
  }

  // Accepts the longest prefix the full model agrees with, then its own token at the first
  // difference, or the bonus token after the last draft when all are accepted. `full_logits`
  // holds verify_rows() rows.
  void AfterVerify(absl::Span<float> full_logits) {
    const size_t vocab = static_cast<size_t>(config_.vocab_size);
    for (int i = 0; i < n_drafts(); ++i) {
      const absl::Span<float> row = full_logits.subspan(i * vocab, vocab);
      const int32_t draft = drafts_[static_cast<size_t>(i)];
      int32_t token;
      if (options_.acceptance == LosslessOptions::Acceptance::kAcceptEveryDraft) {
        token = draft;
      } else if (greedy()) {
        token = sampler_.Sample(row, history_, generated()).id;
      } else {
        token = AcceptOrResample(row, draft_probs_[static_cast<size_t>(i)], draft);
      }
      if (token != draft) {
        Adapt(/*all_accepted=*/false);
        done_ = Emit(token);
        return;
      }
      ++result_.accepted_tokens;
      if (Emit(token)) {
        done_ = true;
        return;
      }
    }
    Adapt(/*all_accepted=*/true);
    if (bonus_) {
      const absl::Span<float> row = full_logits.subspan(n_drafts() * vocab, vocab);
      done_ = Emit(sampler_.Sample(row, history_, generated()).id);
    }
  }

  GenerateResult TakeResult(absl::Time start, absl::Time prefill_done) {
    result_.prefill_seconds = absl::ToDoubleSeconds(prefill_done - start);
    RecordDecodeTime(prefill_done, result_);
    return std::move(result_);
  }

  GenerateResult& result() { return result_; }

 private:
  int generated() const { return static_cast<int>(result_.completion_ids.size()); }
  bool greedy() const { return request_.sampling.temperature == 0.0f; }

  // max_tokens reached before anything else ended the sequence (also for max_tokens 0).
  bool Finished() {
    if (generated() < request_.max_tokens) return false;
    result_.finish_reason = FinishReason::kLength;
    return true;
  }

  // Appends `token` as the next output unless it ends the sequence; whether the sequence is
  // done. The same end rules, in the same order, as Generate's loop.
  bool Emit(int32_t token) {
    if (const auto end = EndsSequence(config_, sampler_, token, request_.ignore_eos)) {
      result_.finish_reason = *end;
      return true;
    }
    result_.completion_ids.push_back(token);
    history_.push_back(token);
    if (on_token_) on_token_(token);
    if (static_cast<int>(history_.size()) >= config_.max_seq_len) {
      result_.finish_reason = FinishReason::kContext;
      return true;
    }
    return Finished();
  }

  // Speculative sampling of output position generated(): `draft` (drawn from q) if a uniform
  // draw falls below p(draft) / q(draft), else a draw from max(0, p - q) normalised.
  int32_t AcceptOrResample(absl::Span<float> full_logits, const std::vector<double>& q,
                           int32_t draft) {
    const int out_index = generated();
    std::vector<double> p = sampler_.Distribution(full_logits, history_, out_index);
    const size_t d = static_cast<size_t>(draft);
    if (sampler_.Uniform(out_index, kAcceptStream) * q[d] < p[d]) return draft;
    std::vector<double> residual(p.size());
    double mass = 0.0;
    for (size_t v = 0; v < p.size(); ++v) {
      residual[v] = std::max(0.0, p[v] - q[v]);
      mass += residual[v];
    }
    // p == q up to rounding: the rejection had probability ~0; draw from p itself.
    return DrawFrom(mass > 0.0 ? residual : p, sampler_.Uniform(out_index, kResidualStream));
  }

  void Adapt(bool all_accepted) {
    if (!options_.adapt_draft_length) return;
    draft_length_ = all_accepted ? std::min(draft_length_ + 2, options_.max_draft_tokens)
                                 : std::max(draft_length_ - 1, 1);
  }

  const LlamaConfig& config_;
  const GenerateRequest& request_;
  const LosslessOptions& options_;
  TokenCallback on_token_;
  Sampler sampler_;
  std::vector<ContiguousKvCache> caches_;
  std::vector<int32_t> history_;
  int draft_length_;
  bool done_ = false;
  GenerateResult result_;
  // The current round.
  int pending_pos_ = 0;
  int round_length_ = 1;
  int room_ = 1;       // tokens the round may emit: max_tokens and the context
  bool bonus_ = false;  // the verification has the bonus row
  bool drafting_ = false;
  int resume_layer_ = 0;
  std::vector<int32_t> drafts_;
  std::vector<std::vector<double>> draft_probs_;  // q per draft (sampling only)
  std::vector<int32_t> draft_history_;
  std::vector<float> layer_inputs_;  // [draft][layer][dim]
  std::vector<int32_t> verify_tokens_;
  std::vector<float> resume_hidden_;
};

// Runs every sequence to its end, batching their steps: one prefill pass, then rounds in which
// each draft step and the verification are one forward pass over the sequences still in them.
class LosslessBatch {
 public:
  LosslessBatch(ShardedModel& model, const LosslessOptions& options)
      : model_(model), options_(options) {}

  absl::StatusOr<std::vector<GenerateResult>> Run(
      std::vector<std::unique_ptr<LosslessSequence>> sequences) {
    for (auto& s : sequences) ESTUARY_RETURN_IF_ERROR(s->CreateCaches(model_.tp_size()));
    const absl::Time start = absl::Now();
    std::vector<LosslessSequence*> all;
    for (auto& s : sequences) all.push_back(s.get());
    std::vector<BatchEntry> entries;
    for (LosslessSequence* s : all) entries.push_back(s->PrefillEntry());
    ESTUARY_RETURN_IF_ERROR(Step(all, entries, /*use_river=*/false, /*rows=*/all.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i]->AfterPrefill(Row(i));
    const absl::Time prefill_done = absl::Now();

    while (true) {
      std::vector<LosslessSequence*> active;
      for (LosslessSequence* s : all) {
        if (!s->done()) active.push_back(s);
      }
      if (active.empty()) break;
      for (LosslessSequence* s : active) s->BeginRound();
      while (true) {
        std::vector<LosslessSequence*> drafting;
        entries.clear();
        for (LosslessSequence* s : active) {
          if (!s->drafting()) continue;
          drafting.push_back(s);
          entries.push_back(s->DraftEntry());
        }
        if (drafting.empty()) break;
        ESTUARY_RETURN_IF_ERROR(Step(drafting, entries, /*use_river=*/true, drafting.size()));
        for (size_t i = 0; i < drafting.size(); ++i) drafting[i]->AfterDraft(Row(i), outcomes_[i]);
      }
      entries.clear();
      std::vector<LosslessSequence*> owners;  // of each entry: a sequence has one or two
      size_t rows = 0;
      for (LosslessSequence* s : active) {
        for (const BatchEntry& entry : s->VerifyEntries()) {
          entries.push_back(entry);
          owners.push_back(s);
        }
        rows += static_cast<size_t>(s->verify_rows());
      }
      ESTUARY_RETURN_IF_ERROR(Step(owners, entries, /*use_river=*/false, rows));
      const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
      size_t row = 0;
      for (LosslessSequence* s : active) {
        const size_t n = static_cast<size_t>(s->verify_rows());
        s->AfterVerify(absl::MakeSpan(logits_).subspan(row * vocab, n * vocab));
        row += n;
      }
    }
    std::vector<GenerateResult> results;
    for (LosslessSequence* s : all) results.push_back(s->TakeResult(start, prefill_done));
    return results;
  }

 private:
  // One batch-invariant forward over `entries` (entry i belongs to sequences[i]), `rows`
  // logits rows.
  absl::Status Step(const std::vector<LosslessSequence*>& sequences,
                    absl::Span<const BatchEntry> entries, bool use_river, size_t rows) {
    ShardedForwardOptions forward;
    forward.use_river = use_river;
    forward.policy = options_.policy;
    forward.chunk_invariant = true;
    logits_.resize(rows * static_cast<size_t>(model_.config().vocab_size));
    outcomes_.assign(entries.size(), EntryOutcome{});
    return model_.Forward(
        entries, [&](int rank, size_t e) { return sequences[e]->kv(rank); }, forward,
        absl::MakeSpan(logits_), absl::MakeSpan(outcomes_));
  }

  absl::Span<float> Row(size_t i) {
    const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
    return absl::MakeSpan(logits_).subspan(i * vocab, vocab);
  }

  ShardedModel& model_;
  const LosslessOptions& options_;
  std::vector<float> logits_;
  std::vector<EntryOutcome> outcomes_;
};

absl::Status CheckLossless(const ShardedModel& model, const LosslessOptions& options) {
  ESTUARY_RETURN_IF_ERROR(options.Validate(model.config().n_layers));
  if (model.river(0) == nullptr) {
    return absl::FailedPreconditionError(
        "lossless decoding drafts on the exit river, which was not built");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerateResult> GenerateLossless(ShardedModel& model, const GenerateRequest& request,
                                                const LosslessOptions& options,
                                                const TokenCallback& on_token) {
  ESTUARY_RETURN_IF_ERROR(ValidateGenerateRequest(model.config(), request));
  ESTUARY_RETURN_IF_ERROR(CheckLossless(model, options));
  std::vector<std::unique_ptr<LosslessSequence>> sequences;
  sequences.push_back(
      std::make_unique<LosslessSequence>(model.config(), request, options, on_token));
  ESTUARY_ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                           LosslessBatch(model, options).Run(std::move(sequences)));
  return std::move(results[0]);
}

absl::StatusOr<std::vector<GenerateResult>> GenerateLosslessBatch(
    ShardedModel& model, absl::Span<const GenerateRequest> requests,
    const LosslessOptions& options) {
  if (requests.empty()) return absl::InvalidArgumentError("no requests");
  for (size_t i = 0; i < requests.size(); ++i) {
    const absl::Status valid = ValidateGenerateRequest(model.config(), requests[i]);
    if (!valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("request ", i, ": ", valid.message()));
    }
  }
  ESTUARY_RETURN_IF_ERROR(CheckLossless(model, options));
  std::vector<std::unique_ptr<LosslessSequence>> sequences;
  for (const GenerateRequest& request : requests) {
    sequences.push_back(
        std::make_unique<LosslessSequence>(model.config(), request, options, nullptr));
  }
  return LosslessBatch(model, options).Run(std::move(sequences));
}

}  // namespace estuary
