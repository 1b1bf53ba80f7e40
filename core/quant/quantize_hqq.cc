// HQQ-style refinement of int4 group parameters (scale s, offset m; w ≈ q * s + m).
//
// Half-Quadratic Quantization (Badri & Shaji, 2023) fits the zero point against a sparse
// "outlier" residual W_e, minimizing ||W - Ŵ||_p^p with p < 1 by alternating:
//   q   = clamp(round((W - m) / s), 0, 15)                  (quantize)
//   W_e = shrink_lp(W - (q s + m), beta)                    (proximal step of the lp term:
//         sign(r) * max(|r| - |r|^(p-1) / beta, 0))
//   zero = mean(q - (W - W_e) / s)    i.e.  m = mean(W - W_e - q s)
//   beta *= kappa
// with HQQ's defaults p = 0.7, beta = 10, kappa = 1.01, 20 iterations (errors in weight units,
// as in HQQ). We also update the scale: (s, m) is the least-squares fit of W - W_e on q (HQQ's
// zero update is the same fit with s held fixed). Every iterate's squared error is measured and
// the best one is kept (HQQ keeps the best by mean |error|).
// Then a small search that HQQ does not have: restarts from the HQQ result and from the min/max
// range trimmed by 2% and 4% of its width (at both ends, the low end only, the high end only),
// each followed by `ls_iterations` least-squares alternations (the p = 2 case of the same
// iteration, W_e = 0).
// At g64 the HQQ iterations alone reach ~0.88 of RTN's squared error on Gaussian weights; with
// the search, the result is ~0.815 of RTN on Gaussian weights, on the synthetic checkpoints'
// sum-of-uniforms weights and on the trained stories260K / stories12L matrices alike (quant_test
// and int4_benchmark print the figures). That is close to the best any (s, m) per group can do
// here: a dense search over trimmed ranges only reaches ~0.81.
//
// SIMD layout: lanes are groups. A batch of N groups of equal length n is transposed into
// wt[i * N + lane]; every reduction over a group is then a plain vector accumulation.
// |r|^(p-1) uses an exponent-bit approximation (within ~6%), which only moves the shrinkage
// threshold slightly.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/quant/quantize_hqq.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_QUANT_QUANTIZE_HQQ_ONCE
#define ESTUARY_CORE_QUANT_QUANTIZE_HQQ_ONCE
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/quant/quantize_internal.h"
#endif

#include "core/kernels/cpu/simd_helpers-inl.h"

HWY_BEFORE_NAMESPACE();
namespace estuary::quant_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace simd = estuary::simd::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using MF = hn::Mask<DF>;

// Tag of the per-thread scratch for one transposed batch (simd::ScratchFloats).
struct HqqBatchScratch {};

// a^e for a > 0 from the bit pattern: bits(a) - bits(1) ≈ 2^23 log2(a).
HWY_INLINE VF FastPow(VF a, float e) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const auto one_bits = hn::Set(di, 0x3F800000);
  const VF log2_scaled = hn::ConvertTo(df, hn::Sub(hn::BitCast(di, a), one_bits));
  return hn::BitCast(df, hn::Add(hn::ConvertTo(di, hn::Mul(log2_scaled, hn::Set(df, e))),
                                 one_bits));
}

// Result of one pass over a batch under (s, m).
struct PassResult {
  VF err;    // Σ (w - (q s + m))² per lane
  VF fit_s;  // least-squares (s, m) of the targets on q
  VF fit_m;
  MF fit_ok;  // the fit is usable (non-degenerate, s > 0, finite)
};

// One pass over wt[i * N + lane], i < n. Targets are w - W_e (kShrink) or w.
template <bool kShrink>
HWY_INLINE PassResult Pass(const float* HWY_RESTRICT wt, size_t n, VF s, VF m, VF inv_beta,
                           float p_minus_1) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const VF zero = hn::Zero(df);
  const VF fifteen = hn::Set(df, 15.0f);
  const VF tiny = hn::Set(df, 1e-8f);
  const VF inv = hn::IfThenElseZero(hn::Gt(s, zero), hn::Div(hn::Set(df, 1.0f), s));
  VF sq = zero, sqq = zero, sy = zero, sqy = zero, err = zero;
  for (size_t i = 0; i < n; ++i) {
    const VF w = hn::Load(df, wt + i * lanes);
    const VF q = hn::Round(hn::Min(hn::Max(hn::Mul(hn::Sub(w, m), inv), zero), fifteen));
    const VF r = hn::Sub(w, hn::MulAdd(q, s, m));
    err = hn::MulAdd(r, r, err);
    VF y = w;
    if constexpr (kShrink) {
      const VF a = hn::Abs(r);
      const VF t = hn::NegMulAdd(inv_beta, FastPow(hn::Add(a, tiny), p_minus_1), a);
      y = hn::Sub(w, hn::CopySignToAbs(hn::Max(t, zero), r));
    }
    sq = hn::Add(sq, q);
    sqq = hn::MulAdd(q, q, sqq);
    sy = hn::Add(sy, y);
    sqy = hn::MulAdd(q, y, sqy);
  }
  const VF nf = hn::Set(df, static_cast<float>(n));
  const VF den = hn::MulSub(nf, sqq, hn::Mul(sq, sq));
  PassResult out;
  out.err = err;
  out.fit_s = hn::Div(hn::MulSub(nf, sqy, hn::Mul(sq, sy)), den);
  out.fit_m = hn::Div(hn::NegMulAdd(out.fit_s, sq, sy), nf);
  out.fit_ok = hn::And(hn::And(hn::Gt(den, zero), hn::Gt(out.fit_s, zero)),
                       hn::And(hn::IsFinite(out.fit_s), hn::IsFinite(out.fit_m)));
  return out;
}

// Best (s, m) so far per lane, by squared error.
struct Best {
  VF s, m, err;
  void Offer(VF cand_s, VF cand_m, VF cand_err, MF active) {
    const MF better = hn::And(active, hn::Lt(cand_err, err));
    s = hn::IfThenElse(better, cand_s, s);
    m = hn::IfThenElse(better, cand_m, m);
    err = hn::IfThenElse(better, cand_err, err);
  }
};

// `ls_iterations` least-squares alternations from (s, m), offering every iterate to `best`.
HWY_INLINE void LeastSquares(const float* HWY_RESTRICT wt, size_t n, VF s, VF m, int iterations,
                             MF active, Best& best) {
  const DF df;
  for (int it = 0; it <= iterations; ++it) {
    const PassResult p = Pass<false>(wt, n, s, m, hn::Zero(df), 0.0f);
    best.Offer(s, m, p.err, active);
    if (it == iterations) break;
    s = hn::IfThenElse(p.fit_ok, p.fit_s, s);
    m = hn::IfThenElse(p.fit_ok, p.fit_m, m);
  }
}

// One batch of Lanes() groups; s_io / m_io: RTN start in, best out (lanes with s <= 0 untouched).
void RefineBatch(const float* HWY_RESTRICT wt, size_t n, float* HWY_RESTRICT s_io,
                 float* HWY_RESTRICT m_io, const RefineConfig& config) {
  const DF df;
  const VF zero = hn::Zero(df);
  const VF s0 = hn::LoadU(df, s_io);
  const VF m0 = hn::LoadU(df, m_io);
  const MF active = hn::Gt(s0, zero);
  if (hn::AllFalse(df, active)) return;
  Best best{s0, m0, hn::Set(df, std::numeric_limits<float>::infinity())};

  // HQQ iterations.
  VF s = s0, m = m0;
  float beta = config.beta;
  int stale = 0;
  for (int it = 0; it <= config.iterations; ++it) {
    const PassResult p = Pass<true>(wt, n, s, m, hn::Set(df, 1.0f / beta), config.lp_norm - 1.0f);
    const VF before = best.err;
    best.Offer(s, m, p.err, active);
    if (it == config.iterations) break;
    // Stop when no lane has improved for 3 iterations.
    stale = hn::AllFalse(df, hn::Lt(best.err, before)) ? stale + 1 : 0;
    if (stale >= 3) break;
    s = hn::IfThenElse(p.fit_ok, p.fit_s, s);
    m = hn::IfThenElse(p.fit_ok, p.fit_m, m);
    beta *= config.kappa;
  }
  // Least-squares polish of the HQQ result, then restarts from trimmed ranges.
  LeastSquares(wt, n, best.s, best.m, config.ls_iterations, active, best);
  const VF range = hn::Mul(s0, hn::Set(df, 15.0f));
  const VF hi0 = hn::Add(m0, range);
  const VF inv15 = hn::Set(df, 1.0f / 15.0f);
  for (int step = 1; step <= config.search_steps; ++step) {
    const VF trim = hn::Mul(range, hn::Set(df, 0.02f * static_cast<float>(step)));
    for (int side = 0; side < 3; ++side) {
      const VF lo = side != 2 ? hn::Add(m0, trim) : m0;
      const VF hi = side != 1 ? hn::Sub(hi0, trim) : hi0;
      LeastSquares(wt, n, hn::Mul(hn::Sub(hi, lo), inv15), lo, config.ls_iterations, active,
                   best);
    }
  }
  hn::StoreU(best.s, df, s_io);
  hn::StoreU(best.m, df, m_io);
}

void RefineGroupsImpl(const float* const* groups, int64_t count, int n,
                      const RefineConfig& config, GroupParams* params) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const size_t len = static_cast<size_t>(n);
  float* wt = simd::ScratchFloats<HqqBatchScratch>(len * lanes + 2 * lanes);
  float* s_io = wt + len * lanes;
  float* m_io = s_io + lanes;
  for (int64_t first = 0; first < count; first += static_cast<int64_t>(lanes)) {
    const size_t live = static_cast<size_t>(std::min<int64_t>(count - first, lanes));
    for (size_t j = 0; j < lanes; ++j) {
      if (j < live) {
        const float* g = groups[first + static_cast<int64_t>(j)];
        for (size_t i = 0; i < len; ++i) wt[i * lanes + j] = g[i];
        s_io[j] = params[first + static_cast<int64_t>(j)].scale;
        m_io[j] = params[first + static_cast<int64_t>(j)].offset;
      } else {  // idle lane: a constant group, never active
        for (size_t i = 0; i < len; ++i) wt[i * lanes + j] = 0.0f;
        s_io[j] = 0.0f;
        m_io[j] = 0.0f;
      }
    }
    RefineBatch(wt, len, s_io, m_io, config);
    for (size_t j = 0; j < live; ++j) {
      params[first + static_cast<int64_t>(j)] = GroupParams{s_io[j], m_io[j]};
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::quant_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary::quant_internal {

HWY_EXPORT(RefineGroupsImpl);

void RefineGroups(const float* const* groups, int64_t count, int n, const RefineConfig& config,
                  GroupParams* params) {
  if (count <= 0 || n <= 1) return;
  HWY_DYNAMIC_DISPATCH(RefineGroupsImpl)(groups, count, n, config, params);
}

}  // namespace estuary::quant_internal
#endif  // HWY_ONCE
