#pragma once
// The exit river's flags, defined once for every binary that runs the river: the `estuary`
// command (generate, eval-exit, bench-decode, up's pass-through) and the decode worker
// (estuary-decode). Each binary lists them in its flag table (cli/command_tables.cc).
//
//   --river-group-size N     int4 group size of the river's copy of the layers
//   --river-refine           HQQ-style refinement of its scales and zero points
//   --river-lm-head H        shared (the backbone's LM head) or int4 (the river's own copy)
//   --exit-rule R            batch_min (the paper's: the batch leaves together) or split
//   --exit-threshold T       default τ (a request may set its own); above 1 disables exit
//   --min-backbone-layers N  exit is considered only after this many layers
//   --max-backbone-layers N  forced exit after this many layers (-1: none)
//   --int4-kernel K          auto, vnni (int8 activations, AVX512-VNNI), avx2 (int8
//                            activations, AVX2) or highway (int16 activations, any CPU): the
//                            river's int4 matmul, process-wide

#include "absl/status/statusor.h"
#include "cli/river_options.h"

namespace estuary::cli {

// The flags above, validated (rule name, group size, kernel; layer bounds need the model: see
// ExitPolicy::Validate, run where the model is known). Selects the int4 kernel (the one
// process-wide setting, SetInt4MatMulPath) as a side effect: call it once, before any matmul.
absl::StatusOr<RiverOptions> RiverOptionsFromFlags();

// INVALID_ARGUMENT naming the first of the flags above set to other than its default, for a
// binary run without its river (`--river` absent): they would do nothing there.
absl::Status RefuseRiverFlagsWithoutRiver();

}  // namespace estuary::cli
