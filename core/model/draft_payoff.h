#pragma once
// DraftPayoff: whether the lossless mode's drafts pay on this machine, model and batch (issue
// 16). A round of drafts and its verification emits several tokens for its cost; a plain round
// (the pending token through every backbone layer, no drafts) emits one, and is just as exact.
// Where the weights sit in cache, or batches are large, the drafts cost more than they save
// (README "Lossless mode": stories12L's lossless rounds run at 0.55-0.61x of full depth). The
// owner of the rounds (LosslessBatch, the decode engine) times each round and records it here;
// DraftPayoff keeps a running seconds-per-token estimate for each kind, runs the cheaper one and
// measures the other again every kProbeEvery tokens for kProbeRounds rounds, so that a change
// (another batch size, another load on the machine) is seen. Not thread-safe: one owner.

#include <cstdint>

#include "absl/time/time.h"

namespace estuary {

// Which lossless rounds draft (LosslessOptions::drafting). kAlways: every one. kAuto: while
// drafting measures cheaper per token than plain rounds (DraftPayoff). kNever: plain rounds only
// (full-depth decoding, the baseline kAuto compares with).
enum class Drafting : uint8_t { kAlways, kAuto, kNever };

class DraftPayoff {
 public:
  // Rounds of each kind measured before the first choice, and again at each probe.
  static constexpr int kProbeRounds = 3;
  // Tokens emitted by the chosen kind between probes of the other.
  static constexpr int64_t kProbeEvery = 256;
  // Weight of a new round's seconds per token in the running estimate.
  static constexpr double kNewWeight = 0.25;

  // Whether the next round drafts.
  bool NextRoundDrafts();
  // A round of that kind took `elapsed` and emitted `tokens` (rounds that emitted none are
  // ignored).
  void Record(bool drafted, absl::Duration elapsed, int64_t tokens);
  // The same under `drafting`: kAlways and kNever decide alone and record nothing.
  bool NextRoundDrafts(Drafting drafting);
  void Record(Drafting drafting, bool drafted, absl::Duration elapsed, int64_t tokens);

  // Seconds per emitted token of each kind so far; negative until measured.
  double seconds_per_token(bool drafted) const { return estimate_[drafted ? 1 : 0]; }

 private:
  double estimate_[2] = {-1.0, -1.0};  // [plain, drafted]
  int measured_rounds_[2] = {0, 0};
  bool probe_drafts_ = false;  // the kind a probe runs (the one that was not the best)
  int probe_rounds_left_ = 0;
  int64_t tokens_since_probe_ = 0;
};

}  // namespace estuary
