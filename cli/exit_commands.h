#pragma once
// `estuary eval-exit` and `estuary bench-decode`: fidelity and speed of the exit river.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/river_options.h"
#include "decode/bench_decode.h"
#include "decode/eval_exit.h"

namespace estuary::cli {

struct EvalExitCommandOptions {
  std::string model;
  std::string prompts_file;  // one prompt per line; blank lines skipped
  std::vector<float> taus;
  int max_tokens = 64;
  RiverOptions river;
  std::optional<LosslessOptions> lossless;  // --exit-mode lossless: lossless rows as well
  bool json = false;
  int threads = 0;
};

struct BenchDecodeCommandOptions {
  std::string model;
  BenchDecodeOptions bench;
  RiverOptions river;
  bool json = false;
  int threads = 0;
};

absl::Status RunEvalExitCommand(const EvalExitCommandOptions& options);
absl::Status RunBenchDecodeCommand(const BenchDecodeCommandOptions& options);

}  // namespace estuary::cli
