#pragma once
// `estuary generate`: load a model, run one prompt, print the completion (or one JSON object).

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "cli/river_options.h"
#include "core/backend/device.h"
#include "core/model/self_speculative.h"
#include "core/sampling/sampler.h"
#include "core/tensor/dtype.h"

namespace estuary::cli {

struct GenerateOptions {
  std::string model;  // resolved path
  std::string prompt;
  int max_tokens = 256;
  SamplingParams sampling;
  std::optional<DType> dtype;
  bool json = false;
  // --threads: the CPU threads the kernels and the GEMM library run on, all the ranks together;
  // 0: every core.
  int threads = 0;
  // --river: decode through the paged engine with the exit river (policy and quantization from
  // the river flags); otherwise the plain full-depth path.
  bool river = false;
  RiverOptions river_options;
  // --tensor-parallel-size: ranks (threads of this process, each with threads / N kernel threads).
  // Above 1 generation runs on a ShardedModel (one contiguous cache per rank; with --river the
  // exit decision is taken per step on every rank alike).
  int tensor_parallel_size = 1;
  // --exit-mode lossless (with --river): the river drafts, the backbone verifies
  // (core/model/self_speculative.h), on the CPU ranks of a ShardedModel at any TP size.
  std::optional<LosslessOptions> lossless;
  // --device: cpu, or cuda[:N] to run the decode engine's steps on that GPU (a CUDA build only).
  Device device;
};

absl::Status ValidateGenerateOptions(const GenerateOptions& options);
absl::Status RunGenerate(const GenerateOptions& options);

}  // namespace estuary::cli
