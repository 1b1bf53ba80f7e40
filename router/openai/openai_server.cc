#include "router/openai/openai_server.h"

#include <limits>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "httplib.h"
#include "router/openai/api_error.h"
#include "router/openai/error_response.h"
#include "router/openai/generation_answer.h"
#include "router/openai/generation_request.h"
#include "router/openai/request_fields.h"
#include "router/openai/response_json.h"
#include "rpc/api_key.h"
#include "rpc/http_serving.h"

namespace estuary::openai {
namespace {

constexpr char kJson[] = "application/json";
constexpr size_t kMaxDetokenizeIds = 1 << 20;

void SetJson(httplib::Response& response, int status, const nlohmann::json& body) {
  response.status = status;
  response.set_content(Dump(body), kJson);
}

absl::StatusOr<nlohmann::json> ParseBody(const httplib::Request& request) {
  nlohmann::json body = nlohmann::json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return InvalidField("body", "is not valid JSON (UTF-8 text, one JSON value)");
  }
  if (!body.is_object()) return InvalidField("body", "must be a JSON object");
  return body;
}

std::string RandomHex() {
  thread_local absl::BitGen random;
  return absl::StrFormat("%016x%08x", absl::Uniform<uint64_t>(random),
                         absl::Uniform<uint32_t>(random));
}

}  // namespace

class OpenAiServer::Handlers {
 public:
  Handlers(const OpenAiServerOptions& options,
           std::unique_ptr<estuary::v1::Inference::StubInterface> stub, const Tokenizer& tokenizer,
           std::function<bool()> ready, ChatPromptFn chat_prompt, common::MetricsRegistry* metrics)
      : options_(options),
        stub_(std::move(stub)),
        tokenizer_(tokenizer),
        ready_(std::move(ready)),
        chat_prompt_(std::move(chat_prompt)),
        metrics_(metrics),
        refused_busy_(metrics->GetCounter(
            "estuary:http_requests_refused_total",
            "HTTP generation requests refused with 429 (--http-max-concurrent-requests)")),
        in_flight_(metrics->GetGauge("estuary:http_requests_running",
                                     "HTTP generation requests being answered")) {}

  void Install(httplib::Server& server) {
    server.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
      Generate(q, r, Endpoint::kCompletions);
    });
    server.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
      Generate(q, r, Endpoint::kChat);
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) { Models(r); });
    server.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) {
      Tokenize(q, r);
    });
    server.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) {
      Detokenize(q, r);
    });
    rpc::AddHealthAndMetricsRoutes(server, metrics_, ready_);
    // --api-key: checked before routing, so an unknown path answers 401 too (it says nothing
    // about what is served); the probes and /metrics stay open.
    server.set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& r) {
      if (options_.api_key.empty() || q.path == "/health" || q.path == "/live" ||
          q.path == "/metrics" ||
          rpc::BearerMatches(q.get_header_value("Authorization"), options_.api_key)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      r.set_header("WWW-Authenticate", "Bearer");
      SetJson(r, 401,
              ErrorJson(401, "this server needs an API key: send the header "
                             "`Authorization: Bearer KEY`"));
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib makes itself (404 no route, 413 too large, 400 bad request line, 405):
    // OpenAI's shape, when no handler wrote a body.
    server.set_error_handler([this](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      std::string message = absl::StrCat("HTTP ", r.status);
      if (r.status == 404) message = absl::StrCat("no such endpoint: ", q.method, " ", q.path);
      if (r.status == 413) {
        message = absl::StrCat("the body is larger than ", options_.max_body_bytes, " bytes");
      }
      r.set_content(Dump(ErrorJson(r.status, message)), kJson);
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& r, std::exception_ptr) {
          r.status = 500;
          r.set_content(Dump(ErrorJson(500, "internal error")), kJson);
        });
  }

 private:
  void Models(httplib::Response& r) {
    nlohmann::json model = {{"id", options_.served_model},
                            {"object", "model"},
                            {"created", absl::ToUnixSeconds(started_)},
                            {"owned_by", "estuary"},
                            {"root", options_.served_model},
                            {"max_model_len", options_.context_length},
                            // Estuary's extension: bench-serve draws prompt ids below it.
                            {"vocab_size", tokenizer_.vocab_size()}};
    SetJson(r, 200, {{"object", "list"}, {"data", nlohmann::json::array({model})}});
  }

  // {"prompt": "text", "add_special_tokens": true} or {"messages": [...]} (the chat template).
  void Tokenize(const httplib::Request& q, httplib::Response& r) {
    absl::StatusOr<nlohmann::json> body = ParseBody(q);
    if (!body.ok()) return SetErrorResponse(r, body.status());
    std::vector<int32_t> ids;
    if (Field(*body, "messages") != nullptr) {
      if (!chat_prompt_) return SetErrorResponse(r, NoChatTemplate());
      absl::StatusOr<std::vector<int32_t>> rendered = chat_prompt_(*body);
      if (!rendered.ok()) return SetErrorResponse(r, rendered.status());
      ids = std::move(*rendered);
    } else {
      absl::StatusOr<std::string> prompt = StringField(*body, "prompt", "");
      if (!prompt.ok()) return SetErrorResponse(r, prompt.status());
      if (Field(*body, "prompt") == nullptr) {
        return SetErrorResponse(r, InvalidField("prompt", "is required (or messages)"));
      }
      absl::StatusOr<bool> special = BoolField(*body, "add_special_tokens", true);
      if (!special.ok()) return SetErrorResponse(r, special.status());
      absl::StatusOr<std::vector<int32_t>> encoded = tokenizer_.Encode(*prompt, *special);
      if (!encoded.ok()) return SetErrorResponse(r, InvalidField("prompt", encoded.status().message()));
      ids = std::move(*encoded);
    }
    SetJson(r, 200, {{"tokens", ids},
                     {"count", ids.size()},
                     {"max_model_len", options_.context_length}});
  }

  void Detokenize(const httplib::Request& q, httplib::Response& r) {
    absl::StatusOr<nlohmann::json> body = ParseBody(q);
    if (!body.ok()) return SetErrorResponse(r, body.status());
    if (Field(*body, "tokens") == nullptr) return SetErrorResponse(r, InvalidField("tokens", "is required"));
    absl::StatusOr<std::vector<int64_t>> ids =
        IntsField(*body, "tokens", kMaxDetokenizeIds, 0, tokenizer_.vocab_size() - 1);
    if (!ids.ok()) return SetErrorResponse(r, ids.status());
    const std::vector<int32_t> narrow(ids->begin(), ids->end());
    SetJson(r, 200, {{"prompt", tokenizer_.Decode(narrow)}});
  }

  absl::Status NoChatTemplate() const {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", options_.served_model,
        " has no chat template (tokenizer_config.json has no chat_template): start the router "
        "with --chat-template FILE, or use /v1/completions"));
  }

  absl::StatusOr<GenerationRequest> Parse(const nlohmann::json& body, Endpoint endpoint) {
    if (endpoint == Endpoint::kCompletions) return ParseCompletionRequest(body);
    GenerationRequest request;
    ESTUARY_ASSIGN_OR_RETURN(estuary::v1::GenerateRequest sampling,
                             ParseSampling(body, /*max_tokens_default=*/0, request));
    if (request.echo) return InvalidField("echo", "applies to /v1/completions only");
    const nlohmann::json* messages = Field(body, "messages");
    if (messages == nullptr || !messages->is_array() || messages->empty()) {
      return InvalidField("messages", "must be a non-empty list of messages");
    }
    if (!chat_prompt_) return NoChatTemplate();
    ESTUARY_ASSIGN_OR_RETURN(std::vector<int32_t> ids, chat_prompt_(body));
    estuary::v1::GenerateRequest input;
    for (int32_t id : ids) input.mutable_tokens()->add_ids(id);
    ExpandChoices({input}, sampling, request);
    return request;
  }

  void Generate(const httplib::Request& q, httplib::Response& r, Endpoint endpoint) {
    // A slot per request, taken before the body is parsed or tokenized (admission first: a
    // burst beyond the cap costs no tokenizer work) and released when its answer is written or
    // abandoned.
    if (running_.fetch_add(1) >= options_.max_concurrent_requests) {
      running_.fetch_sub(1);
      refused_busy_.Increment();
      return SetErrorResponse(r, absl::ResourceExhaustedError(absl::StrCat(
                             "more than ", options_.max_concurrent_requests,
                             " requests at once (--http-max-concurrent-requests); retry later")));
    }
    in_flight_.Add(1);
    auto release = [this] {
      running_.fetch_sub(1);
      in_flight_.Add(-1);
    };
    auto refuse = [&](const absl::Status& status) {
      release();
      SetErrorResponse(r, status);
    };
    absl::StatusOr<nlohmann::json> body = ParseBody(q);
    if (!body.ok()) return refuse(body.status());
    absl::StatusOr<GenerationRequest> request = Parse(*body, endpoint);
    if (!request.ok()) return refuse(request.status());
    if (!request->model.empty() && request->model != options_.served_model) {
      return refuse(absl::NotFoundError(absl::StrCat("model ", request->model,
                                                     " is not served here; this server serves ",
                                                     options_.served_model)));
    }
    ResponseEnvelope envelope;
    envelope.endpoint = endpoint;
    envelope.id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", RandomHex());
    envelope.created = absl::ToUnixSeconds(absl::Now());
    envelope.model = options_.served_model;
    envelope.n = request->n;
    envelope.num_layers = options_.num_layers;
    envelope.return_token_ids = request->return_token_ids;
    envelope.logprobs = request->logprobs;
    if (request->logprobs >= 0) {
      envelope.piece = [this](int32_t prev_id, int32_t id) {
        return tokenizer_.TokenBytes(prev_id < 0 ? tokenizer_.bos_id() : prev_id, id);
      };
    }
    if (request->echo) {
      for (const estuary::v1::GenerateRequest& choice : request->choices) {
        request->echo_texts.push_back(
            choice.has_text() ? choice.text()
                              : tokenizer_.Decode(absl::MakeConstSpan(choice.tokens().ids().data(),
                                                                      choice.tokens().ids_size())));
      }
    }
    AnswerGeneration(*stub_, std::move(*request), std::move(envelope), options_.request_timeout, r,
                     release);
  }

  const OpenAiServerOptions& options_;
  std::unique_ptr<estuary::v1::Inference::StubInterface> stub_;
  const Tokenizer& tokenizer_;
  std::function<bool()> ready_;
  ChatPromptFn chat_prompt_;
  common::MetricsRegistry* metrics_;
  common::Counter& refused_busy_;
  common::Gauge& in_flight_;
  std::atomic<int> running_{0};
  const absl::Time started_ = absl::Now();
};

OpenAiServer::OpenAiServer(OpenAiServerOptions options,
                           std::unique_ptr<estuary::v1::Inference::StubInterface> stub,
                           const Tokenizer& tokenizer, std::function<bool()> ready,
                           ChatPromptFn chat_prompt, common::MetricsRegistry* metrics)
    : options_(std::move(options)),
      handlers_(std::make_unique<Handlers>(options_, std::move(stub), tokenizer, std::move(ready),
                                           std::move(chat_prompt), metrics)) {}

OpenAiServer::~OpenAiServer() { Stop(); }

absl::Status OpenAiServer::Start() {
  if (server_ != nullptr) return absl::FailedPreconditionError("the HTTP server already runs");
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<httplib::Server> server, rpc::NewHttpServer(options_.tls));
  const size_t threads = static_cast<size_t>(options_.max_concurrent_requests) + kSpareThreads;
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server->set_payload_max_length(options_.max_body_bytes);
  server->set_read_timeout(absl::ToChronoSeconds(options_.read_timeout));
  server->set_write_timeout(absl::ToChronoSeconds(options_.write_timeout));
  server->set_keep_alive_timeout(5);
  server->set_tcp_nodelay(true);
  handlers_->Install(*server);
  absl::StatusOr<int> bound =
      rpc::BindAndServe(*server, options_.host, options_.port, "HTTP", thread_);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  address_ = absl::StrCat(options_.host, ":", port_);
  server_ = std::move(server);
  return absl::OkStatus();
}

void OpenAiServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace estuary::openai
