#include "cli/exit_mode_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/common/status_macros.h"

ABSL_FLAG(std::string, exit_mode, "lossy",
          "lossy (a token that exits finishes on the int4 river) or lossless (the river drafts, "
          "the backbone verifies: the full model's output; needs --river)");
ABSL_FLAG(int, draft_tokens, 4, "lossless: tokens the river drafts per verification, at most");
ABSL_FLAG(double, min_draft_confidence, 0.2,
          "lossless: drafting stops after a draft the river gives less probability (0: never)");
ABSL_FLAG(int, draft_backbone_layers, 0,
          "lossless: backbone layers a draft runs at most before the int4 river (τ may take it "
          "off earlier); 0 = the whole draft on the river (the cheapest), -1 = no cap. The "
          "output is the full model's whatever the depth: it trades a draft's cost for its "
          "acceptance");
ABSL_FLAG(std::string, drafting, "auto",
          "lossless: auto (rounds draft while drafting measures cheaper per token than plain "
          "full-depth rounds, both timed as they run and the other kind probed every 256 "
          "tokens), always, or never (plain full-depth rounds only)");

namespace estuary::cli {

namespace {

// The first lossless-only flag set on the command line, as the user spells it; empty if none.
std::string SetDraftFlag() {
  for (const char* name :
       {"draft_tokens", "min_draft_confidence", "draft_backbone_layers", "drafting"}) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
      return absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}));
    }
  }
  return "";
}

absl::StatusOr<LosslessOptions::Drafting> DraftingFlag() {
  const std::string name = absl::GetFlag(FLAGS_drafting);
  if (name == "auto") return LosslessOptions::Drafting::kAuto;
  if (name == "always") return LosslessOptions::Drafting::kAlways;
  if (name == "never") return LosslessOptions::Drafting::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("--drafting=", name, ": use auto, always or never"));
}

// Whether --exit-mode says lossless; INVALID_ARGUMENT for an unknown mode.
absl::StatusOr<bool> LosslessMode() {
  const std::string mode = absl::GetFlag(FLAGS_exit_mode);
  if (mode == "lossy") return false;
  if (mode == "lossless") return true;
  return absl::InvalidArgumentError(absl::StrCat("--exit-mode=", mode, ": use lossy or lossless"));
}

}  // namespace

absl::StatusOr<std::optional<LosslessOptions>> LosslessOptionsFromFlags(bool river,
                                                                        const ExitPolicy& policy) {
  ESTUARY_ASSIGN_OR_RETURN(const bool lossless, LosslessMode());
  if (!lossless) {
    if (const std::string flag = SetDraftFlag(); !flag.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " applies to --exit-mode lossless"));
    }
    return std::nullopt;
  }
  if (!river) {
    return absl::InvalidArgumentError("--exit-mode lossless drafts on the exit river: add --river");
  }
  LosslessOptions options;
  options.policy = policy;
  options.max_draft_tokens = absl::GetFlag(FLAGS_draft_tokens);
  options.min_draft_confidence = static_cast<float>(absl::GetFlag(FLAGS_min_draft_confidence));
  options.draft_backbone_layers = absl::GetFlag(FLAGS_draft_backbone_layers);
  ESTUARY_ASSIGN_OR_RETURN(options.drafting, DraftingFlag());
  return options;
}

absl::StatusOr<WorkerExitMode> WorkerExitModeFromFlags(bool river) {
  WorkerExitMode out;
  ESTUARY_ASSIGN_OR_RETURN(out.default_lossless, LosslessMode());
  if (!river && out.default_lossless) {
    return absl::InvalidArgumentError("--exit-mode lossless drafts on the exit river: add --river");
  }
  if (const std::string flag = SetDraftFlag(); !river && !flag.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " applies to lossless requests, which need --river"));
  }
  out.lossless.max_draft_tokens = absl::GetFlag(FLAGS_draft_tokens);
  out.lossless.min_draft_confidence = static_cast<float>(absl::GetFlag(FLAGS_min_draft_confidence));
  out.lossless.draft_backbone_layers = absl::GetFlag(FLAGS_draft_backbone_layers);
  ESTUARY_ASSIGN_OR_RETURN(out.lossless.drafting, DraftingFlag());
  return out;
}

}  // namespace estuary::cli
