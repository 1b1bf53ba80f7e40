#pragma once
// EvalExit: fidelity and cost of the exit river at several thresholds (`estuary eval-exit`).
//
// For each prompt: the full-depth greedy continuation, then the same tokens teacher-forced
// through the river at each τ and through "full int4" (every layer on the river). The prompt
// itself is prefilled on the full backbone in every mode (as the decode worker does), so the
// rows differ only in the decode steps, which are what is measured: the continuation's
// positions after the first token.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/exit_policy.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/model/self_speculative.h"
#include "core/tokenizer/tokenizer.h"

namespace estuary {

struct EvalExitOptions {
  std::vector<float> taus;           // thresholds to evaluate
  std::vector<std::string> prompts;  // texts, encoded with BOS
  int max_tokens = 64;               // length of each full-depth continuation
  ExitPolicy policy;                 // rule and layer bounds; the threshold comes from `taus`
  // With a value: a lossless row per τ as well (GenerateLossless with drafts at that τ, greedy,
  // the same max_tokens), the draft settings taken from here (its policy is replaced).
  std::optional<LosslessOptions> lossless;
};

struct EvalExitRow {
  std::string tau;              // the threshold, or "full-int4"
  double mean_backbone_layers = 0;
  double exit_rate = 0;         // share of tokens that left before the last layer
  double top1_agreement = 0;    // argmax equal to the full model's
  double nll_delta = 0;         // mean NLL under the river minus under the full model
  double kv_cosine_min = 1;     // lowest over layers (K and V) of the mean river/backbone cosine
  double modeled_bytes_ratio = 0;  // weight bytes read per token against full depth
  double measured_speedup = 0;  // decode tokens/s against full depth (batch 1, same run)
  int64_t tokens = 0;           // positions evaluated
  // Lossless rows (mode "lossless"; mean_backbone_layers is the drafts' mean exit, and
  // measured_speedup compares GenerateLossless's decode time with full-depth Generate's):
  std::string mode = "lossy";
  double acceptance = 0;               // drafts accepted per draft
  double tokens_per_verification = 0;  // tokens emitted per verification pass
  // Weight bytes read per emitted token (drafts plus verification passes) against full depth's.
  double cost_per_token = 0;
  double exact_match = 0;  // share of the full model's continuation tokens reproduced in place
};

absl::StatusOr<std::vector<EvalExitRow>> RunEvalExit(const LlamaModel& model,
                                                     const Tokenizer& tokenizer,
                                                     const River& river,
                                                     const EvalExitOptions& options);

// One JSON object {"rows": [...]} (the `--json` output) and a text table.
std::string EvalExitJson(const std::vector<EvalExitRow>& rows);
std::string EvalExitTable(const std::vector<EvalExitRow>& rows);

}  // namespace estuary
