#pragma once
// The exit mode's flags (issue 16), for the commands that decode losslessly through the river:
//
//   --exit-mode M             lossy (the default: a token that exits finishes on the int4
//                             river) or lossless (the river drafts, the backbone verifies: the
//                             full model's output; needs --river)
//   --draft-tokens K          lossless: drafts per verification at most
//   --min-draft-confidence P  lossless: drafting stops after a draft the river gives less
//                             probability than P (0: never)
//   --draft-backbone-layers N lossless: backbone layers a draft runs at most (0, the default:
//                             wholly on the river; -1: no cap, τ decides); generate refuses
//                             --exit-threshold with lossless drafts capped at 0
//   --drafting D              lossless: auto (the default: draft while it measures cheaper per
//                             token than plain full-depth rounds), always or never

#include <optional>

#include "absl/status/statusor.h"
#include "core/model/exit_policy.h"
#include "core/model/self_speculative.h"

namespace estuary::cli {

// nullopt for --exit-mode lossy (INVALID_ARGUMENT when a lossless-only flag is set then), the
// lossless options over `policy` otherwise (INVALID_ARGUMENT without --river, or for an unknown
// mode). Bounds that need the model are checked by LosslessOptions::Validate.
absl::StatusOr<std::optional<LosslessOptions>> LosslessOptionsFromFlags(bool river,
                                                                        const ExitPolicy& policy);

// The decode worker's reading: --exit-mode is the mode of requests that name none, and the
// draft flags apply to every lossless request (so they are accepted with either mode), all of
// it only with --river (INVALID_ARGUMENT otherwise, and for an unknown mode).
struct WorkerExitMode {
  bool default_lossless = false;
  LosslessOptions lossless;  // its policy is the engine's (DecodeEngineOptions::lossless)
};
absl::StatusOr<WorkerExitMode> WorkerExitModeFromFlags(bool river);

}  // namespace estuary::cli
