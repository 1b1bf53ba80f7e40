#include "cli/river_flags.h"

#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/common/status_macros.h"
#include "core/quant/int4_matmul.h"

ABSL_FLAG(int, river_group_size, 64, "int4 group size of the exit river");
ABSL_FLAG(std::string, river_lm_head, "shared",
          "the LM head of tokens that left the backbone: shared (the backbone's) or int4 (an int4 "
          "copy, quantized as the layers; CPU only)");
ABSL_FLAG(bool, river_refine, true, "refine the river's int4 scale and zero point (HQQ-style)");
ABSL_FLAG(std::string, exit_rule, "batch_min",
          "batch_min (the paper's: the batch leaves when all pass at once), split (each on its "
          "own) or all_passed (the batch leaves once each has passed at some layer)");
ABSL_FLAG(double, exit_threshold, 0.9, "default exit threshold τ; above 1 disables exit");
ABSL_FLAG(int, min_backbone_layers, 1, "exit is considered only after this many layers");
ABSL_FLAG(int, max_backbone_layers, -1, "forced exit after this many layers; -1 = none");
ABSL_FLAG(std::string, int4_kernel, "auto",
          "the river's int4 matmul: auto, vnni (int8 activations; CPUs with AVX512-VNNI), avx2 "
          "(int8 activations; CPUs with AVX2) or highway (int16 activations)");

namespace estuary::cli {
namespace {

absl::StatusOr<RiverLmHead> RiverLmHeadFlag() {
  const std::string name = absl::GetFlag(FLAGS_river_lm_head);
  if (name == "shared") return RiverLmHead::kShared;
  if (name == "int4") return RiverLmHead::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("--river-lm-head=", name, ": use shared or int4"));
}

absl::StatusOr<Int4Path> Int4KernelFlag() {
  const std::string name = absl::GetFlag(FLAGS_int4_kernel);
  const std::optional<Int4Path> path = Int4PathFromName(name);
  if (!path.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--int4-kernel=", name, ": use auto, vnni, avx2 or highway"));
  }
  if (*path == Int4Path::kVnni && !Int4VnniAvailable()) {
    return absl::FailedPreconditionError("--int4-kernel=vnni: this CPU has no AVX512-VNNI");
  }
  if (*path == Int4Path::kAvx2 && !Int4Avx2Available()) {
    return absl::FailedPreconditionError("--int4-kernel=avx2: this CPU has no AVX2 + FMA + F16C");
  }
  return *path;
}

}  // namespace

absl::StatusOr<RiverOptions> RiverOptionsFromFlags() {
  RiverOptions river;
  river.quant.group_size = absl::GetFlag(FLAGS_river_group_size);
  river.quant.refine = absl::GetFlag(FLAGS_river_refine);
  ESTUARY_RETURN_IF_ERROR(river.quant.Validate());
  ESTUARY_ASSIGN_OR_RETURN(river.lm_head, RiverLmHeadFlag());
  ESTUARY_ASSIGN_OR_RETURN(const Int4Path kernel, Int4KernelFlag());
  SetInt4MatMulPath(kernel);
  ESTUARY_ASSIGN_OR_RETURN(river.policy.rule, ParseExitRule(absl::GetFlag(FLAGS_exit_rule)));
  river.policy.default_threshold = static_cast<float>(absl::GetFlag(FLAGS_exit_threshold));
  river.policy.min_backbone_layers = absl::GetFlag(FLAGS_min_backbone_layers);
  river.policy.max_backbone_layers = absl::GetFlag(FLAGS_max_backbone_layers);
  return river;
}

absl::Status RefuseRiverFlagsWithoutRiver() {
  for (const char* name : {"river_group_size", "river_refine", "river_lm_head", "exit_rule",
                           "exit_threshold", "min_backbone_layers", "max_backbone_layers",
                           "int4_kernel"}) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}),
                       " applies to the exit river: add --river, or drop it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace estuary::cli
