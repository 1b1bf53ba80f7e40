#pragma once
// Int4 weights × f32 activations over an Int4Matrix (the exit river's W4A16 product):
//
//   y[t][o] = Σ_i x[t][i] · Ŵ[o][i]   for t < n_tokens,   x: [n_tokens][cols], y: [n_tokens][rows]
//
// n_tokens == 1 is the decode GEMV. Larger batches run 4 tokens per pass over each 4-row tile
// while the tile stays in L1, so the weights are read from memory once per call whatever
// n_tokens is. Highway runtime dispatch (AVX-512, AVX2, SSE4, SSSE3, scalar); nibbles are
// unpacked in registers.
//
// Three paths (chosen at run time, see SetInt4MatMulPath): on CPUs with AVX512-VNNI the int8
// path of int4_matmul_vnni.h (activations to int8 per group, vpdpbusd; bound: error <= e/2 per
// activation, e = max |x| over the group / 127, i.e. the formula below with 127 for 32767); on
// CPUs with AVX2 but no AVX512-VNNI the same numerics on 256-bit vectors (int4_matmul_avx2.h,
// vpmaddubsw); elsewhere the Highway path described here.
//
// Numerics (int4_matmul.cc): each token's x is rounded once per call to int16 per weight group,
// with step e = max |x| over the group / 32767, i.e. 16-bit activations as in W4A16. Within a
// group the products are summed exactly in int32; groups, offsets and tokens accumulate in f32.
// So y differs from the exact product with Dequantize() by at most
// Σ_g |s_g| · e_g / 2 · Σ_{i∈g} q_i plus f32 rounding (int4_matmul_test checks that bound plus
// 2e-5 of Σ_i |x_i ŵ_i|). A token's output is bitwise the same whether it is computed alone or
// in any batch, and for any thread count.
//
// Speed (int4_benchmark, one Zen 4 core, Llama-3.2-1B shapes): the GEMV streams ~21-23 GB/s of
// int4 data, 0.7-0.75 of the core's streaming-read bandwidth, 2.3-3x faster than the bf16 GEMV;
// batches of 4-16 tokens run 1.5-3x faster than the bf16 GEMV once per token.
//
// Thread-safety: concurrent calls are fine (scratch is thread_local). The row tiles are split
// over `pool` (the caller's rank's WorkerPool; see core/common/worker_pool.h); a call on one
// pool is serialized with that pool's other jobs. Give it only cores that are otherwise idle (two
// threads: ~35 GB/s on the 1B shapes here, but slower than one for matrices below ~2 MB when
// cores are busy).

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/common/worker_pool.h"
#include "core/quant/int4_matrix.h"

namespace estuary {

// On the caller's thread alone.
void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y);
void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool);

// Name of the path Int4MatMul runs on this machine: "AVX512_VNNI" (int4_matmul_vnni.h) or
// "AVX2_INT8" (int4_matmul_avx2.h), both int8 activations, error per activation <= e/2 with
// e = max|x| over the group / 127, or the Highway target ("AVX3", "AVX2", ...: int16 activations
// as above).
const char* Int4MatMulTargetName();

// Which path Int4MatMul takes: kAuto = VNNI where the CPU has avx512vnni, else AVX2 int8 where it
// has avx2 + fma + f16c, else Highway; kVnni / kAvx2 take that path where the CPU has it, else
// Highway. For tests and benchmarks (process-wide; set it before
// concurrent calls, not during them).
enum class Int4Path { kAuto, kHighway, kVnni, kAvx2 };
// "auto", "highway", "vnni" or "avx2" (the --int4-kernel and int4_benchmark names); nullopt for
// any other name.
std::optional<Int4Path> Int4PathFromName(std::string_view name);
void SetInt4MatMulPath(Int4Path path);
bool Int4VnniAvailable();
bool Int4Avx2Available();
// True when Int4MatMul takes an int8 path (VNNI or AVX2) for a kBlocks matrix now (the path
// setting and the CPU); Int4Matrix::Quantize's Int4Layout::kAuto writes kGroupLanes only then.
bool Int4MatMulUsesInt8();

}  // namespace estuary
