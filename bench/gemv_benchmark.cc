// gemv_benchmark: single-threaded decode GEMV (bf16 weights), one token and batched, against the
// machine's plain streaming-read bandwidth, measured in the same run.
//
// The decode step of a small model is a chain of GEMVs that read every weight once, so the best
// a GEMV can do is the rate at which one core streams memory. This binary measures
//   stream_read:  a SIMD integer sum over one large buffer (default 1 GiB, far beyond L3);
//   gemv_bf16/*:  kernels::cpu::GemvBf16 at the Llama-3.2-1B decode shapes, cycling through as
//                 many distinct weight matrices as fit in the same buffer, so reads come from DRAM;
//   gemv_batch_bf16/*/tN: kernels::cpu::GemvBatchBf16 for N tokens (a batched decode step of N
//                 sequences) at the same shapes but the LM head, weights cycled the same way;
// and prints a table of weight GB/s (bytes of W per call / time, 1 GB = 1e9 bytes; the same for
// one token or N) and the ratio to stream_read. A batched row at ratio 1 would cost one weight
// stream for all N tokens; the per-token GEMV costs N streams. "x N gemv" is the batched call's
// speed-up over N calls of the one-token GEMV at the same shape (N * its GB/s / the GEMV's).
// Batched rows are compute-bound from ~4 tokens (one f32 FMA per weight element and token), so
// their ratio falls roughly as 1/N; see core/kernels/cpu/gemv_batch.cc.
//
// Usage: gemv_benchmark [--json] [--pool_mib=N] [--benchmark_* flags]
//   By default every benchmark runs 5 times in random order; the table shows the median GB/s
//   and its ratio to the median stream_read, and the best GB/s and its ratio to the best
//   stream_read (the least disturbed by other processes).
//   --json        print the summary as one JSON object on stdout (benchmark output on stderr)
//   --pool_mib=N  size of the weight / streaming buffer in MiB (default 1024, at least 600 so the
//                 LM head fits)

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "bench/bench_report.h"
#include "core/kernels/cpu/kernels.h"

namespace estuary::bench {
namespace {

// Weight shapes of one Llama-3.2-1B decode step (rows x cols of W, y = W x).
struct GemvShape {
  const char* name;
  int64_t rows;
  int64_t cols;
};
constexpr GemvShape kShapes[] = {
    {"q_o", 2048, 2048},        // attention q and o projections
    {"k_v", 512, 2048},         // k and v projections (8 kv heads x 64)
    {"gate_up", 8192, 2048},    // MLP gate and up
    {"down", 2048, 8192},       // MLP down
    {"lm_head", 128256, 2048},  // tied embedding as the LM head
};
// Batched decode: the shapes above but the LM head, at these numbers of tokens (1: the batch-
// invariant path of one token, which the lossless drafts run; 5: a verification pass of four
// drafts and the bonus row).
constexpr int64_t kBatchTokens[] = {1, 4, 5, 16};
constexpr int kBatchShapes = 4;  // the first four of kShapes

// The weight / streaming buffer (bench_report.h), owned by main() for the whole run.
Pool* g_pool = nullptr;

void BM_GemvBf16(benchmark::State& state, GemvShape shape) {
  const std::vector<float> x = Activations(shape.cols);
  std::vector<float> y(static_cast<size_t>(shape.rows));
  CycleBf16Matrices(state, *g_pool, shape.rows, shape.cols, [&](const uint16_t* w) {
    kernels::cpu::GemvBf16(w, x.data(), shape.rows, shape.cols, y.data());
    benchmark::DoNotOptimize(y.data());
  });
}

// Weight GB/s of GemvBatchBf16 for `n_tokens` tokens: bytes per call are those of W, as above.
void BM_GemvBatchBf16(benchmark::State& state, GemvShape shape, int64_t n_tokens) {
  const std::vector<float> x = Activations(n_tokens * shape.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * shape.rows));
  CycleBf16Matrices(state, *g_pool, shape.rows, shape.cols, [&](const uint16_t* w) {
    kernels::cpu::GemvBatchBf16(w, x.data(), n_tokens, shape.rows, shape.cols, y.data());
    benchmark::DoNotOptimize(y.data());
  });
}

std::string GemvName(const GemvShape& shape) {
  return std::string("gemv_bf16/") + shape.name + "/" + std::to_string(shape.rows) + "x" +
         std::to_string(shape.cols);
}

std::string GemvBatchName(const GemvShape& shape, int64_t n_tokens) {
  return std::string("gemv_batch_bf16/") + shape.name + "/" + std::to_string(shape.rows) + "x" +
         std::to_string(shape.cols) + "/t" + std::to_string(n_tokens);
}

// One row of the summary: a registered benchmark, its shape and its number of tokens.
struct SummaryRow {
  std::string name;
  GemvShape shape;
  int64_t n_tokens;
};

// Every GEMV benchmark in table order: the one-token rows, then the batched ones by tokens.
std::vector<SummaryRow> SummaryRows() {
  std::vector<SummaryRow> rows;
  for (const GemvShape& shape : kShapes) rows.push_back({GemvName(shape), shape, 1});
  for (int64_t n_tokens : kBatchTokens) {
    for (int s = 0; s < kBatchShapes; ++s) {
      rows.push_back({GemvBatchName(kShapes[s], n_tokens), kShapes[s], n_tokens});
    }
  }
  return rows;
}

void PrintSummary(const CapturingReporter& reporter, bool json) {
  const double stream = reporter.MedianRate("stream_read");
  const double stream_best = reporter.MaxRate("stream_read");
  const std::string target = kernels::cpu::GemvTargetName();
  if (json) {
    std::printf(
        "{\"target\": \"%s\", \"pool_bytes\": %zu, \"stream_read_gbps\": %.3f, "
        "\"stream_read_best_gbps\": %.3f, \"gemv\": [",
        target.c_str(), g_pool->bytes, stream / kGB, stream_best / kGB);
  } else {
    std::printf(
        "\nGemvBf16 / GemvBatchBf16 (target %s), single thread, median of %zu repetition(s);\n"
        "GB/s = bytes of W per call / time, for all the call's tokens\n",
        target.c_str(), reporter.Repetitions("stream_read"));
    std::printf("%-38s %8s %7s %10s %7s %9s   %s\n", "shape", "GB/s", "ratio", "best GB/s", "ratio",
                "x N gemv", "GB/s min..max");
    std::printf("%-38s %8.2f %7.2f %10.2f %7.2f %9s   %.2f..%.2f\n", "stream_read", stream / kGB,
                1.0, stream_best / kGB, 1.0, "", reporter.MinRate("stream_read") / kGB,
                stream_best / kGB);
  }
  bool first = true;
  for (const SummaryRow& row : SummaryRows()) {
    const std::string& name = row.name;
    const GemvShape& shape = row.shape;
    const double rate = reporter.MedianRate(name);
    if (rate == 0.0) continue;  // filtered out
    const double ratio = stream > 0 ? rate / stream : 0.0;
    // Batched rows: the speed-up over running the one-token GEMV once per token at the same
    // shape, n_tokens * rate / GEMV rate (0 when that row did not run).
    const double gemv_rate = reporter.MedianRate(GemvName(shape));
    const double speedup = row.n_tokens > 1 && gemv_rate > 0
                               ? static_cast<double>(row.n_tokens) * rate / gemv_rate
                               : 0.0;
    if (json) {
      std::printf(
          "%s{\"shape\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"tokens\": %lld, "
          "\"gbps\": %.3f, \"ratio\": %.4f, \"best_gbps\": %.3f, \"best_ratio\": %.4f, "
          "\"speedup_vs_gemv\": %.3f}",
          first ? "" : ", ", shape.name, static_cast<long long>(shape.rows),
          static_cast<long long>(shape.cols), static_cast<long long>(row.n_tokens), rate / kGB,
          ratio, reporter.MaxRate(name) / kGB,
          stream_best > 0 ? reporter.MaxRate(name) / stream_best : 0.0, speedup);
    } else {
      const double best = reporter.MaxRate(name);
      char speedup_text[16] = "";
      if (speedup > 0) std::snprintf(speedup_text, sizeof(speedup_text), "%.2f", speedup);
      std::printf("%-38s %8.2f %7.2f %10.2f %7.2f %9s   %.2f..%.2f\n", name.c_str(), rate / kGB,
                  ratio, best / kGB, stream_best > 0 ? best / stream_best : 0.0, speedup_text,
                  reporter.MinRate(name) / kGB, best / kGB);
    }
    first = false;
  }
  std::printf(json ? "]}\n" : "\n");
}

}  // namespace
}  // namespace estuary::bench

int main(int argc, char** argv) {
  using namespace estuary::bench;  // NOLINT(build/namespaces)
  // Our flags first; the rest go to Google Benchmark.
  bool json = false;
  size_t pool_mib = 1024;
  std::vector<char*> args = ParseArgs(argc, argv, json, {{"--pool_mib=", &pool_mib}});
  if (pool_mib < 600) {
    std::fprintf(stderr, "--pool_mib must be at least 600 (the LM head is 501 MiB)\n");
    return 1;
  }
  if (!InitBenchmark(args)) return 1;

  Pool pool;
  if (!InitPool(pool_mib, /*note_small_pages=*/true, pool)) return 1;
  g_pool = &pool;

  // Rates are per CPU second (Google Benchmark's default), not per wall second: on a shared
  // machine, time this thread spends descheduled says nothing about the kernel.
  RegisterStreamRead(&pool);
  for (const GemvShape& shape : kShapes) {
    benchmark::RegisterBenchmark(GemvName(shape).c_str(), BM_GemvBf16, shape)
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.3);
  }
  for (int64_t n_tokens : kBatchTokens) {
    for (int s = 0; s < kBatchShapes; ++s) {
      benchmark::RegisterBenchmark(GemvBatchName(kShapes[s], n_tokens).c_str(), BM_GemvBatchBf16,
                                   kShapes[s], n_tokens)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3);
    }
  }

  CapturingReporter reporter(json);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintSummary(reporter, json);
  benchmark::Shutdown();
  return 0;
}
