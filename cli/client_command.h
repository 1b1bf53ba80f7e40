#pragma once
// `estuary client`: one Generate call on a router (the public estuary.v1.Inference API), printing
// the text as it streams, or one JSON object with the ids, text, finish reason, usage and timings.

#include <string>

#include "absl/status/status.h"
#include "core/sampling/sampler.h"

namespace estuary::cli {

struct ClientOptions {
  std::string server;  // host:port of the router
  std::string prompt;
  int max_tokens = 256;
  SamplingParams sampling;
  float exit_threshold = 0.0f;  // 0: the server's default
  bool stream = true;           // print text deltas as they arrive (text mode)
  bool json = false;
  double timeout_seconds = 300;
  std::string api_key;          // sent as `authorization: Bearer KEY` when set
  std::string ssl_ca_certs;     // --ssl-ca-certs: TLS, the router's certificate checked against it
};

absl::Status RunClient(const ClientOptions& options);

}  // namespace estuary::cli
