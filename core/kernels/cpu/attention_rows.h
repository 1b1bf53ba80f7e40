// The two inner loops of CPU attention over one page of K/V rows, vectorized for AVX-512
// (paged_attention.cc's per-(query, KV head) work item calls them per page): scores of one query
// head against consecutive K rows, and the score-weighted sum of consecutive V rows. Written with
// intrinsics in functions compiled for that target and chosen at run time; other CPUs and head
// sizes that are not a multiple of 16 keep the portable loops (AttentionRowsAvailable false).
//
// Numerics: f32 throughout, products fused into the accumulation (FMA), so the bits differ from
// the portable loops' (kernels_test bounds the difference); a result depends only on its own
// query and rows, never on how many rows a call covers, the page size or the thread, and decode
// and prefill call the same functions, so a token's attention is the same in both.
#ifndef ESTUARY_CORE_KERNELS_CPU_ATTENTION_ROWS_H_
#define ESTUARY_CORE_KERNELS_CPU_ATTENTION_ROWS_H_

#include <cstdint>

namespace estuary::kernels::cpu {

// True when this CPU has AVX512-F and head_dim is a multiple of 16 up to 256.
bool AttentionRowsAvailable(int head_dim);

// scores[p] = scale * q . k[p * head_dim ...] for p < n_rows. Requires AttentionRowsAvailable.
void ScoreRows(const float* q, const float* k, int n_rows, int head_dim, float scale,
               float* scores);

// out[i] += sum_p weights[p] * v[p * head_dim + i], p ascending. Requires AttentionRowsAvailable.
void AccumulateRows(const float* weights, const float* v, int n_rows, int head_dim, float* out);

}  // namespace estuary::kernels::cpu

#endif  // ESTUARY_CORE_KERNELS_CPU_ATTENTION_ROWS_H_
