#pragma once
// The AVX2 int8 path of Int4MatMul (int4_matmul.cc chooses it at run time on CPUs with avx2,
// fma and f16c but no AVX512-VNNI; the Highway path stays for every other CPU and for tests).
// Numerics as the VNNI path's (int4_int8_path.h): int8 activations per weight group, error per
// activation <= e/2 with e = max |x| over the group / 127; a token's bits do not depend on its
// batch or the thread count. Reads both layouts (int4_matmul_avx2.cc has the kernels): kBlocks
// with a byte shuffle per 32 codes and the scales per block, kGroupLanes with neither (the
// scales once per 16 groups).

#include <cstdint>

#include "core/common/worker_pool.h"
#include "core/quant/int4_matrix.h"

namespace estuary::int4_avx2 {

// True when this CPU runs the AVX2 path (avx2, fma, f16c).
bool Available();

// y = W x for n_tokens tokens on `pool` (see Int4MatMul). Requires Available().
void MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool);

}  // namespace estuary::int4_avx2
