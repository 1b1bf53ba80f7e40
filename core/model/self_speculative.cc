#include "core/model/self_speculative.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/model/draft_payoff.h"
#include "core/model/kv_cache.h"

namespace estuary {
namespace {

// One sequence of GenerateLossless: its caches (one per rank), its sampler, the tokens so far,
// its rounds and the result being built. LosslessBatch (below) drives the rounds and batches
// every sequence's steps into one forward pass.
class LosslessSequence final : public LosslessOwner {
 public:
  LosslessSequence(const LlamaConfig& config, const GenerateRequest& request,
                   const LosslessOptions& options, TokenCallback on_token)
      : config_(config),
        request_(request),
        on_token_(std::move(on_token)),
        sampler_(request.sampling, config.eos_ids),
        history_(request.prompt_ids),
        round_(config, options) {}

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
  LosslessRound& round() { return round_; }

  BatchEntry PrefillEntry() const {
    BatchEntry entry;
    entry.tokens = request_.prompt_ids;
    return entry;
  }

  // The prompt's logits give the first token (unless max_tokens is 0).
  void AfterPrefill(absl::Span<float> logits) {
    done_ = Finished() || Emit(sampler_.Sample(logits, history_, 0));
  }

  // Starts a round: at most the tokens still wanted, within the context.
  void BeginRound(bool drafts) {
    const int pending_pos = static_cast<int>(history_.size()) - 1;
    round_.Begin(*this, std::min(request_.max_tokens - generated(),
                                 config_.max_seq_len - pending_pos),
                 drafts);
  }

  void AfterVerify(absl::Span<float> full_logits) { round_.Accept(*this, full_logits); }

  GenerateResult TakeResult(absl::Time start, absl::Time prefill_done) {
    result_.prefill_seconds = absl::ToDoubleSeconds(prefill_done - start);
    const LosslessCounts& counts = round_.counts();
    result_.draft_tokens = counts.draft_tokens;
    result_.accepted_tokens = counts.accepted_tokens;
    result_.verifications = counts.verifications;
    result_.verified_layers = counts.verified_layers;
    result_.draft_backbone_layers = counts.draft_backbone_layers;
    result_.plain_rounds = counts.plain_rounds;
    RecordDecodeTime(prefill_done, result_);
    return std::move(result_);
  }

  // LosslessOwner.
  const std::vector<int32_t>& history() const override { return history_; }
  int generated() const override { return static_cast<int>(result_.completion_ids.size()); }
  Sampler& sampler() override { return sampler_; }
  bool Ends(int32_t token) const override {
    return EndsSequence(config_, sampler_, token, request_.ignore_eos).has_value();
  }
  // Appends `token` as the next output unless it ends the sequence; whether the sequence is
  // done. The same end rules, in the same order, as Generate's loop.
  bool Emit(SampledToken sampled) override {
    const int32_t token = sampled.id;
    if (const auto end = EndsSequence(config_, sampler_, token, request_.ignore_eos)) {
      result_.finish_reason = *end;
      return done_ = true;
    }
    result_.completion_ids.push_back(token);
    history_.push_back(token);
    if (on_token_) on_token_(token);
    if (static_cast<int>(history_.size()) >= config_.max_seq_len) {
      result_.finish_reason = FinishReason::kContext;
      return done_ = true;
    }
    return done_ = Finished();
  }

 private:
  // max_tokens reached before anything else ended the sequence (also for max_tokens 0).
  bool Finished() {
    if (generated() < request_.max_tokens) return false;
    result_.finish_reason = FinishReason::kLength;
    return true;
  }

  const LlamaConfig& config_;
  const GenerateRequest& request_;
  TokenCallback on_token_;
  Sampler sampler_;
  std::vector<ContiguousKvCache> caches_;
  std::vector<int32_t> history_;
  LosslessRound round_;
  bool done_ = false;
  GenerateResult result_;
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
      const bool drafts = payoff_.NextRoundDrafts(options_.drafting);
      const absl::Time round_start = absl::Now();
      int64_t emitted = 0;  // tokens the round emits: generated after less before
      for (LosslessSequence* s : active) {
        s->BeginRound(drafts);
        emitted -= s->generated();
      }
      while (true) {
        std::vector<LosslessSequence*> drafting;
        entries.clear();
        for (LosslessSequence* s : active) {
          if (!s->round().drafting()) continue;
          drafting.push_back(s);
          entries.push_back(s->round().DraftEntry());
        }
        if (drafting.empty()) break;
        ESTUARY_RETURN_IF_ERROR(Step(drafting, entries, /*use_river=*/true, drafting.size()));
        for (size_t i = 0; i < drafting.size(); ++i) {
          drafting[i]->round().AfterDraft(*drafting[i], Row(i), outcomes_[i]);
        }
      }
      entries.clear();
      std::vector<LosslessSequence*> owners;  // of each entry: a sequence has one or two
      size_t rows = 0;
      for (LosslessSequence* s : active) {
        for (const BatchEntry& entry : s->round().VerifyEntries(*s)) {
          entries.push_back(entry);
          owners.push_back(s);
        }
        rows += static_cast<size_t>(s->round().verify_rows());
      }
      ESTUARY_RETURN_IF_ERROR(Step(owners, entries, /*use_river=*/false, rows));
      const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
      size_t row = 0;
      for (LosslessSequence* s : active) {
        const size_t n = static_cast<size_t>(s->round().verify_rows());
        s->AfterVerify(absl::MakeSpan(logits_).subspan(row * vocab, n * vocab));
        row += n;
        emitted += s->generated();
      }
      payoff_.Record(options_.drafting, drafts, absl::Now() - round_start, emitted);
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
  DraftPayoff payoff_;  // the rounds' timings, for Drafting::kAuto
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
