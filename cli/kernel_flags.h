#pragma once
// CPU kernel choices that change numerics, as flags, defined once for every binary that runs a
// model on CPU ranks: `estuary` (generate, eval-exit, bench-decode, bench-prefill; up passes it
// to its workers) and the workers (estuary-prefill, estuary-decode).
//
//   --bf16-kernel fma|dot   bf16 weights at 2+ tokens (decode batches, prefill): fma (default)
//                           multiplies in f32; dot rounds activations to bf16 and uses the
//                           AVX512-BF16 dot products (faster prefill, greedy tokens may change;
//                           core/kernels/cpu/kernels.h, Bf16BatchPath)
//
// (The exit river's int4 kernel is --int4-kernel, with the river's flags: cli/river_flags.h.)

#include "absl/status/status.h"

namespace estuary::cli {

// Sets the process-wide kernel choices from the flags above; INVALID_ARGUMENT for an unknown
// value, FAILED_PRECONDITION for `dot` on a CPU without AVX512-BF16. Call once, before any
// model runs.
absl::Status ApplyKernelFlags();

}  // namespace estuary::cli
