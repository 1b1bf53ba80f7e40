#pragma once
// BenchDecode: decode tokens/s of the batched forward pass at several batch sizes, for full
// depth (the backbone), the river with a forced exit after K backbone layers, and full int4
// (`estuary bench-decode`). Prints bytes read per token and the fraction of the machine's
// streaming-read roofline, which the caller measures in the same run.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"

namespace estuary {

struct BenchDecodeOptions {
  std::vector<int> batches = {1, 4, 16};
  int exit_after = 4;    // backbone layers before the forced exit of the "river" mode
  int prompt_len = 32;   // tokens prefilled per sequence before timing
  int steps = 8;         // timed decode steps per (mode, batch), after one warm-up step
};

struct BenchDecodeRow {
  std::string mode;  // "full", "river", "int4"
  int batch = 0;
  double tokens_per_second = 0;
  double bytes_per_token = 0;     // weights read per step (+ KV read) / batch
  double roofline_fraction = 0;   // achieved bytes/s over streaming-read bytes/s
};

// `stream_bytes_per_second`: the streaming-read bandwidth measured in the same run.
absl::StatusOr<std::vector<BenchDecodeRow>> RunBenchDecode(const LlamaModel& model,
                                                           const River& river,
                                                           const BenchDecodeOptions& options,
                                                           double stream_bytes_per_second);

std::string BenchDecodeJson(const std::vector<BenchDecodeRow>& rows, double stream_gbps);
std::string BenchDecodeTable(const std::vector<BenchDecodeRow>& rows, double stream_gbps);

}  // namespace estuary
