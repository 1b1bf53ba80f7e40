#pragma once
// Per-group building blocks of Int4Matrix::Quantize (internal to core/quant).
//
// A group is n consecutive f32 weights of one row, quantized as w ≈ q * s + m with q in 0..15.
// quantize_rtn.cc: min/max round to nearest, the f16 rounding of (s, m) and the code assignment.
// quantize_hqq.cc: the HQQ-style refinement of (s, m), SIMD across groups.
// All functions are pure and thread-safe (scratch is thread_local).

#include <cstdint>

namespace estuary::quant_internal {

// Scale and offset of one group in weight units (f32, before the f16 rounding).
struct GroupParams {
  float scale = 0.0f;
  float offset = 0.0f;
};

// RTN: s = (max - min) / 15, m = min. A constant group gets s = 0.
GroupParams RtnParams(const float* w, int n);

// Stored f16 bits of a group's (s, m), both divided by the matrix's power-of-two multiplier.
struct StoredParams {
  uint16_t scale = 0;
  uint16_t offset = 0;
};

// RTN storage: m rounded down and s rounded up to f16 so that [m, m + 15 s] still covers
// [min, max] of the group; then every weight is within s/2 of its code.
StoredParams StoreRtn(GroupParams rtn, float inv_multiplier);
// Refined storage: (s, m) rounded to the nearest f16 (s kept >= 0).
StoredParams StoreNearest(GroupParams params, float inv_multiplier);
// The (s, m) a stored pair means, in weight units: f16 value * multiplier.
GroupParams Load(StoredParams stored, float multiplier);

// Nearest code in 0..15 for each weight under (s, m) (all zero when s == 0); writes q[0..n) and
// returns Σ (w - (q s + m))² with ŵ computed exactly as Int4Matrix::Dequantize does.
double AssignCodes(const float* w, int n, GroupParams params, uint8_t* q);

// HQQ-style refinement (quantize_hqq.cc). See RefineGroups.
struct RefineConfig {
  int iterations = 20;   // half-quadratic iterations
  float lp_norm = 0.7f;  // p of the sparsity-promoting error norm
  float beta = 10.0f;    // initial penalty weight
  float kappa = 1.01f;   // beta growth per iteration
  int search_steps = 2;  // range-shrink restarts: 3 per step (both ends, low end, high end)
  int ls_iterations = 2; // least-squares alternations per restart
};

// Refines `count` groups of exactly `n` weights each; group j starts at groups[j]. `params[j]`
// holds the RTN start on entry and the refined (s, m) on return (never a higher squared error
// than the start, in f32 before storage rounding). Groups with s == 0 are left alone.
// Runtime-dispatched (Highway); lanes of a SIMD vector are different groups.
void RefineGroups(const float* const* groups, int64_t count, int n, const RefineConfig& config,
                  GroupParams* params);

}  // namespace estuary::quant_internal
