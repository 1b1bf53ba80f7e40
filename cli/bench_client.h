#pragma once
// BenchClient: how `estuary bench-serve` talks to a server, one implementation per protocol:
//   gRPC    estuary.v1.Inference Generate (the router's gRPC port), token ids in the chunks;
//   openai  POST /v1/completions streamed as SSE (the router's --http-port, or any server that
//           speaks OpenAI, vLLM's included), prompt as token ids, `ignore_eos` and `max_tokens`
//           so that every request generates exactly output_len tokens, tokens counted from
//           `return_token_ids` (vLLM's extension) or else the final usage chunk.
// Both time a request the way `vllm bench serve` does: TTFT to the first chunk with tokens,
// one inter-token gap per later chunk, end-to-end to the end of the stream.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace estuary::cli {

// What a client learns of the served model before the run.
struct ServedModelInfo {
  std::string name;
  int context_length = 0;
  int vocab_size = 0;
};

struct RequestTiming {
  bool ok = false;
  std::string error;
  double ttft = 0;          // seconds from send to the first chunk with tokens
  double e2e = 0;           // seconds from send to the end of the stream
  std::vector<double> itl;  // seconds between consecutive chunks with tokens
  int prompt_tokens = 0;
  int output_tokens = 0;
};

class BenchClient {
 public:
  virtual ~BenchClient() = default;
  virtual absl::StatusOr<ServedModelInfo> Describe() = 0;
  // One greedy request of `prompt` for exactly `output_len` new tokens. Thread-safe.
  virtual RequestTiming Run(const std::vector<int32_t>& prompt, int output_len) = 0;
};

// `server`: host:port of the router's gRPC port; TLS verified against `ca_file` when set
// (--ssl-ca-certs). INVALID_ARGUMENT when the file does not load.
absl::StatusOr<std::unique_ptr<BenchClient>> MakeGrpcBenchClient(const std::string& server,
                                                                 const std::string& api_key,
                                                                 const std::string& ca_file = "");
// `endpoint`: http(s)://host:port/v1/completions; https verified against `ca_file` when set,
// else the system's CAs. INVALID_ARGUMENT for another scheme, no path, or a CA file that does
// not load.
absl::StatusOr<std::unique_ptr<BenchClient>> MakeOpenAiBenchClient(const std::string& endpoint,
                                                                   const std::string& api_key,
                                                                   const std::string& model,
                                                                   const std::string& ca_file = "");

}  // namespace estuary::cli
