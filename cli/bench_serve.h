#pragma once
// `estuary bench-serve`: a load generator for a running router, over its gRPC Inference API
// (--backend grpc, the default) or its OpenAI HTTP door (--backend openai, or --endpoint
// http://host:port/v1/completions; any OpenAI-compatible server, vLLM's included). Sends
// `num_requests` requests of `input_len` random token ids with `output_len` new tokens each
// (greedy, EOS ignored, so every request generates exactly that many), arriving as a Poisson
// process of `rate` requests per second (0: all at once), at most `max_concurrency` in flight
// (0: no cap; later arrivals wait for a slot, as in `vllm bench serve --max-concurrency`).
// Reports `vllm bench serve`'s figures under its keys (cli/bench_result.h): printed as a table,
// or as one JSON object with --json, and written to `result_file` when given.

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace estuary::cli {

struct BenchServeOptions {
  std::string backend;           // grpc | openai; empty: openai with an endpoint, else grpc
  std::string server;            // host:port (grpc: the gRPC port; openai: the HTTP port)
  std::string endpoint;          // openai: the full URL (default http://<server>/v1/completions)
  std::string api_key;           // sent as a bearer token on both paths when set
  std::string ssl_ca_certs;      // --ssl-ca-certs: TLS to the router, its certificate checked
                                 // against this CA (gRPC; HTTP: https:// by default)
  double rate = 4.0;             // requests per second; 0 = all at once
  int max_concurrency = 0;       // requests in flight at most; 0 = no cap
  int num_requests = 32;
  int input_len = 64;
  int output_len = 64;
  uint64_t seed = 1;
  bool json = false;
  std::string result_file;  // the JSON result written here too, when set
};

// `options.backend`, or the one it implies when empty.
std::string BenchBackend(const BenchServeOptions& options);
absl::Status ValidateBenchServeOptions(const BenchServeOptions& options);
absl::Status RunBenchServe(const BenchServeOptions& options);

}  // namespace estuary::cli
