#pragma once
// LosslessRound: one sequence's self-speculative rounds (issue 16), independent of where the
// sequence's KV lives and of how its tokens reach the client. It owns the round's state (the
// drafts, their distributions, the residual streams they saved, the resume layer, the draft
// length and its adaptation) and the acceptance rule; its owner owns the tokens, the sampler
// and the KV, and is reached through LosslessOwner. Owners: GenerateLossless
// (self_speculative.h) and the decode engine's lossless sequences (decode/decode_engine.h).
//
// A round, on the owner's side: Begin(); while drafting(), run DraftEntry() in a river step
// (chunk_invariant) and hand its logits to AfterDraft(); run VerifyEntries() in one backbone
// step (chunk_invariant, in that order, logits of verify_rows() rows) and hand the logits to
// Accept(), which emits the kept tokens through the owner. The KV positions the round wrote
// from the pending token on are [pending, pending + written_positions()); after Accept only
// those below the owner's new pending token hold verified KV, the rest are rewritten later.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/model/draft_payoff.h"
#include "core/model/exit_policy.h"
#include "core/model/forward_batch.h"
#include "core/model/llama_config.h"
#include "core/sampling/sampler.h"

namespace estuary {

inline constexpr int kMaxDraftTokens = 64;

struct LosslessOptions {
  ExitPolicy policy;  // the drafts' exits (τ, min / max backbone layers, rule)
  // Backbone layers a draft runs at most before the int4 river (a forced exit; τ may take it
  // off earlier); -1: no cap, τ decides. Verification makes the output the full model's whatever
  // the drafts' exits, so the depth only trades a draft's cost (a bf16 layer against an int4
  // one) for its acceptance, and measured the acceptance hardly moves with it (README "Lossless
  // mode"): the default 0 runs every draft wholly on the river, the cheapest draft. A request
  // that sets its own τ in the decode engine drafts by that τ, uncapped.
  int draft_backbone_layers = 0;
  int max_draft_tokens = 4;  // k: drafts per verification at most, in [1, kMaxDraftTokens]
  // Drafting stops after a draft the river gives less than this probability (softmax of its
  // logits at temperature 1 when greedy, the sampling distribution otherwise); 0: never.
  float min_draft_confidence = 0.2f;
  bool adapt_draft_length = true;
  // Which rounds draft (draft_payoff.h); the rounds' owner decides each with a DraftPayoff
  // that it feeds their times. The commands and the decode worker default to kAuto
  // (--drafting); a plain round is the pending token through every backbone layer.
  using Drafting = ::estuary::Drafting;
  Drafting drafting = Drafting::kAlways;
  // How drafts are accepted. kSpeculative is the rule that keeps the full model's output.
  // kAcceptEveryDraft (emit the river's tokens as drafted) exists only as the negative control
  // of the distribution test: it must fail it.
  enum class Acceptance : uint8_t { kSpeculative, kAcceptEveryDraft };
  Acceptance acceptance = Acceptance::kSpeculative;

  // INVALID_ARGUMENT names the option: k, the confidence in [0, 1], the drafts' depth in
  // [-1, n_layers], the policy, and every backbone layer resident (verification runs them all).
  absl::Status Validate(int n_layers) const;
};

// What a round needs from the sequence it runs for.
class LosslessOwner {
 public:
  virtual ~LosslessOwner() = default;
  // The prompt and every emitted token; the last one is pending (its KV not written).
  virtual const std::vector<int32_t>& history() const = 0;
  virtual int generated() const = 0;
  virtual Sampler& sampler() = 0;
  // Whether `token` would end the sequence (EndsSequence), without emitting it.
  virtual bool Ends(int32_t token) const = 0;
  // Emits `token` as the next output (or ends the sequence on it); whether the sequence is done.
  virtual bool Emit(SampledToken token) = 0;
};

// Counters over every round, for GenerateResult and the engine's usage.
struct LosslessCounts {
  int64_t draft_tokens = 0;     // drafts verified
  int64_t accepted_tokens = 0;  // drafts kept
  int64_t verifications = 0;    // verification passes
  int64_t verified_layers = 0;  // backbone layers the passes ran (per pass, not per row)
  int64_t draft_backbone_layers = 0;  // backbone layers the drafts ran before their exits
  int64_t plain_rounds = 0;           // rounds without drafts (one full-depth token each)

  // Adds what `now` counted beyond `before` (the same round's counts, earlier).
  void AddSince(const LosslessCounts& now, const LosslessCounts& before) {
    draft_tokens += now.draft_tokens - before.draft_tokens;
    accepted_tokens += now.accepted_tokens - before.accepted_tokens;
    verifications += now.verifications - before.verifications;
    verified_layers += now.verified_layers - before.verified_layers;
    draft_backbone_layers += now.draft_backbone_layers - before.draft_backbone_layers;
    plain_rounds += now.plain_rounds - before.plain_rounds;
  }
};

class LosslessRound {
 public:
  LosslessRound(const LlamaConfig& config, const LosslessOptions& options);

  // Starts a round at the owner's pending token, emitting at most `room` tokens (>= 1: what
  // max_tokens and the context leave). Positions it may write: written_positions() at most
  // max_draft_tokens() + 1. Without `drafts` the round is plain: no draft step, and its
  // verification is the pending token through every layer, whose logits give one token.
  void Begin(LosslessOwner& owner, int room, bool drafts = true);
  bool drafting() const { return drafting_; }
  // The next draft step's entry (the pending token, then each draft), saving its residual
  // stream at every layer. Valid until the next call on this round.
  BatchEntry DraftEntry();
  // Drafts from the river's logits; drafting stops at the round's length, at a token that
  // would end the sequence, or below the confidence floor.
  void AfterDraft(LosslessOwner& owner, absl::Span<float> logits, const EntryOutcome& outcome);
  // The verification entries (one or two, in this order in one step): the pending token and
  // every draft but the last, resumed at the round's smallest exit from the streams saved
  // there; then, when one more token fits and the last draft does not end the sequence, the
  // last draft from layer 0, whose logits give the bonus token if every draft is kept.
  std::vector<BatchEntry> VerifyEntries(const LosslessOwner& owner);
  // Rows of logits VerifyEntries gives: one per draft, and the bonus row.
  int verify_rows() const { return n_drafts() + (bonus_ ? 1 : 0); }
  // KV positions the round wrote from the pending one on (drafts, then verification).
  int written_positions() const { return verify_rows(); }
  // Keeps the longest prefix of drafts the full model agrees with, then its own token at the
  // first difference, or the bonus token; emits them through the owner until it is done.
  // `full_logits` holds verify_rows() rows.
  void Accept(LosslessOwner& owner, absl::Span<float> full_logits);

  int max_draft_tokens() const { return options_.max_draft_tokens; }
  const LosslessCounts& counts() const { return counts_; }

 private:
  int n_drafts() const { return static_cast<int>(drafts_.size()); }
  int32_t AcceptOrResample(LosslessOwner& owner, absl::Span<float> full_logits,
                           const std::vector<double>& q, int32_t draft);
  void Adapt(bool all_accepted);

  const LlamaConfig& config_;
  const LosslessOptions& options_;
  int draft_length_;
  LosslessCounts counts_;
  // The current round.
  int pending_pos_ = 0;
  int round_length_ = 1;
  int room_ = 1;
  bool drafting_ = false;
  bool bonus_ = false;
  int resume_layer_ = 0;
  std::vector<int32_t> drafts_;
  std::vector<std::vector<double>> draft_probs_;  // q per draft (sampling only)
  std::vector<int32_t> draft_history_;            // history, then the drafts
  std::vector<float> layer_inputs_;               // [draft][layer][dim]
  std::vector<int32_t> verify_tokens_;
  std::vector<float> resume_hidden_;
};

}  // namespace estuary
