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

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cpu/stream_read.h"
#include "core/tensor/half_float.h"
#include "hwy/aligned_allocator.h"

namespace estuary::bench {
namespace {

constexpr double kGB = 1e9;

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
// Batched decode: the shapes above but the LM head, at these numbers of tokens.
constexpr int64_t kBatchTokens[] = {4, 16};
constexpr int kBatchShapes = 4;  // the first four of kShapes

// The one large buffer: streamed by stream_read and carved into weight matrices by the GEMVs.
// Owned by main() for the whole run.
struct Pool {
  hwy::AlignedFreeUniquePtr<uint16_t[]> data;
  size_t bytes = 0;
};
Pool* g_pool = nullptr;

void FillPool(Pool& pool) {
  // bf16 values of magnitude [0.5, 1) with random signs: no denormals, no NaN.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  const size_t n = pool.bytes / sizeof(uint16_t);
  uint16_t* p = pool.data.get();
  for (size_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    // sign | exponent of 0.5 (126) | 7 random mantissa bits
    p[i] = static_cast<uint16_t>(((state >> 8) & 0x8000u) | (126u << 7) | (state & 0x7Fu));
  }
}

void BM_StreamRead(benchmark::State& state) {
  const auto* data = reinterpret_cast<const uint8_t*>(g_pool->data.get());
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::cpu::StreamSum(data, g_pool->bytes));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(g_pool->bytes));
}

void BM_GemvBf16(benchmark::State& state, GemvShape shape) {
  const size_t matrix_elems = static_cast<size_t>(shape.rows * shape.cols);
  const size_t n_matrices = std::max<size_t>(1, g_pool->bytes / (matrix_elems * 2));
  std::vector<float> x(static_cast<size_t>(shape.cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  std::vector<float> y(static_cast<size_t>(shape.rows));
  size_t next = 0;
  for (auto _ : state) {
    const uint16_t* w = g_pool->data.get() + next * matrix_elems;
    kernels::cpu::GemvBf16(w, x.data(), shape.rows, shape.cols, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    next = next + 1 == n_matrices ? 0 : next + 1;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(matrix_elems * 2));
  state.counters["matrices"] = static_cast<double>(n_matrices);
}

// Weight GB/s of GemvBatchBf16 for `n_tokens` tokens: bytes per call are those of W, as above.
void BM_GemvBatchBf16(benchmark::State& state, GemvShape shape, int64_t n_tokens) {
  const size_t matrix_elems = static_cast<size_t>(shape.rows * shape.cols);
  const size_t n_matrices = std::max<size_t>(1, g_pool->bytes / (matrix_elems * 2));
  std::vector<float> x(static_cast<size_t>(n_tokens * shape.cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  std::vector<float> y(static_cast<size_t>(n_tokens * shape.rows));
  size_t next = 0;
  for (auto _ : state) {
    const uint16_t* w = g_pool->data.get() + next * matrix_elems;
    kernels::cpu::GemvBatchBf16(w, x.data(), n_tokens, shape.rows, shape.cols, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    next = next + 1 == n_matrices ? 0 : next + 1;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(matrix_elems * 2));
  state.counters["matrices"] = static_cast<double>(n_matrices);
}

// Forwards to the display reporter and keeps every iteration run's bytes_per_second.
class CapturingReporter : public benchmark::BenchmarkReporter {
 public:
  explicit CapturingReporter(std::unique_ptr<benchmark::BenchmarkReporter> inner)
      : inner_(std::move(inner)) {}

  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) rates_[run.run_name.function_name].push_back(it->second.value);
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }

  // Smallest and largest bytes/s over the repetitions of `name` (0 when it did not run).
  double MinRate(const std::string& name) const {
    const auto it = rates_.find(name);
    return it == rates_.end() ? 0.0 : *std::min_element(it->second.begin(), it->second.end());
  }
  double MaxRate(const std::string& name) const {
    const auto it = rates_.find(name);
    return it == rates_.end() ? 0.0 : *std::max_element(it->second.begin(), it->second.end());
  }
  // Median bytes/s over the repetitions of `name`, or 0 when it did not run.
  double MedianRate(const std::string& name) const {
    const auto it = rates_.find(name);
    if (it == rates_.end() || it->second.empty()) return 0.0;
    std::vector<double> v = it->second;
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  size_t Repetitions(const std::string& name) const {
    const auto it = rates_.find(name);
    return it == rates_.end() ? 0 : it->second.size();
  }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  std::map<std::string, std::vector<double>> rates_;
};

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
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strncmp(argv[i], "--pool_mib=", 11) == 0) {
      pool_mib = static_cast<size_t>(std::strtoull(argv[i] + 11, nullptr, 10));
    } else {
      args.push_back(argv[i]);
    }
  }
  if (pool_mib < 600) {
    std::fprintf(stderr, "--pool_mib must be at least 600 (the LM head is 501 MiB)\n");
    return 1;
  }
  // Defaults, unless given: five repetitions in random order, so that a burst of load from
  // other processes on a shared machine does not bias one benchmark against the others.
  std::string repetitions = "--benchmark_repetitions=5";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  const auto has_flag = [&](const char* prefix) {
    return std::any_of(args.begin(), args.end(), [&](const char* arg) {
      return std::strncmp(arg, prefix, std::strlen(prefix)) == 0;
    });
  };
  if (!has_flag("--benchmark_repetitions")) args.push_back(repetitions.data());
  if (!has_flag("--benchmark_enable_random_interleaving")) args.push_back(interleave.data());
  int bench_argc = static_cast<int>(args.size());
  benchmark::Initialize(&bench_argc, args.data());
  if (benchmark::ReportUnrecognizedArguments(bench_argc, args.data())) return 1;

  Pool pool;
  pool.bytes = pool_mib << 20;
  pool.data = hwy::AllocateAligned<uint16_t>(pool.bytes / sizeof(uint16_t));
  if (!pool.data) {
    std::fprintf(stderr, "cannot allocate %zu MiB\n", pool_mib);
    return 1;
  }
  // Huge pages where the kernel allows it (fewer TLB misses, for every benchmark alike). madvise
  // wants page-aligned ranges; the allocation is only cache-line aligned.
  {
    constexpr uintptr_t kPage = 4096;
    const auto begin = (reinterpret_cast<uintptr_t>(pool.data.get()) + kPage - 1) & ~(kPage - 1);
    const auto end = (reinterpret_cast<uintptr_t>(pool.data.get()) + pool.bytes) & ~(kPage - 1);
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0) {
      std::fprintf(stderr, "note: madvise(MADV_HUGEPAGE) failed; using small pages\n");
    }
  }
  FillPool(pool);
  g_pool = &pool;

  // Rates are per CPU second (Google Benchmark's default), not per wall second: on a shared
  // machine, time this thread spends descheduled says nothing about the kernel.
  benchmark::RegisterBenchmark("stream_read", BM_StreamRead)
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.3);
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

  auto console =
      std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_Tabular);
  if (json) console->SetOutputStream(&std::cerr);
  CapturingReporter reporter(std::move(console));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintSummary(reporter, json);
  benchmark::Shutdown();
  return 0;
}
