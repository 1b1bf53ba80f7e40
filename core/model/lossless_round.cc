#include "core/model/lossless_round.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

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
  if (draft_backbone_layers < -1 || draft_backbone_layers > n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft-backbone-layers = ", draft_backbone_layers,
                     " must be -1 (no cap) or in [0, ", n_layers, "]"));
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

}  // namespace

LosslessRound::LosslessRound(const LlamaConfig& config, const LosslessOptions& options)
    : config_(config), options_(options), draft_length_(options.max_draft_tokens) {}

void LosslessRound::Begin(LosslessOwner& owner, int room, bool drafts) {
  const int n_layers = config_.n_layers;
  pending_pos_ = static_cast<int>(owner.history().size()) - 1;
  room_ = std::max(1, room);
  drafts_.clear();
  draft_probs_.clear();
  bonus_ = false;
  if (!drafts) {
    round_length_ = 0;
    drafting_ = false;
    return;
  }
  round_length_ = std::max(1, std::min(draft_length_, room_));
  draft_history_ = owner.history();
  layer_inputs_.assign(static_cast<size_t>(round_length_) * n_layers * config_.dim, 0.0f);
  resume_layer_ = n_layers - 1;
  drafting_ = true;
}

BatchEntry LosslessRound::DraftEntry() {
  const int i = n_drafts();
  BatchEntry entry;
  entry.tokens = absl::MakeConstSpan(&draft_history_.back(), 1);
  entry.start_pos = pending_pos_ + i;
  entry.exit_threshold = options_.policy.default_threshold;
  entry.max_backbone_layers = options_.draft_backbone_layers;
  entry.layer_inputs =
      layer_inputs_.data() + static_cast<int64_t>(i) * config_.n_layers * config_.dim;
  return entry;
}

void LosslessRound::AfterDraft(LosslessOwner& owner, absl::Span<float> logits,
                               const EntryOutcome& outcome) {
  resume_layer_ = std::min(resume_layer_, outcome.backbone_layers);
  counts_.draft_backbone_layers += outcome.backbone_layers;
  Sampler& sampler = owner.sampler();
  const int out_index = owner.generated() + n_drafts();
  int32_t draft;
  double confidence;
  if (sampler.params().temperature == 0.0f) {
    const std::vector<float> raw(logits.begin(), logits.end());
    draft = sampler.Sample(logits, draft_history_, out_index).id;
    confidence = SoftmaxProbability(raw, draft);
  } else {
    std::vector<double> q = sampler.Distribution(logits, draft_history_, out_index);
    draft = DrawFrom(q, sampler.Uniform(out_index, kDraftStream));
    confidence = q[static_cast<size_t>(draft)];
    draft_probs_.push_back(std::move(q));
  }
  drafts_.push_back(draft);
  draft_history_.push_back(draft);
  drafting_ = n_drafts() < round_length_ && !owner.Ends(draft) &&
              confidence >= options_.min_draft_confidence;
}

std::vector<BatchEntry> LosslessRound::VerifyEntries(const LosslessOwner& owner) {
  const int n_layers = config_.n_layers;
  const int64_t dim = config_.dim;
  const int n = n_drafts();
  if (round_length_ == 0) {
    // A plain round: its one row's token is the round's "bonus" (Accept).
    bonus_ = true;
    ++counts_.plain_rounds;
    verify_tokens_.assign(1, owner.history().back());
    BatchEntry plain;
    plain.tokens = verify_tokens_;
    plain.start_pos = pending_pos_;
    plain.logits_every_token = true;
    return {plain};
  }
  bonus_ = n < room_ && !owner.Ends(drafts_.back());
  verify_tokens_.assign(1, owner.history().back());
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
  counts_.draft_tokens += n;
  ++counts_.verifications;
  counts_.verified_layers += n_layers - resume_layer_;
  std::vector<BatchEntry> entries = {verify};
  if (bonus_) {
    BatchEntry last;
    last.tokens = absl::MakeConstSpan(&drafts_.back(), 1);
    last.start_pos = pending_pos_ + n;
    entries.push_back(last);
    counts_.verified_layers += resume_layer_;  // its layers below the resume layer
  }
  return entries;
}

void LosslessRound::Accept(LosslessOwner& owner, absl::Span<float> full_logits) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  Sampler& sampler = owner.sampler();
  const bool greedy = sampler.params().temperature == 0.0f;
  const int top_logprobs = sampler.params().logprobs;
  for (int i = 0; i < n_drafts(); ++i) {
    const absl::Span<float> row = full_logits.subspan(i * vocab, vocab);
    const int32_t draft = drafts_[static_cast<size_t>(i)];
    SampledToken token;
    if (options_.acceptance == LosslessOptions::Acceptance::kAcceptEveryDraft) {
      token.id = draft;
    } else if (greedy) {
      token = sampler.Sample(row, owner.history(), owner.generated());
    } else {
      // The full model's log-probabilities, from the raw row (Distribution adjusts it).
      std::vector<float> raw;
      if (top_logprobs >= 0) raw.assign(row.begin(), row.end());
      token.id = AcceptOrResample(owner, row, draft_probs_[static_cast<size_t>(i)], draft);
      if (top_logprobs >= 0) token.logprobs = LogprobsOf(raw, token.id, top_logprobs);
    }
    if (token.id != draft) {
      Adapt(/*all_accepted=*/false);
      owner.Emit(std::move(token));
      return;
    }
    ++counts_.accepted_tokens;
    if (owner.Emit(std::move(token))) return;
  }
  if (round_length_ > 0) Adapt(/*all_accepted=*/true);
  if (bonus_) {
    const absl::Span<float> row = full_logits.subspan(n_drafts() * vocab, vocab);
    owner.Emit(sampler.Sample(row, owner.history(), owner.generated()));
  }
}

// Speculative sampling of the owner's next output position: `draft` (drawn from q) if a
// uniform draw falls below p(draft) / q(draft), else a draw from max(0, p - q) normalised.
int32_t LosslessRound::AcceptOrResample(LosslessOwner& owner, absl::Span<float> full_logits,
                                        const std::vector<double>& q, int32_t draft) {
  const Sampler& sampler = owner.sampler();
  const int out_index = owner.generated();
  std::vector<double> p = sampler.Distribution(full_logits, owner.history(), out_index);
  const size_t d = static_cast<size_t>(draft);
  if (sampler.Uniform(out_index, kAcceptStream) * q[d] < p[d]) return draft;
  std::vector<double> residual(p.size());
  double mass = 0.0;
  for (size_t v = 0; v < p.size(); ++v) {
    residual[v] = std::max(0.0, p[v] - q[v]);
    mass += residual[v];
  }
  // p == q up to rounding: the rejection had probability ~0; draw from p itself.
  return DrawFrom(mass > 0.0 ? residual : p, sampler.Uniform(out_index, kResidualStream));
}

void LosslessRound::Adapt(bool all_accepted) {
  if (!options_.adapt_draft_length) return;
  draft_length_ = all_accepted ? std::min(draft_length_ + 2, options_.max_draft_tokens)
                               : std::max(draft_length_ - 1, 1);
}

}  // namespace estuary
