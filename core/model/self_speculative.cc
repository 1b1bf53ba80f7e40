#include "core/model/self_speculative.h"

#include <algorithm>
#include <cmath>
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

// One sequence's state across rounds: its caches (one per rank), the tokens so far and the
// result being built. The last token of `history` is pending: its KV is not written yet.
class LosslessDecoder {
 public:
  LosslessDecoder(ShardedModel& model, const GenerateRequest& request,
                  const LosslessOptions& options, const TokenCallback& on_token)
      : model_(model),
        config_(model.config()),
        request_(request),
        options_(options),
        on_token_(on_token),
        sampler_(request.sampling, config_.eos_ids),
        history_(request.prompt_ids),
        draft_length_(options.max_draft_tokens) {}

  absl::StatusOr<GenerateResult> Run() {
    for (int r = 0; r < model_.tp_size(); ++r) {
      ESTUARY_ASSIGN_OR_RETURN(ContiguousKvCache cache,
                               ContiguousKvCache::Create(config_,
                                                         GenerateCacheCapacity(config_, request_),
                                                         model_.tp_size()));
      caches_.push_back(std::move(cache));
    }
    const absl::Time start = absl::Now();
    std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
    ESTUARY_RETURN_IF_ERROR(Prefill(absl::MakeSpan(logits)));
    const absl::Time prefill_done = absl::Now();
    result_.prefill_seconds = absl::ToDoubleSeconds(prefill_done - start);
    if (!Finished()) {
      bool done = Emit(sampler_.Sample(absl::MakeSpan(logits), history_, 0).id);
      while (!done) {
        ESTUARY_ASSIGN_OR_RETURN(done, Round());
      }
    }
    RecordDecodeTime(prefill_done, result_);
    return std::move(result_);
  }

 private:
  int generated() const { return static_cast<int>(result_.completion_ids.size()); }

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

  absl::Status Step(BatchEntry& entry, bool use_river, absl::Span<float> logits,
                    EntryOutcome& outcome) {
    ShardedForwardOptions forward;
    forward.use_river = use_river;
    forward.policy = options_.policy;
    forward.chunk_invariant = true;
    return model_.Forward(
        absl::MakeConstSpan(&entry, 1),
        [this](int rank, size_t) -> KvView* { return &caches_[static_cast<size_t>(rank)]; },
        forward, logits, absl::MakeSpan(&outcome, 1));
  }

  absl::Status Prefill(absl::Span<float> logits) {
    BatchEntry entry;
    entry.tokens = request_.prompt_ids;
    EntryOutcome outcome;
    return Step(entry, /*use_river=*/false, logits, outcome);
  }

  // One round: draft, verify, accept. Whether the sequence is done.
  absl::StatusOr<bool> Round() {
    const int n_layers = config_.n_layers;
    const int64_t dim = config_.dim;
    const size_t vocab = static_cast<size_t>(config_.vocab_size);
    const int pending_pos = static_cast<int>(history_.size()) - 1;
    // Drafts at most: the tokens still wanted, within the context.
    const int room = std::min(request_.max_tokens - generated(), config_.max_seq_len - pending_pos);
    const int k = std::max(1, std::min(draft_length_, room));
    const bool greedy = request_.sampling.temperature == 0.0f;

    // Draft: k river steps, each saving its residual stream per layer.
    std::vector<int32_t> drafts;
    std::vector<std::vector<double>> draft_probs;  // q per draft (sampling only)
    std::vector<float> layer_inputs(static_cast<size_t>(k) * n_layers * dim);
    int resume_layer = n_layers - 1;
    std::vector<float> logits(vocab);
    std::vector<int32_t> draft_history = history_;
    for (int i = 0; i < k; ++i) {
      BatchEntry entry;
      const int32_t input = draft_history.back();
      entry.tokens = absl::MakeConstSpan(&input, 1);
      entry.start_pos = pending_pos + i;
      entry.exit_threshold = options_.policy.default_threshold;
      entry.layer_inputs = layer_inputs.data() + static_cast<int64_t>(i) * n_layers * dim;
      EntryOutcome outcome;
      ESTUARY_RETURN_IF_ERROR(Step(entry, /*use_river=*/true, absl::MakeSpan(logits), outcome));
      resume_layer = std::min(resume_layer, outcome.backbone_layers);
      const int out_index = generated() + i;
      int32_t draft;
      double confidence;
      if (greedy) {
        const std::vector<float> raw = logits;
        draft = sampler_.Sample(absl::MakeSpan(logits), draft_history, out_index).id;
        confidence = SoftmaxProbability(raw, draft);
      } else {
        std::vector<double> q = sampler_.Distribution(absl::MakeSpan(logits), draft_history,
                                                      out_index);
        draft = DrawFrom(q, sampler_.Uniform(out_index, kDraftStream));
        confidence = q[static_cast<size_t>(draft)];
        draft_probs.push_back(std::move(q));
      }
      drafts.push_back(draft);
      draft_history.push_back(draft);
      if (EndsSequence(config_, sampler_, draft, request_.ignore_eos)) break;
      if (confidence < options_.min_draft_confidence) break;
    }
    const int n_drafts = static_cast<int>(drafts.size());
    result_.draft_tokens += n_drafts;
    ++result_.verifications;

    // Verify: the pending token and every draft but the last, resumed at the smallest exit.
    std::vector<int32_t> tokens = {history_.back()};
    tokens.insert(tokens.end(), drafts.begin(), drafts.end() - 1);
    std::vector<float> resume_hidden;
    BatchEntry verify;
    verify.tokens = tokens;
    verify.start_pos = pending_pos;
    verify.logits_every_token = true;
    if (resume_layer > 0) {
      resume_hidden.resize(static_cast<size_t>(n_drafts) * dim);
      for (int i = 0; i < n_drafts; ++i) {
        const float* row = layer_inputs.data() + (static_cast<int64_t>(i) * n_layers + resume_layer) * dim;
        std::copy_n(row, dim, resume_hidden.begin() + static_cast<int64_t>(i) * dim);
      }
      verify.start_layer = resume_layer;
      verify.start_hidden = resume_hidden.data();
    }
    std::vector<float> full_logits(static_cast<size_t>(n_drafts) * vocab);
    EntryOutcome outcome;
    ESTUARY_RETURN_IF_ERROR(Step(verify, /*use_river=*/false, absl::MakeSpan(full_logits), outcome));

    // Accept the longest prefix the full model agrees with, then its own token.
    for (int i = 0; i < n_drafts; ++i) {
      const absl::Span<float> row = absl::MakeSpan(full_logits).subspan(i * vocab, vocab);
      const int32_t draft = drafts[static_cast<size_t>(i)];
      int32_t token;
      if (options_.acceptance == LosslessOptions::Acceptance::kAcceptEveryDraft) {
        token = draft;
      } else if (greedy) {
        token = sampler_.Sample(row, history_, generated()).id;
      } else {
        token = AcceptOrResample(row, draft_probs[static_cast<size_t>(i)], draft);
      }
      if (token != draft) {
        Adapt(/*all_accepted=*/false);
        return Emit(token);
      }
      ++result_.accepted_tokens;
      if (Emit(token)) return true;
    }
    Adapt(/*all_accepted=*/true);
    return false;
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

  ShardedModel& model_;
  const LlamaConfig& config_;
  const GenerateRequest& request_;
  const LosslessOptions& options_;
  const TokenCallback& on_token_;
  Sampler sampler_;
  std::vector<ContiguousKvCache> caches_;
  std::vector<int32_t> history_;
  int draft_length_;
  GenerateResult result_;
};

}  // namespace

absl::StatusOr<GenerateResult> GenerateLossless(ShardedModel& model, const GenerateRequest& request,
                                                const LosslessOptions& options,
                                                const TokenCallback& on_token) {
  const LlamaConfig& config = model.config();
  ESTUARY_RETURN_IF_ERROR(ValidateGenerateRequest(config, request));
  ESTUARY_RETURN_IF_ERROR(options.Validate(config.n_layers));
  if (model.river(0) == nullptr) {
    return absl::FailedPreconditionError(
        "lossless decoding drafts on the exit river, which was not built");
  }
  return LosslessDecoder(model, request, options, on_token).Run();
}

}  // namespace estuary
