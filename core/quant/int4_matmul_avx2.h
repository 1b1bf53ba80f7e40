#pragma once
// The AVX2 int8 path of Int4MatMul (int4_matmul.cc chooses it at run time on CPUs with avx2,
// fma and f16c but no AVX512-VNNI; the Highway path stays for every other CPU and for tests).
// Numerics as the VNNI path's (int4_int8_path.h): int8 activations per weight group, error per
// activation <= e/2 with e = max |x| over the group / 127; a token's bits do not depend on its
// batch or the thread count. Reads kBlocks matrices (int4_matmul_avx2.cc has the kernel).

#include <cstdint>

#include "core/common/worker_pool.h"
#include "core/quant/int4_matrix.h"

namespace estuary::int4_avx2 {

// True when this CPU runs the AVX2 path (avx2, fma, f16c).
bool Available();

// y = W x for n_tokens tokens on `pool` (see Int4MatMul). Requires Available() and a kBlocks
// matrix.
void MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool);

}  // namespace estuary::int4_avx2
