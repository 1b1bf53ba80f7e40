#include "core/model/draft_payoff.h"

namespace estuary {

bool DraftPayoff::NextRoundDrafts() {
  // Both kinds measured first: the drafts, then plain rounds.
  if (measured_rounds_[1] < kProbeRounds) return true;
  if (measured_rounds_[0] < kProbeRounds) return false;
  if (probe_rounds_left_ > 0) return probe_drafts_;
  const bool best = estimate_[1] <= estimate_[0];
  if (tokens_since_probe_ >= kProbeEvery) {
    probe_drafts_ = !best;
    probe_rounds_left_ = kProbeRounds;
    tokens_since_probe_ = 0;
    return probe_drafts_;
  }
  return best;
}

bool DraftPayoff::NextRoundDrafts(Drafting drafting) {
  switch (drafting) {
    case Drafting::kAlways:
      return true;
    case Drafting::kNever:
      return false;
    case Drafting::kAuto:
      break;
  }
  return NextRoundDrafts();
}

void DraftPayoff::Record(Drafting drafting, bool drafted, absl::Duration elapsed,
                         int64_t tokens) {
  if (drafting == Drafting::kAuto) Record(drafted, elapsed, tokens);
}

void DraftPayoff::Record(bool drafted, absl::Duration elapsed, int64_t tokens) {
  if (tokens <= 0) return;
  const int kind = drafted ? 1 : 0;
  const double seconds = absl::ToDoubleSeconds(elapsed) / static_cast<double>(tokens);
  double& estimate = estimate_[kind];
  estimate = estimate < 0.0 ? seconds : estimate + kNewWeight * (seconds - estimate);
  ++measured_rounds_[kind];
  if (probe_rounds_left_ > 0 && drafted == probe_drafts_) {
    --probe_rounds_left_;
  } else {
    tokens_since_probe_ += tokens;
  }
}

}  // namespace estuary
