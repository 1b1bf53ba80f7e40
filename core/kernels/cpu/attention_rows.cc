// AttentionRows (attention_rows.h): AVX-512F intrinsics in functions compiled for that target
// (function attributes, as in bf16_dot.cc), templated on the head size in 16-float vectors so
// that a query head (up to 16 vectors) and its accumulators stay in registers; portable loops for
// the other CPUs and head sizes.
//
// ScoreRows takes four K rows at a time: four FMA chains over the head's vectors, then one
// transposing reduction that sums all four rows' lanes at once (9 shuffles and adds for four
// scores, against about as many per score one by one). AccumulateRows keeps the output head in
// registers across the rows and adds each row's weight times its V vectors.
#include "core/kernels/cpu/attention_rows.h"

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <utility>

#include "core/kernels/cpu/kernels.h"

namespace estuary::kernels::cpu {
namespace {

#define ESTUARY_AVX512_TARGET __attribute__((target("avx512f")))
#define ESTUARY_AVX512_INLINE inline __attribute__((always_inline, target("avx512f")))

constexpr int kLanes = 16;
constexpr int kMaxVectors = 16;  // head_dim 256

// The four lane sums of a, b, c, d as one 128-bit vector (a's sum in lane 0), by a fixed tree.
// The all-ones maskz forms are the plain shuffles; unlike them they do not trip GCC 12's
// -Wmaybe-uninitialized on the headers' undefined vectors (as in bf16_dot.cc).
ESTUARY_AVX512_INLINE __m128 SumLanes4(__m512 a, __m512 b, __m512 c, __m512 d) {
  constexpr __mmask16 kAll16 = 0xffff;
  constexpr __mmask8 kAll8 = 0xff;
  // Per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) and the same for c, d.
  const __m512 ab = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll16, a, b),
                                  _mm512_maskz_unpackhi_ps(kAll16, a, b));
  const __m512 cd = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll16, c, d),
                                  _mm512_maskz_unpackhi_ps(kAll16, c, d));
  // Per 128-bit lane: (a, b, c, d) partial sums.
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512d abcd = _mm512_castps_pd(
      _mm512_add_ps(_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, abd, cdd)),
                    _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, abd, cdd))));
  constexpr __mmask8 kAll4 = 0x0f;
  const __m256 halves =
      _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(kAll4, abcd, 0)),
                    _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(kAll4, abcd, 1)));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

template <int kV>
ESTUARY_AVX512_TARGET void ScoreRowsImpl(const float* q, const float* k, int n_rows, float scale,
                                         float* scores) {
  constexpr int kDim = kV * kLanes;
  __m512 qv[kV];
  for (int j = 0; j < kV; ++j) qv[j] = _mm512_loadu_ps(q + j * kLanes);
  const __m128 vscale = _mm_set1_ps(scale);
  int p = 0;
  for (; p + 4 <= n_rows; p += 4) {
    const float* k0 = k + static_cast<int64_t>(p) * kDim;
    __m512 acc[4];
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k0 + r * kDim));
    for (int j = 1; j < kV; ++j) {
      for (int r = 0; r < 4; ++r) {
        acc[r] = _mm512_fmadd_ps(qv[j], _mm512_loadu_ps(k0 + r * kDim + j * kLanes), acc[r]);
      }
    }
    _mm_storeu_ps(scores + p, _mm_mul_ps(SumLanes4(acc[0], acc[1], acc[2], acc[3]), vscale));
  }
  if (p == n_rows) return;
  // The last 1-3 rows: the same arithmetic per row, the missing rows' sums discarded.
  __m512 acc[4];
  for (int r = 0; r < 4; ++r) {
    const float* kr = k + static_cast<int64_t>(p + (p + r < n_rows ? r : 0)) * kDim;
    acc[r] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
    for (int j = 1; j < kV; ++j) {
      acc[r] = _mm512_fmadd_ps(qv[j], _mm512_loadu_ps(kr + j * kLanes), acc[r]);
    }
  }
  alignas(16) float last[4];
  _mm_store_ps(last, _mm_mul_ps(SumLanes4(acc[0], acc[1], acc[2], acc[3]), vscale));
  for (int r = 0; p + r < n_rows; ++r) scores[p + r] = last[r];
}

template <int kV>
ESTUARY_AVX512_TARGET void AccumulateRowsImpl(const float* weights, const float* v, int n_rows,
                                              float* out) {
  constexpr int kDim = kV * kLanes;
  __m512 o[kV];
  for (int j = 0; j < kV; ++j) o[j] = _mm512_loadu_ps(out + j * kLanes);
  for (int p = 0; p < n_rows; ++p) {
    const __m512 w = _mm512_set1_ps(weights[p]);
    const float* vr = v + static_cast<int64_t>(p) * kDim;
    for (int j = 0; j < kV; ++j) o[j] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vr + j * kLanes), o[j]);
  }
  for (int j = 0; j < kV; ++j) _mm512_storeu_ps(out + j * kLanes, o[j]);
}

using ScoreFn = void (*)(const float*, const float*, int, float, float*);
using AccumulateFn = void (*)(const float*, const float*, int, float*);

template <int... kVs>
constexpr auto MakeScoreTable(std::integer_sequence<int, kVs...>) {
  return std::array<ScoreFn, sizeof...(kVs)>{&ScoreRowsImpl<kVs + 1>...};
}
template <int... kVs>
constexpr auto MakeAccumulateTable(std::integer_sequence<int, kVs...>) {
  return std::array<AccumulateFn, sizeof...(kVs)>{&AccumulateRowsImpl<kVs + 1>...};
}

// Entry v - 1 serves head_dim = 16 v.
constexpr auto kScore = MakeScoreTable(std::make_integer_sequence<int, kMaxVectors>{});
constexpr auto kAccumulate = MakeAccumulateTable(std::make_integer_sequence<int, kMaxVectors>{});

}  // namespace

bool AttentionRowsVectorized(int head_dim) {
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return cpu && head_dim > 0 && head_dim % kLanes == 0 && head_dim <= kMaxVectors * kLanes;
}

void ScoreRows(const float* q, const float* k, int n_rows, int head_dim, float scale,
               float* scores) {
  if (n_rows <= 0) return;
  if (AttentionRowsVectorized(head_dim)) {
    kScore[static_cast<size_t>(head_dim / kLanes - 1)](q, k, n_rows, scale, scores);
    return;
  }
  for (int p = 0; p < n_rows; ++p) {
    scores[p] = Dot(q, k + static_cast<int64_t>(p) * head_dim, head_dim) * scale;
  }
}

void AccumulateRows(const float* weights, const float* v, int n_rows, int head_dim, float* out) {
  if (n_rows <= 0) return;
  if (AttentionRowsVectorized(head_dim)) {
    kAccumulate[static_cast<size_t>(head_dim / kLanes - 1)](weights, v, n_rows, out);
    return;
  }
  for (int p = 0; p < n_rows; ++p) {
    const float w = weights[p];
    const float* row = v + static_cast<int64_t>(p) * head_dim;
    for (int i = 0; i < head_dim; ++i) out[i] += w * row[i];
  }
}

}  // namespace estuary::kernels::cpu
