#pragma once
// The AVX512-VNNI path of Int4MatMul (int4_matmul.cc chooses it at run time when the CPU has
// avx512vnni + avx512bw; int4_matmul_avx2.h where it has AVX2 only, the Highway path elsewhere
// and for tests).
//
// Numerics: each token's x is rounded once per call to int8 per weight group, with step
// e_tg = max_{i∈g} |x_ti| / 127 (symmetric), so each activation is off by at most e_tg / 2 and y
// by at most Σ_g |s_g| · e_g / 2 · Σ_{i∈g} q_i plus f32 rounding (int4_matmul_test checks it).
// Codes (u8, 0..15) × int8 activations are summed exactly in int32 with vpdpbusd; groups,
// offsets and tokens accumulate in f32 in an order that depends neither on n_tokens, the token
// chunking nor the thread count, so a token's bits do not depend on its batch.
//
// Layouts: a matrix in Int4Layout::kGroupLanes (written at Quantize where an int8 path runs and
// the shape fits, int4_matrix.h) has its nibbles in this kernel's order: a 64-byte load, an AND and
// a shift + AND give 4 codes of each of 16 groups per int32 lane, vpdpbusd sums a whole group in
// one lane, and the scales apply once per 16 groups. A kBlocks matrix is read as stored: one AND
// (or shift + AND) of a block row's 64 bytes gives 64 u8 codes, one in-lane byte shuffle
// (vpshufb) puts columns of the same 64-column half in the same int32 lanes, and the scales
// apply per block. Either way the activations are permuted once per call into the matrix's order.

#include <cstdint>

#include "core/common/worker_pool.h"
#include "core/quant/int4_matrix.h"

namespace estuary::int4_vnni {

// True when this CPU runs the VNNI path (avx512f, avx512bw, avx512vnni).
bool Available();

// y = W x for n_tokens tokens on `pool` (see Int4MatMul). Requires Available().
void MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool);

}  // namespace estuary::int4_vnni
