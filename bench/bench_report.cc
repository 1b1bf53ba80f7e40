#include "bench/bench_report.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>

#include "core/kernels/cpu/stream_read.h"

namespace estuary::bench {
namespace {

void BM_StreamRead(benchmark::State& state, const Pool* pool) {
  const auto* data = reinterpret_cast<const uint8_t*>(pool->data.get());
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::cpu::StreamSum(data, pool->bytes));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(pool->bytes));
}

// madvise(MADV_HUGEPAGE) over the whole pages inside [p, p + bytes) (the allocation is only
// cache-line aligned). Returns false when madvise fails.
bool AdviseHugePages(void* p, size_t bytes) {
  constexpr uintptr_t kPage = 4096;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kPage - 1);
  if (end <= begin) return true;
  return madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0;
}

void FillPool(Pool& pool) {
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

}  // namespace

std::vector<char*> ParseArgs(int argc, char** argv, bool& json,
                             std::initializer_list<SizeFlag> sizes) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
      continue;
    }
    bool taken = false;
    for (const SizeFlag& flag : sizes) {
      const size_t len = std::strlen(flag.prefix);
      if (std::strncmp(argv[i], flag.prefix, len) == 0) {
        *flag.value = static_cast<size_t>(std::strtoull(argv[i] + len, nullptr, 10));
        taken = true;
        break;
      }
    }
    if (!taken) args.push_back(argv[i]);
  }
  return args;
}

bool InitBenchmark(std::vector<char*>& args) {
  static char repetitions[] = "--benchmark_repetitions=5";
  static char interleave[] = "--benchmark_enable_random_interleaving=true";
  const auto has_flag = [&](const char* prefix) {
    return std::any_of(args.begin(), args.end(), [&](const char* arg) {
      return std::strncmp(arg, prefix, std::strlen(prefix)) == 0;
    });
  };
  if (!has_flag("--benchmark_repetitions")) args.push_back(repetitions);
  if (!has_flag("--benchmark_enable_random_interleaving")) args.push_back(interleave);
  int bench_argc = static_cast<int>(args.size());
  benchmark::Initialize(&bench_argc, args.data());
  return !benchmark::ReportUnrecognizedArguments(bench_argc, args.data());
}

bool InitPool(size_t pool_mib, bool note_small_pages, Pool& pool) {
  pool.bytes = pool_mib << 20;
  pool.data = hwy::AllocateAligned<uint16_t>(pool.bytes / sizeof(uint16_t));
  if (!pool.data) {
    std::fprintf(stderr, "cannot allocate %zu MiB\n", pool_mib);
    return false;
  }
  if (!AdviseHugePages(pool.data.get(), pool.bytes) && note_small_pages) {
    std::fprintf(stderr, "note: madvise(MADV_HUGEPAGE) failed; using small pages\n");
  }
  FillPool(pool);
  return true;
}

std::vector<float> Activations(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  return x;
}

void RegisterStreamRead(const Pool* pool) {
  benchmark::RegisterBenchmark("stream_read", BM_StreamRead, pool)
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.3);
}

CapturingReporter::CapturingReporter(bool json) {
  auto console =
      std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_Tabular);
  if (json) console->SetOutputStream(&std::cerr);
  inner_ = std::move(console);
}

bool CapturingReporter::ReportContext(const Context& context) {
  return inner_->ReportContext(context);
}

void CapturingReporter::ReportRuns(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
    const auto it = run.counters.find("bytes_per_second");
    if (it != run.counters.end()) rates_[run.run_name.function_name].push_back(it->second.value);
  }
  inner_->ReportRuns(runs);
}

void CapturingReporter::Finalize() { inner_->Finalize(); }

double CapturingReporter::MinRate(const std::string& name) const {
  const auto it = rates_.find(name);
  return it == rates_.end() ? 0.0 : *std::min_element(it->second.begin(), it->second.end());
}

double CapturingReporter::MaxRate(const std::string& name) const {
  const auto it = rates_.find(name);
  return it == rates_.end() ? 0.0 : *std::max_element(it->second.begin(), it->second.end());
}

double CapturingReporter::MedianRate(const std::string& name) const {
  const auto it = rates_.find(name);
  if (it == rates_.end() || it->second.empty()) return 0.0;
  std::vector<double> v = it->second;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

size_t CapturingReporter::Repetitions(const std::string& name) const {
  const auto it = rates_.find(name);
  return it == rates_.end() ? 0 : it->second.size();
}

}  // namespace estuary::bench
