#pragma once
// ExitPolicy: when tokens leave the bf16 backbone for the int4 exit river (design §5,
// river-llm.md §1.5 and §4). After backbone layer l (l + 1 layers run), a token's state
// transition similarity s = cos(h_in, h_out) across that layer is compared with its request's
// threshold τ:
//   kBatchMin: the whole batch exits when min_b (s_b − τ_b) > 0 (the paper's rule, per-request τ);
//   kSplit:    each sequence exits on its own when s_b − τ_b > 0 (the batch runs both kernels).
//   kAllPassed: a sequence's pass (s_b − τ_b > 0 after some layer) is remembered for the step,
//              and the whole batch exits once every sequence still on the backbone has passed
//              (issue 18's exit-aware batching). On a memory-bound step a backbone layer costs
//              the same for 1 or 16 rows, so a sequence that passed rides the backbone for free
//              while another still needs it, and the batch leaves as soon as the last one
//              passes: never later than kBatchMin (which needs every pass at the same layer),
//              and without kSplit's extra int4 read of every layer both groups run.
// Exit is absorbing within a step. τ above 1 never exits (s <= 1), which reproduces the plain model.
// At batch 1 the three rules are the same.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace estuary {

enum class ExitRule : uint8_t { kBatchMin, kSplit, kAllPassed };
// "batch_min", "split" or "all_passed".
absl::StatusOr<ExitRule> ParseExitRule(const std::string& name);
const char* ExitRuleName(ExitRule rule);

struct ExitPolicy {
  ExitRule rule = ExitRule::kBatchMin;
  float default_threshold = 0.9f;  // τ for requests that set none
  int min_backbone_layers = 1;     // exit is considered only after this many backbone layers
  int max_backbone_layers = -1;    // forced exit after this many; -1 = none, 0 = all on the
                                   // river ("full int4", an evaluation baseline)
  int resident_backbone_layers = 0;  // backbone layers >= this are never loaded; 0 = all

  // Backbone layers after which every token is forced onto the river (n_layers when none).
  int ForcedExitAfter(int n_layers) const;
  // Validates against a model of `n_layers`; INVALID_ARGUMENT names the flag.
  absl::Status Validate(int n_layers) const;
};

}  // namespace estuary
