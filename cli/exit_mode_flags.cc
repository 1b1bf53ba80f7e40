#include "cli/exit_mode_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, exit_mode, "lossy",
          "lossy (a token that exits finishes on the int4 river) or lossless (the river drafts, "
          "the backbone verifies: the full model's output; needs --river)");
ABSL_FLAG(int, draft_tokens, 4, "lossless: tokens the river drafts per verification, at most");
ABSL_FLAG(double, min_draft_confidence, 0.2,
          "lossless: drafting stops after a draft the river gives less probability (0: never)");

namespace estuary::cli {

absl::StatusOr<std::optional<LosslessOptions>> LosslessOptionsFromFlags(bool river,
                                                                        const ExitPolicy& policy) {
  const std::string mode = absl::GetFlag(FLAGS_exit_mode);
  if (mode == "lossy") {
    for (const char* name : {"draft_tokens", "min_draft_confidence"}) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", name == std::string("draft_tokens") ? "draft-tokens" : "min-draft-confidence",
            " applies to --exit-mode lossless"));
      }
    }
    return std::nullopt;
  }
  if (mode != "lossless") {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit-mode=", mode, ": use lossy or lossless"));
  }
  if (!river) {
    return absl::InvalidArgumentError("--exit-mode lossless drafts on the exit river: add --river");
  }
  LosslessOptions options;
  options.policy = policy;
  options.max_draft_tokens = absl::GetFlag(FLAGS_draft_tokens);
  options.min_draft_confidence = static_cast<float>(absl::GetFlag(FLAGS_min_draft_confidence));
  return options;
}

}  // namespace estuary::cli
