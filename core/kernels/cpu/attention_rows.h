// The two inner loops of CPU attention over one page of K/V rows (paged_attention.cc's
// per-(query, KV head) work item calls them per page): scores of one query head against
// consecutive K rows, and the score-weighted sum of consecutive V rows. Where the CPU has AVX-512F
// and the head size is a multiple of 16 (AttentionRowsVectorized), they run intrinsics in
// functions compiled for that target, chosen at run time; elsewhere portable loops (a Dot per
// row, then a multiply-add per element), which callers need not know about.
//
// Numerics: f32 throughout. The AVX-512 loops fuse the products into the accumulation (FMA), so
// their bits differ from the portable loops' (attention_rows_test bounds the difference); on
// either path a result depends only on its own query and rows, never on how many rows a call
// covers, the page size or the thread, and decode and prefill call the same functions, so a
// token's attention is the same in both.
#ifndef ESTUARY_CORE_KERNELS_CPU_ATTENTION_ROWS_H_
#define ESTUARY_CORE_KERNELS_CPU_ATTENTION_ROWS_H_

#include <cstdint>

namespace estuary::kernels::cpu {

// True when this CPU has AVX512-F and head_dim is a multiple of 16 up to 256: the two functions
// below then run their AVX-512 loops.
bool AttentionRowsVectorized(int head_dim);

// scores[p] = scale * q . k[p * head_dim ...] for p < n_rows.
void ScoreRows(const float* q, const float* k, int n_rows, int head_dim, float scale,
               float* scores);

// out[i] += sum_p weights[p] * v[p * head_dim + i], p ascending.
void AccumulateRows(const float* weights, const float* v, int n_rows, int head_dim, float* out);

}  // namespace estuary::kernels::cpu

#endif  // ESTUARY_CORE_KERNELS_CPU_ATTENTION_ROWS_H_
