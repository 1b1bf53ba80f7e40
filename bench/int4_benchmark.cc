// int4_benchmark: Int4MatMul (the exit river's int4 × f32 kernel) against the single-core
// streaming-read bandwidth and against the bf16 decode GEMV, at the Llama-3.2-1B shapes.
//
//   stream_read:          kernels::cpu::StreamSum over one large buffer (as in gemv_benchmark);
//   bf16/<shape>/n<T>:    kernels::cpu::GemvBf16 once per token (what MatMul runs up to 8 tokens)
//                         over matrices carved from that buffer, cycling so reads come from DRAM;
//   int4/<shape>/n<T>:    Int4MatMul over `--int4_mib` MiB of distinct Int4Matrix copies per
//                         shape (RTN; the kernel does not care), cycling likewise;
//   int4_t2/<shape>/n1:   the same with threads = 2 (wall time; other rows use CPU time).
// GB/s counts the bytes of the weights read per call (Int4Matrix::bytes(), bf16 2 bytes/weight),
// 1 GB = 1e9 bytes. The summary table gives, per shape and token count, the int4 GB/s, its
// fraction of stream_read, and the time ratio bf16 / int4 (medians over the repetitions); then
// the time Int4Matrix::Quantize takes per shape and for all 112 matrices of Llama-3.2-1B.
//
// Usage: int4_benchmark [--json] [--pool_mib=N] [--int4_mib=N] [--benchmark_* flags]
//   By default every benchmark runs 5 times in random order.
//   --json        two JSON objects on stdout, kernels then quantization (benchmark output on
//                 stderr)
//   --pool_mib=N  streaming / bf16 buffer in MiB (default 1024)
//   --int4_mib=N  int4 copies per shape in MiB (default 256)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <optional>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "bench/bench_report.h"
#include "core/kernels/cpu/kernels.h"
#include "core/quant/int4_matmul.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/half_float.h"
#include "core/tensor/tensor.h"

namespace estuary::bench {
namespace {

struct Shape {
  const char* name;
  int64_t rows;
  int64_t cols;
};
constexpr Shape kShapes[] = {
    {"q_o", 2048, 2048},      // attention q and o projections
    {"k_v", 512, 2048},       // k and v projections
    {"gate_up", 8192, 2048},  // MLP gate and up
    {"down", 2048, 8192},     // MLP down
};
constexpr int64_t kTokenCounts[] = {1, 4, 16};

// The streaming / bf16 buffer (bench_report.h), owned by main().
Pool* g_pool = nullptr;
// Int4 copies per shape (index into kShapes), owned by main().
std::vector<std::vector<Int4Matrix>>* g_int4 = nullptr;

void BM_Bf16(benchmark::State& state, Shape shape, int64_t n_tokens) {
  const std::vector<float> x = Activations(n_tokens * shape.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * shape.rows));
  CycleBf16Matrices(state, *g_pool, shape.rows, shape.cols, [&](const uint16_t* w) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      kernels::cpu::GemvBf16(w, x.data() + t * shape.cols, shape.rows, shape.cols,
                             y.data() + t * shape.rows);
    }
    benchmark::DoNotOptimize(y.data());
  });
}

void BM_Int4(benchmark::State& state, size_t shape_index, int64_t n_tokens, int threads) {
  const Shape& shape = kShapes[shape_index];
  const std::vector<Int4Matrix>& set = (*g_int4)[shape_index];
  const std::vector<float> x = Activations(n_tokens * shape.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * shape.rows));
  size_t next = 0;
  WorkerPool pool(threads);
  for (auto _ : state) {
    Int4MatMul(set[next], x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    next = next + 1 == set.size() ? 0 : next + 1;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * set[0].bytes());
  state.counters["matrices"] = static_cast<double>(set.size());
}

std::string ShapeName(const Shape& s) {
  return std::string(s.name) + "/" + std::to_string(s.rows) + "x" + std::to_string(s.cols);
}
std::string Bf16Name(const Shape& s, int64_t n) {
  return "bf16/" + ShapeName(s) + "/n" + std::to_string(n);
}
std::string Int4Name(const Shape& s, int64_t n) {
  return "int4/" + ShapeName(s) + "/n" + std::to_string(n);
}
std::string Int4ThreadsName(const Shape& s, int64_t n) {
  return "int4_t2/" + ShapeName(s) + "/n" + std::to_string(n);
}

void PrintSummary(const CapturingReporter& r, bool json, double quantize_seconds) {
  const double stream = r.MedianRate("stream_read");
  const std::string target = Int4MatMulTargetName();
  if (json) {
    std::printf("{\"target\": \"%s\", \"stream_read_gbps\": %.3f, \"stream_read_best_gbps\": "
                "%.3f, \"rows\": [",
                target.c_str(), stream / kGB, r.MaxRate("stream_read") / kGB);
  } else {
    std::printf("\nInt4MatMul (target %s), single thread unless noted, median of %zu "
                "repetition(s); stream_read %.2f GB/s (best %.2f)\n",
                target.c_str(), r.Repetitions("stream_read"), stream / kGB,
                r.MaxRate("stream_read") / kGB);
    std::printf("%-24s %3s %10s %9s %10s %10s %11s %12s\n", "shape", "n", "int4 GB/s", "of stream",
                "int4 us", "bf16 us", "bf16/int4", "int4 t2 GB/s");
  }
  bool first = true;
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Shape& s = kShapes[i];
    const double int4_bytes = static_cast<double>((*g_int4)[i][0].bytes());
    const double bf16_bytes = static_cast<double>(s.rows * s.cols * 2);
    for (int64_t n : kTokenCounts) {
      const double int4 = r.MedianRate(Int4Name(s, n));
      const double bf16 = r.MedianRate(Bf16Name(s, n));
      const double t2 = r.MedianRate(Int4ThreadsName(s, n));
      if (int4 == 0.0) continue;
      const double int4_us = int4_bytes / int4 * 1e6;
      const double bf16_us = bf16 > 0 ? bf16_bytes / bf16 * 1e6 : 0.0;
      if (json) {
        std::printf("%s{\"shape\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"n_tokens\": %lld, "
                    "\"int4_gbps\": %.3f, \"fraction_of_stream\": %.4f, \"int4_us\": %.2f, "
                    "\"bf16_us\": %.2f, \"bf16_over_int4\": %.3f, \"int4_t2_gbps\": %.3f}",
                    first ? "" : ", ", s.name, static_cast<long long>(s.rows),
                    static_cast<long long>(s.cols), static_cast<long long>(n), int4 / kGB,
                    stream > 0 ? int4 / stream : 0.0, int4_us, bf16_us,
                    bf16_us > 0 ? bf16_us / int4_us : 0.0, t2 / kGB);
      } else {
        char t2_text[32] = "-";
        if (t2 > 0) std::snprintf(t2_text, sizeof(t2_text), "%.2f", t2 / kGB);
        std::printf("%-24s %3lld %10.2f %9.2f %10.1f %10.1f %11.2f %12s\n", ShapeName(s).c_str(),
                    static_cast<long long>(n), int4 / kGB, stream > 0 ? int4 / stream : 0.0,
                    int4_us, bf16_us, bf16_us > 0 ? bf16_us / int4_us : 0.0, t2_text);
      }
      first = false;
    }
  }
  if (json) {
    std::printf("], \"setup_quantize_seconds\": %.3f}\n", quantize_seconds);
  } else {
    std::printf("(bytes per weight: int4 %.4f incl. f16 scale/offset, bf16 2; setup quantized "
                "the int4 sets (RTN) in %.1f s)\n\n",
                static_cast<double>((*g_int4)[0][0].bytes()) /
                    static_cast<double>(kShapes[0].rows * kShapes[0].cols),
                quantize_seconds);
  }
}

// Times Int4Matrix::Quantize (default options: g64, HQQ-style refinement, all cores; and RTN)
// on one random bf16 matrix per shape, and the total for the 112 matrices of Llama-3.2-1B
// (16 layers of q, k, v, o, gate, up, down).
struct QuantizeTiming {
  double refine_seconds[std::size(kShapes)] = {};
  double rtn_seconds[std::size(kShapes)] = {};
  double sq_error_ratio[std::size(kShapes)] = {};  // refined / RTN squared error
  double model_refine_seconds = 0;
  double model_rtn_seconds = 0;
};

bool TimeQuantize(QuantizeTiming& timing) {
  constexpr int kPerLayer[] = {2, 2, 2, 1};  // q+o, k+v, gate+up, down
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Shape& s = kShapes[i];
    absl::StatusOr<Tensor> w = Tensor::Zeros(DType::kBF16, {s.rows, s.cols});
    if (!w.ok()) return false;
    uint64_t state = 0x9E3779B97F4A7C15ull + i;
    uint16_t* p = w->mutable_data<uint16_t>();
    for (int64_t j = 0; j < s.rows * s.cols; ++j) {
      // Roughly normal (a sum of four uniforms), standard deviation 1/sqrt(cols), as synth.
      double sum = 0;
      for (int k = 0; k < 4; ++k) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        sum += static_cast<double>(state >> 11) * 0x1p-53 - 0.5;
      }
      p[j] = F32ToBf16(static_cast<float>(sum * std::sqrt(3.0) / std::sqrt(double(s.cols))));
    }
    for (bool refine : {true, false}) {
      Int4QuantOptions options;
      options.refine = refine;
      Int4QuantStats stats;
      absl::StatusOr<Int4Matrix> m = Int4Matrix::Quantize(*w, options, &stats);
      if (!m.ok()) return false;
      (refine ? timing.refine_seconds : timing.rtn_seconds)[i] = stats.seconds;
      if (refine) timing.sq_error_ratio[i] = stats.sq_error / stats.rtn_sq_error;
      (refine ? timing.model_refine_seconds : timing.model_rtn_seconds) +=
          16.0 * kPerLayer[i] * stats.seconds;
    }
  }
  return true;
}

void PrintQuantizeTiming(const QuantizeTiming& t, bool json) {
  if (json) {
    std::printf("{\"quantize\": [");
    for (size_t i = 0; i < std::size(kShapes); ++i) {
      std::printf("%s{\"shape\": \"%s\", \"refine_seconds\": %.4f, \"rtn_seconds\": %.4f, "
                  "\"sq_error_ratio\": %.4f}",
                  i ? ", " : "", kShapes[i].name, t.refine_seconds[i], t.rtn_seconds[i],
                  t.sq_error_ratio[i]);
    }
    std::printf("], \"llama_3_2_1b_refine_seconds\": %.3f, \"llama_3_2_1b_rtn_seconds\": %.3f}\n",
                t.model_refine_seconds, t.model_rtn_seconds);
    return;
  }
  std::printf("Int4Matrix::Quantize (g64, %u threads), one bf16 matrix per shape:\n",
              std::thread::hardware_concurrency());
  std::printf("%-24s %12s %10s %16s\n", "shape", "refine s", "RTN s", "sq err vs RTN");
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    std::printf("%-24s %12.3f %10.3f %16.4f\n", ShapeName(kShapes[i]).c_str(),
                t.refine_seconds[i], t.rtn_seconds[i], t.sq_error_ratio[i]);
  }
  std::printf("Llama-3.2-1B (112 matrices): refine %.1f s, RTN %.1f s\n\n", t.model_refine_seconds,
              t.model_rtn_seconds);
}

// `count` int4 copies of one random bf16 matrix of `shape`.
bool BuildInt4Set(const Shape& shape, size_t count, std::vector<Int4Matrix>& out) {
  absl::StatusOr<Tensor> w = Tensor::Zeros(DType::kBF16, {shape.rows, shape.cols});
  if (!w.ok()) return false;
  uint16_t* p = w->mutable_data<uint16_t>();
  uint64_t state = 0x2545F4914F6CDD1Dull;
  for (int64_t i = 0; i < shape.rows * shape.cols; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    p[i] = F32ToBf16(static_cast<float>(static_cast<int64_t>(state % 2001) - 1000) * 1e-5f);
  }
  Int4QuantOptions options;
  options.refine = false;
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<Int4Matrix> m = Int4Matrix::Quantize(*w, options);
    if (!m.ok()) {
      std::fprintf(stderr, "quantize: %s\n", std::string(m.status().message()).c_str());
      return false;
    }
    out.push_back(std::move(*m));
  }
  return true;
}

}  // namespace
}  // namespace estuary::bench

int main(int argc, char** argv) {
  using namespace estuary::bench;  // NOLINT(build/namespaces)
  bool json = false;
  size_t pool_mib = 1024;
  size_t int4_mib = 256;
  // --int4_path=auto|highway|vnni|avx2: the kernel to time (Int4Path; default auto). Taken out
  // of argv before the size flags and Google Benchmark's are parsed.
  std::vector<char*> kept = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--int4_path=", 0) != 0) {
      kept.push_back(argv[i]);
      continue;
    }
    const std::optional<estuary::Int4Path> path = estuary::Int4PathFromName(arg.substr(12));
    if (!path.has_value()) {
      std::fprintf(stderr, "--int4_path: use auto, highway, vnni or avx2\n");
      return 1;
    }
    estuary::SetInt4MatMulPath(*path);
  }
  std::vector<char*> args = ParseArgs(static_cast<int>(kept.size()), kept.data(), json,
                                      {{"--pool_mib=", &pool_mib}, {"--int4_mib=", &int4_mib}});
  if (pool_mib < 64 || int4_mib < 16) {
    std::fprintf(stderr, "--pool_mib must be >= 64 and --int4_mib >= 16\n");
    return 1;
  }
  if (!InitBenchmark(args)) return 1;

  Pool pool;
  if (!InitPool(pool_mib, /*note_small_pages=*/false, pool)) return 1;
  g_pool = &pool;

  // Int4 sets: int4_mib per shape, at least 4 matrices (total far beyond the L3).
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<estuary::Int4Matrix>> int4(std::size(kShapes));
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Shape& s = kShapes[i];
    const double bytes_each = static_cast<double>(s.rows * s.cols) * (4.0 + 32.0 / 64) / 8;
    const size_t count =
        std::max<size_t>(4, static_cast<size_t>(static_cast<double>(int4_mib << 20) / bytes_each));
    if (!BuildInt4Set(s, count, int4[i])) return 1;
  }
  const double quantize_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g_int4 = &int4;
  QuantizeTiming timing;
  if (!TimeQuantize(timing)) {
    std::fprintf(stderr, "quantization timing failed\n");
    return 1;
  }

  // Rates per CPU second for single-threaded rows (robust to being descheduled on a shared
  // machine); the threaded rows use wall time.
  RegisterStreamRead(&pool);
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Shape& s = kShapes[i];
    for (int64_t n : kTokenCounts) {
      benchmark::RegisterBenchmark(Bf16Name(s, n).c_str(), BM_Bf16, s, n)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
      benchmark::RegisterBenchmark(Int4Name(s, n).c_str(), BM_Int4, i, n, 1)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
    }
    benchmark::RegisterBenchmark(Int4ThreadsName(s, 1).c_str(), BM_Int4, i, int64_t{1}, 2)
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.2)
        ->UseRealTime();
  }

  CapturingReporter reporter(json);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintSummary(reporter, json, quantize_seconds);
  PrintQuantizeTiming(timing, json);
  benchmark::Shutdown();
  return 0;
}
