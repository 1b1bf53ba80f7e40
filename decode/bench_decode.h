#pragma once
// BenchDecode: decode tokens/s of the batched forward pass at several batch sizes, for full
// depth (the backbone), the river with a forced exit after K backbone layers, and full int4
// (`estuary bench-decode`). Issue 18, items 1 and 6: in the same run, before and after the
// decode, it measures the machine's read ceiling (kernels::cpu::MeasureStreamRead: 1 to all the
// threads the decode runs on, prefetch, huge pages; the faster of the two counts), reports every
// row's effective weight bandwidth against it, and prints each of the issue's decode targets next
// to the measured figure with "meets" / "misses".

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kernels/cpu/stream_read.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/model/self_speculative.h"

namespace estuary {

struct BenchDecodeOptions {
  std::vector<int> batches = {1, 4, 16};
  int exit_after = 4;    // backbone layers before the forced exit of the "river" mode
  int prompt_len = 32;   // tokens prefilled per sequence before timing
  // Timed decode steps per (mode, batch), after one warm-up step; the modes run interleaved,
  // one step each in turn, and a mode's figure is its median step.
  int steps = 8;
  // Threads of the WorkerPool the decode kernels run on (the rank's pool, as in the engine), and
  // the largest thread count of the ceiling measurement. 0: the machine's hardware threads.
  int threads = 0;
  size_t stream_bytes = size_t{1} << 30;  // the ceiling's buffer, far beyond L3
  int stream_repetitions = 8;  // passes per ceiling variant: the machine is shared, the best counts
  // Issue 16's lossless mode: per batch, a "verify" row (one verification pass of
  // max_draft_tokens tokens per sequence from layer exit_after and the bonus row, batch-invariant
  // kernels, as GenerateLossless runs it) and a "lossless" row (GenerateLosslessBatch end to end, greedy,
  // lossless_tokens new tokens per sequence, drafts exiting after exit_after layers), and the
  // speedup model built from the rows. Unset: not run.
  std::optional<LosslessOptions> lossless;
  int lossless_tokens = 64;
};

struct BenchDecodeRow {
  std::string mode;  // "full", "river", "int4"
  int batch = 0;
  int backbone_layers = 0;       // layers the step ran on the backbone
  double tokens_per_second = 0;
  double bytes_per_token = 0;    // (weights read per step + KV read) / batch
  // Weight bytes read per step x steps per second, and its fraction of the ceiling.
  double effective_bytes_per_second = 0;
  double ceiling_fraction = 0;
  // "lossless" rows: drafts accepted per draft, and tokens emitted per verification pass.
  double acceptance = 0;
  double tokens_per_verification = 0;
  double paired_speedup = 0;  // median over alternating pairs of full-gen time / lossless time
};

// The speedup model of the lossless mode at one batch, from the same run's step times in units
// of a full-depth step: a round drafts k tokens (k river steps) and verifies them (one pass,
// with the bonus row); with each draft accepted with probability a, independently, it emits
// (1 - a^(k+1)) / (1 - a) tokens (k + 1 at a = 1), so
// speedup(a) = (1 - a^(k+1)) / (1 - a) / (k * river_cost + verify_cost).
struct LosslessSpeedupModel {
  int batch = 0;
  int draft_tokens = 0;   // k
  double river_cost = 0;  // river step time / full step time
  double verify_cost = 0;  // verification pass time / full step time
  double Predict(double acceptance) const;
};

// One issue-18 target: `measured` (a GB/s or a ratio of tokens/s) against `target` (>=).
struct BenchDecodeTarget {
  std::string name;
  std::string unit;  // "GB/s" or "x full"
  double target = 0;
  double measured = 0;
  bool meets() const { return measured >= target; }
};

struct BenchDecodeReport {
  int threads = 0;
  std::string weight_dtype;  // of the backbone (the LM head's dtype)
  kernels::cpu::StreamReadResult stream;
  std::vector<BenchDecodeRow> rows;
  std::vector<BenchDecodeTarget> targets;  // those whose rows were measured
  std::vector<LosslessSpeedupModel> lossless_models;  // per batch, with options.lossless
};

absl::StatusOr<BenchDecodeReport> RunBenchDecode(const LlamaModel& model, const River& river,
                                                 const BenchDecodeOptions& options);

// The issue-18 decode targets that `rows` measure: full b1 >= 30 GB/s effective; river / full
// >= 1.9x at b1, 1.4x at b4, 1.2x at b16; int4 / full >= 2.7x at b1, 1.5x at b4.
std::vector<BenchDecodeTarget> Issue18DecodeTargets(const std::vector<BenchDecodeRow>& rows);

std::string BenchDecodeJson(const BenchDecodeReport& report);
std::string BenchDecodeTable(const BenchDecodeReport& report);

}  // namespace estuary
