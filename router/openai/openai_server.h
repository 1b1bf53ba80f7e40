#pragma once
// OpenAiServer: the router's OpenAI-compatible HTTP door (--http-port). It translates
// /v1/completions and /v1/chat/completions into estuary.v1.Inference Generate calls on the
// router's own gRPC server (an in-process channel: one request path, one set of limits and
// metrics for both doors) and answers in OpenAI's JSON, or as Server-Sent Events when asked to
// stream. Also GET /v1/models, vLLM's POST /tokenize and /detokenize, and on the same port
// GET /health (readiness), /live and /metrics.
//
// Bounds: a body over max_body_bytes is 413; more than max_concurrent_requests generations at
// once is 429 (with Retry-After, decided before the body is parsed or tokenized); a request is
// given request_timeout in all; a client that sends nothing for read_timeout while a request is
// owed, or takes nothing of its answer for write_timeout, is dropped, and a connection with no
// request under way is closed after kIdleTimeout (keep-alive).
//
// Threads: the door runs on rpc/http_server.h (Boost.Beast on Asio, two I/O threads). An open
// connection holds no thread, so idle or slow clients cost a socket and a few KiB each and never
// delay a new request (README: reliability C14). A generation runs on a pool of
// max_concurrent_requests threads (admitted ones never wait for a thread; one more per choice
// runs its gRPC stream, choice_runner.h); /tokenize and /detokenize on a small pool of their
// own; /health, /live, /metrics, /v1/models and every refusal are answered at once on the I/O
// thread. A client that goes away, streaming or not, is noticed at once (the connection keeps
// reading while its answer is made) and cancels its choices (the router aborts them on both
// workers).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/common/metrics.h"
#include "core/tokenizer/tokenizer.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "rpc/certificate_reloader.h"
#include "rpc/http_server.h"

namespace estuary::openai {

// Renders a chat request's messages into prompt token ids (chat template + tokenizer), or says
// why not (no template: FAILED_PRECONDITION; a template's raise_exception: INVALID_ARGUMENT).
using ChatPromptFn = std::function<absl::StatusOr<std::vector<int32_t>>(const nlohmann::json& body)>;

struct OpenAiServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port
  std::string served_model;
  // --api-key: every path but /health, /live and /metrics wants `Authorization: Bearer KEY`
  // (401 otherwise); empty = open.
  std::string api_key;
  int context_length = 0;
  int num_layers = 0;
  int max_concurrent_requests = 256;
  size_t max_body_bytes = size_t{4} << 20;
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  absl::Duration request_timeout = absl::Minutes(10);
  // --ssl-certfile / --ssl-keyfile: HTTPS (rpc/certificate_reloader.h; re-read when they
  // change); empty: plain HTTP.
  rpc::HttpsFiles tls;
};

class OpenAiServer {
 public:
  // Keep-alive: a connection with no request under way is closed after this (as cpp-httplib
  // did before).
  static constexpr absl::Duration kIdleTimeout = absl::Seconds(5);
  // Threads for /tokenize and /detokenize (queued beyond, up to kShortQueue; then 503).
  static constexpr int kShortHandlerThreads = 8;
  static constexpr size_t kShortQueue = 1024;

  // `stub`: the router's Inference service; `tokenizer`: the served model's; `ready`: the
  // router's readiness (for /health); `chat_prompt`: null when the model has no chat template.
  // All must outlive the server.
  OpenAiServer(OpenAiServerOptions options, std::unique_ptr<estuary::v1::Inference::StubInterface> stub,
               const Tokenizer& tokenizer, std::function<bool()> ready, ChatPromptFn chat_prompt,
               common::MetricsRegistry* metrics = &common::MetricsRegistry::Global());
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds and serves; UNAVAILABLE when the port cannot be bound, INVALID_ARGUMENT when the TLS
  // files do not load.
  absl::Status Start();
  // Stops accepting and ends the connections: their generations are cancelled (idempotent; the
  // destructor calls it).
  void Stop();
  int open_connections() const { return server_ == nullptr ? 0 : server_->open_connections(); }
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  class Handlers;

  OpenAiServerOptions options_;
  std::unique_ptr<Handlers> handlers_;
  std::unique_ptr<rpc::HttpServer> server_;
  std::string address_;
  int port_ = 0;
};

}  // namespace estuary::openai
