#pragma once
// What the two int8-activation paths of Int4MatMul share (int4_matmul_vnni.cc: AVX512-VNNI;
// int4_matmul_avx2.cc: AVX2, vpmaddubsw): the per-call preparation of the activations (rounded
// to int8 per weight group, then permuted into the matrix's nibble order), the arguments of a
// row kernel, and the walk over panels, row tiles and token chunks. Each path supplies its
// SIMD pieces as an Int8Path. Internal to core/quant.
//
// Numerics of both paths: x_ti ≈ x8_ti · e_tg with e_tg = max_{i∈g} |x_ti| / 127 (symmetric,
// round to nearest even), so each activation is off by at most e_tg / 2;
//   y_rt = Σ_g s_rg e_tg Σ_{i∈g} q_ri x8_ti + Σ_g m_rg X_tg,   X_tg = Σ_{i∈g} x_ti (f32),
// the inner sums exact in int32, the rest in f32 in an order that depends neither on n_tokens,
// the token chunking nor the thread count (so a token's bits do not depend on its batch).

#include <cstdint>

#include "core/common/worker_pool.h"
#include "core/quant/int4_matrix.h"

namespace estuary::int4_int8 {

// Byte position of column c (0..127) of a kBlocks block in the kernels' order: [lo 64][hi 64],
// where lo holds the columns whose codes an AND 0x0F of the block's bytes gives and hi those of
// a shift by 4 + AND, each 16-byte lane with columns < 64 in its first 8 bytes (the in-lane byte
// shuffle both kernels apply to the codes; int4_matmul_vnni.cc describes the block).
constexpr int64_t PermutedIndex(int64_t c) {
  const int64_t half = c / 64, within = c % 64;
  const int64_t v = within / 32, jj = within % 32;
  return v * 64 + 16 * (jj / 8) + jj % 8 + 8 * half;
}

// Arguments of one row kernel call (kR rows × kT tokens of one row tile's chunk).
struct KernelArgs {
  const float* scales;   // s_rg · e_tg at scales[(t * kTileRows + r) * kParamStride + g]
  const float* offsets;  // m_rg at offsets[r * kParamStride + g]
  int64_t n_groups16;
  const int8_t* x8;      // block b, token t at x8 + b * x8_block_stride + t * 128
  int64_t x8_block_stride;
  const float* xsum;     // token t at xsum + t * x_stride
  int64_t x_stride;
  int64_t n_blocks;
  int64_t blocks_per_group;       // groups of >= 128 columns
  int64_t blocks_per_superblock;  // kGroupLanes: G / 8 blocks per 16 groups
  // Kernels that read the f16 parameters themselves (Int8Path::pick_kernels; scales and offsets
  // are then unused): the tile's f16 scales [kTileRows][param_groups] then offsets
  // (Int4Matrix::chunk_params), and token t's e_tg at xstep + t * x_stride.
  const uint16_t* params16;
  int64_t param_groups;
  const float* xstep;
};

// Fills dots[r * kT + t] for the kernel's kR rows from `words` (the first row's block 0).
using RowsFn = void (*)(const uint8_t* words, const KernelArgs& a, float* dots);

// A path's SIMD pieces.
struct Int8Path {
  // Σ x and max |x| over a prefix of x[0, n) (a multiple of the path's vector width); returns
  // its length (the caller finishes the rest).
  int64_t (*sum_max_abs)(const float* x, int64_t n, float* sum, float* max_abs);
  // out[i] = x[i] · inv rounded to nearest even, as int8, over a prefix of [0, n); returns its
  // length (the caller rounds the rest the same way).
  int64_t (*round_to_int8)(const float* x, int64_t n, float inv, int8_t* out);
  // The row kernels for this matrix and call: fns[k] runs k tokens (k <= kMaxChunkTokens),
  // row_step rows each; calls take at most token_step tokens. *f16_params: the kernels read the
  // tile's f16 scales and offsets themselves and form s_rg · e_tg in registers
  // (KernelArgs::params16), so the walk skips the per-tile f32 copy and combined-scale pass
  // (LoadChunkParams, CombineScales: with the walk around them ~30% of an L2-resident GEMV on a
  // Zen 3 VM); else they read those f32 copies (KernelArgs::scales, offsets). The results are the
  // same bits either way.
  void (*pick_kernels)(const Int4Matrix& w, bool gemv, RowsFn* fns, int* row_step,
                       int* token_step, bool* f16_params);
};

// y = W x for n_tokens tokens on `pool` through `path`.
void MatMul(const Int8Path& path, const Int4Matrix& w, const float* x, int64_t n_tokens,
            float* y, WorkerPool& pool);

}  // namespace estuary::int4_int8
