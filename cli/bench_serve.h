#pragma once
// `estuary bench-serve`: a load generator for a running router (the public Generate API).
// Sends `num_requests` requests of `input_len` random token ids with `output_len` new tokens
// each (EOS ignored, so every request generates exactly that many), arriving as a Poisson
// process of `rate` requests per second (0: all at once), each on its own stream. Reports
// time to first token, inter-token latency and end-to-end latency (p50, p99), output tokens per
// second over the whole run, and errors.

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace estuary::cli {

struct BenchServeOptions {
  std::string server;
  double rate = 4.0;       // requests per second; 0 = all at once
  int num_requests = 32;
  int input_len = 64;
  int output_len = 64;
  uint64_t seed = 1;
  bool json = false;
};

absl::Status ValidateBenchServeOptions(const BenchServeOptions& options);
absl::Status RunBenchServe(const BenchServeOptions& options);

}  // namespace estuary::cli
