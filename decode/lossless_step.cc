// DecodeEngine's lossless rounds (DecodeRequest::lossless): each step, every lossless sequence
// drafts on the river and verifies on the backbone (core/model/lossless_round.h), all of them
// batched into one forward pass per draft step and one per verification. The round writes its
// positions into the sequence's own pages past its length; only verified KV is ever kept below
// the length (the prefix cache registers prompt pages alone), and pages that end up holding no
// kept position go back to the pool at once. A step's rounds all draft or are all plain
// (LosslessOptions::drafting; kAuto: the engine's DraftPayoff, fed each step's time and tokens).

#include <algorithm>
#include <vector>

#include "core/common/status_macros.h"
#include "core/model/generator.h"
#include "decode/decode_engine.h"
#include "decode/engine_sequence.h"

namespace estuary {

// A sequence as its round sees it: tokens and sampler, with emission through the engine (the
// sink, the end rules, retirement).
class DecodeEngine::LosslessAdapter final : public LosslessOwner {
 public:
  LosslessAdapter(DecodeEngine& engine, Sequence& sequence) : engine_(engine), s_(sequence) {}

  const std::vector<int32_t>& history() const override { return s_.tokens; }
  int generated() const override { return s_.generated; }
  Sampler& sampler() override { return s_.sampler; }
  bool Ends(int32_t token) const override {
    return EndsSequence(engine_.runner_->config(), s_.sampler, token, s_.request.ignore_eos)
        .has_value();
  }
  // Every kept token is the full model's: it counts as a full-depth token.
  bool Emit(SampledToken token) override {
    const int n_layers = engine_.runner_->config().n_layers;
    engine_.stats_.RecordDecodeToken(n_layers);
    engine_.EmitToken(s_, std::move(token), n_layers);
    return s_.finished;
  }

 private:
  DecodeEngine& engine_;
  Sequence& s_;
};

int DecodeEngine::LosslessRoundPositions(const Sequence& s) const {
  const int pending_pos = static_cast<int>(s.tokens.size()) - 1;
  const int room = std::min(s.request.max_tokens - s.generated,
                            runner_->config().max_seq_len - pending_pos);
  return std::max(1, std::min(s.round->max_draft_tokens() + 1, room));
}

absl::Status DecodeEngine::LosslessStep(std::vector<Sequence*>& batch) {
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  const int max_seq_len = runner_->config().max_seq_len;
  // One kind of round for the whole batch: its rounds share every forward pass.
  const bool drafts = payoff_.NextRoundDrafts(lossless_.drafting);
  const absl::Time start = absl::Now();
  int64_t emitted = 0;  // tokens the step's rounds emit: generated after less before
  std::vector<LosslessCounts> before;
  for (Sequence* s : batch) {
    before.push_back(s->round->counts());
    LosslessAdapter owner(*this, *s);
    const int pending_pos = static_cast<int>(s->tokens.size()) - 1;
    const int room = std::min(s->request.max_tokens - s->generated, max_seq_len - pending_pos);
    s->round->Begin(owner, room, drafts);
    emitted -= s->generated;
  }
  std::vector<float> logits;
  std::vector<EntryOutcome> outcomes;
  // Draft steps, over the sequences still drafting.
  while (true) {
    std::vector<Sequence*> drafting;
    std::vector<BatchEntry> entries;
    for (Sequence* s : batch) {
      if (!s->round->drafting()) continue;
      BatchEntry entry = s->round->DraftEntry();
      entry.exit_threshold = s->exit_threshold;  // the request's τ
      // A request that sets its own τ drafts by it, without the worker's depth cap.
      if (s->request.exit_threshold.has_value()) entry.max_backbone_layers = -1;
      drafting.push_back(s);
      entries.push_back(entry);
    }
    if (drafting.empty()) break;
    ESTUARY_RETURN_IF_ERROR(ForwardOrFail(drafting, entries, StepKind::kDraft, entries.size(),
                                          batch, logits, outcomes));
    for (size_t i = 0; i < drafting.size(); ++i) {
      LosslessAdapter owner(*this, *drafting[i]);
      drafting[i]->round->AfterDraft(
          owner, absl::MakeSpan(logits).subspan(i * vocab, vocab), outcomes[i]);
    }
  }
  // One verification over every sequence (one or two entries each).
  std::vector<Sequence*> owners;
  std::vector<BatchEntry> entries;
  size_t rows = 0;
  for (Sequence* s : batch) {
    LosslessAdapter owner(*this, *s);
    for (const BatchEntry& entry : s->round->VerifyEntries(owner)) {
      owners.push_back(s);
      entries.push_back(entry);
    }
    rows += static_cast<size_t>(s->round->verify_rows());
  }
  ESTUARY_RETURN_IF_ERROR(
      ForwardOrFail(owners, entries, StepKind::kVerify, rows, batch, logits, outcomes));
  size_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence* s = batch[i];
    const size_t n = static_cast<size_t>(s->round->verify_rows());
    LosslessAdapter owner(*this, *s);
    s->round->Accept(owner, absl::MakeSpan(logits).subspan(row * vocab, n * vocab));
    row += n;
    emitted += s->generated;
    lossless_totals_.AddSince(s->round->counts(), before[i]);
    if (s->finished) continue;
    // Verified KV below the new pending token; the rest rolls back.
    s->kv.set_length(static_cast<int>(s->tokens.size()) - 1);
    s->kv.ReleaseBeyond(s->kv.length());
  }
  payoff_.Record(lossless_.drafting, drafts, absl::Now() - start, emitted);
  return absl::OkStatus();
}

}  // namespace estuary
