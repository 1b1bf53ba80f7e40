// Shared pieces of the Google Benchmark binaries in bench/ (gemv_benchmark, int4_benchmark):
// command-line handling, the weight / streaming buffer, the stream_read reference benchmark and a
// reporter that keeps every repetition's bytes/s for the summary table each binary prints.

#ifndef ESTUARY_BENCH_BENCH_REPORT_H_
#define ESTUARY_BENCH_BENCH_REPORT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "hwy/aligned_allocator.h"

namespace estuary::bench {

// Bytes per GB in the summaries (1 GB = 1e9 bytes).
inline constexpr double kGB = 1e9;

// A `--name=N` flag of the binary: `prefix` is "--name=", `value` receives N (decimal).
struct SizeFlag {
  const char* prefix;
  size_t* value;
};

// Splits the command line: sets `json` on --json and each flag of `sizes` that is given, and
// returns the other arguments (argv[0] first), for InitBenchmark.
std::vector<char*> ParseArgs(int argc, char** argv, bool& json,
                             std::initializer_list<SizeFlag> sizes);

// Initializes Google Benchmark with `args`, adding the defaults unless given: five repetitions in
// random order, so that a burst of load from other processes on a shared machine does not bias
// one benchmark against the others. Returns false when an argument is not recognized (the caller
// exits with 1).
bool InitBenchmark(std::vector<char*>& args);

// The one large buffer: streamed by stream_read and carved into bf16 weight matrices.
struct Pool {
  hwy::AlignedFreeUniquePtr<uint16_t[]> data;
  size_t bytes = 0;
};

// Allocates `pool_mib` MiB into `pool`, asks for huge pages where the kernel allows it (fewer TLB
// misses, for every benchmark alike; with `note_small_pages`, a note on stderr when it does not)
// and fills it with bf16 values of magnitude [0.5, 1) and random signs (no denormals, no NaN).
// Returns false, with a message on stderr, when the allocation fails.
bool InitPool(size_t pool_mib, bool note_small_pages, Pool& pool);

// `n` activations with a fixed pattern of small values (-0.75 .. 0.75).
std::vector<float> Activations(int64_t n);

// The benchmark loop over bf16 weight matrices of `rows` x `cols` carved from `pool`: each
// iteration runs `call(w)` (the kernel on matrix `w`; it should DoNotOptimize its output) on the
// next of as many distinct matrices as fit in the pool, so that reads come from DRAM. Counts the
// bytes of one matrix per iteration and sets the "matrices" counter to their number.
template <class Call>
void CycleBf16Matrices(benchmark::State& state, const Pool& pool, int64_t rows, int64_t cols,
                       const Call& call) {
  const size_t matrix_elems = static_cast<size_t>(rows * cols);
  const size_t n_matrices = std::max<size_t>(1, pool.bytes / (matrix_elems * 2));
  size_t next = 0;
  for (auto _ : state) {
    call(pool.data.get() + next * matrix_elems);
    benchmark::ClobberMemory();
    next = next + 1 == n_matrices ? 0 : next + 1;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(matrix_elems * 2));
  state.counters["matrices"] = static_cast<double>(n_matrices);
}

// Registers "stream_read": a SIMD integer sum over the whole of `pool` (kernels::cpu::StreamSum),
// the single-core streaming-read bandwidth the other rows are compared with. Rates are per CPU
// second, as Google Benchmark's default.
void RegisterStreamRead(const Pool* pool);

// Forwards to the console reporter (tabular; on stderr under --json) and keeps every iteration
// run's bytes_per_second per benchmark (by function name) over the repetitions.
class CapturingReporter : public benchmark::BenchmarkReporter {
 public:
  explicit CapturingReporter(bool json);

  bool ReportContext(const Context& context) override;
  void ReportRuns(const std::vector<Run>& runs) override;
  void Finalize() override;

  // Smallest and largest bytes/s over the repetitions of `name` (0 when it did not run).
  double MinRate(const std::string& name) const;
  double MaxRate(const std::string& name) const;
  // Median bytes/s over the repetitions of `name`, or 0 when it did not run.
  double MedianRate(const std::string& name) const;
  // Number of repetitions of `name` that reported a rate.
  size_t Repetitions(const std::string& name) const;

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  std::map<std::string, std::vector<double>> rates_;
};

}  // namespace estuary::bench

#endif  // ESTUARY_BENCH_BENCH_REPORT_H_
