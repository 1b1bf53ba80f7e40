#pragma once
// BenchPrefill: prefill tokens/s of the PrefillEngine on one long random prompt at several TP
// sizes (`estuary bench-prefill`), and the dense GEMM behind it: the batch-invariant MatMul that
// prefill runs (kernels::cpu::MatMulPath::kBatchInvariant) against OpenBLAS sgemm at the model's
// projection shapes with the chunk size as the token count, same thread count, same run.
//
// FLOP accounting (dense only, attention excluded): 2 * tokens * (q, k, v, o, gate, up, down
// parameters per layer) * layers, plus the LM head for the last token. GFLOP/s of a prefill row
// divides that by the wall time of the whole prefill (attention, norms, RoPE and all-reduces
// included), so it is a lower bound on the GEMM's own rate.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace estuary {

struct BenchPrefillOptions {
  std::string model_path;             // required: a Hugging Face folder or llama2.c model
  std::string dtype;                  // "", "f32" or "bf16": convert weights at load
  std::vector<int> tp_sizes = {1, 2};
  int prompt_tokens = 2048;           // random ids, fixed seed
  int max_num_batched_tokens = 512;   // prefill chunk (tokens per step)
  int threads = 0;                    // total CPU threads; 0: the machine's cores
  int prefill_iterations = 1;         // timed prefills per TP size (after one short warm-up)
  int matmul_iterations = 2;          // timed calls per GEMM shape and kernel (after one warm-up)
  bool skip_matmul = false;
  bool json = false;                  // print {"rows": [...]} instead of the table
};

struct BenchPrefillRow {
  std::string kind;        // "prefill" or "matmul"
  // prefill rows
  int tp = 0;
  int prompt_tokens = 0;
  int chunk = 0;
  double seconds = 0;      // one prefill (mean over iterations)
  double tokens_per_second = 0;
  double dense_gflops = 0;  // dense FLOPs / seconds
  // matmul rows
  std::string projection;  // "q", "k/v", "o", "gate/up", "down"
  int64_t out = 0, in = 0, n_tokens = 0;
  int threads = 0;
  double batch_invariant_gflops = 0;       // f32 weights
  double batch_invariant_bf16_gflops = 0;  // bf16 weights (the model's dtype usually)
  double sgemm_gflops = 0;                 // OpenBLAS cblas_sgemm, f32
  double ratio = 0;                        // batch_invariant (f32) / sgemm
};

struct BenchPrefillReport {
  std::string model;
  std::string weight_dtype;
  std::string gemv_target;  // SIMD target of the batched GEMV
  std::vector<BenchPrefillRow> rows;
};

// Runs everything; INVALID_ARGUMENT for bad options.
absl::StatusOr<BenchPrefillReport> MeasurePrefill(const BenchPrefillOptions& options);
std::string BenchPrefillJson(const BenchPrefillReport& report);
std::string BenchPrefillTable(const BenchPrefillReport& report);

// MeasurePrefill, then prints the table (or JSON with options.json) to stdout.
absl::Status RunBenchPrefill(const BenchPrefillOptions& options);

}  // namespace estuary
