#include "core/model/exit_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace estuary {

absl::StatusOr<ExitRule> ParseExitRule(const std::string& name) {
  if (name == "batch_min") return ExitRule::kBatchMin;
  if (name == "split") return ExitRule::kSplit;
  if (name == "all_passed") return ExitRule::kAllPassed;
  return absl::InvalidArgumentError(
      absl::StrCat("exit rule '", name, "': use batch_min, split or all_passed"));
}

const char* ExitRuleName(ExitRule rule) {
  switch (rule) {
    case ExitRule::kSplit:
      return "split";
    case ExitRule::kAllPassed:
      return "all_passed";
    case ExitRule::kBatchMin:
      break;
  }
  return "batch_min";
}

int ExitPolicy::ForcedExitAfter(int n_layers) const {
  int limit = n_layers;
  if (max_backbone_layers >= 0) limit = std::min(limit, max_backbone_layers);
  if (resident_backbone_layers > 0) limit = std::min(limit, resident_backbone_layers);
  return limit;
}

absl::Status ExitPolicy::Validate(int n_layers) const {
  if (min_backbone_layers < 0 || min_backbone_layers > n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--min-backbone-layers = ", min_backbone_layers,
                                                   " must be in [0, ", n_layers, "]"));
  }
  if (max_backbone_layers < -1 || max_backbone_layers > n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--max-backbone-layers = ", max_backbone_layers,
                                                   " must be -1 (none) or in [0, ", n_layers,
                                                   "]"));
  }
  if (resident_backbone_layers < 0 || resident_backbone_layers > n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--resident-backbone-layers = ",
                                                   resident_backbone_layers, " must be in [0, ",
                                                   n_layers, "]"));
  }
  if (max_backbone_layers >= 0 && max_backbone_layers < min_backbone_layers) {
    return absl::InvalidArgumentError("--max-backbone-layers is below --min-backbone-layers");
  }
  if (!(default_threshold >= -1.0f && default_threshold <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("--exit-threshold = ", default_threshold,
                                                   " must be in [-1, 2] (above 1 disables exit)"));
  }
  return absl::OkStatus();
}

}  // namespace estuary
