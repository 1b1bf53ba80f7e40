#include "router/openai/openai_server.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "router/openai/api_error.h"
#include "router/openai/error_response.h"
#include "router/openai/generation_answer.h"
#include "router/openai/generation_request.h"
#include "router/openai/request_fields.h"
#include "router/openai/response_json.h"
#include "rpc/api_key.h"
#include "rpc/http_probes.h"

namespace estuary::openai {
namespace {

constexpr size_t kMaxDetokenizeIds = 1 << 20;

absl::StatusOr<nlohmann::json> ParseBody(const rpc::HttpRequest& request) {
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

  // Decides on the server's I/O thread (rpc::HttpDispatcher): no blocking here.
  rpc::HttpDispatch Dispatch(const rpc::HttpRequest& q) {
    if (std::optional<rpc::HttpResponse> probe = rpc::AnswerProbe(q, metrics_, ready_)) {
      return rpc::HttpDispatch::Answer(*std::move(probe));
    }
    // --api-key: checked before routing, so an unknown path answers 401 too (it says nothing
    // about what is served); the probes and /metrics stay open.
    if (!options_.api_key.empty() && !rpc::IsProbePath(q.path) &&
        !rpc::BearerMatches(q.Header("Authorization"), options_.api_key)) {
      rpc::HttpResponse refused =
          JsonResponse(401, ErrorJson(401, "this server needs an API key: send the header "
                                           "`Authorization: Bearer KEY`"));
      refused.headers.emplace_back("WWW-Authenticate", "Bearer");
      return rpc::HttpDispatch::Answer(std::move(refused));
    }
    if (q.method == "POST" && q.path == "/v1/completions") return Admit(Endpoint::kCompletions);
    if (q.method == "POST" && q.path == "/v1/chat/completions") return Admit(Endpoint::kChat);
    if (q.method == "GET" && q.path == "/v1/models") return rpc::HttpDispatch::Answer(Models());
    if (q.method == "POST" && q.path == "/tokenize") {
      return Short([this](const rpc::HttpRequest& r) { return Tokenize(r); });
    }
    if (q.method == "POST" && q.path == "/detokenize") {
      return Short([this](const rpc::HttpRequest& r) { return Detokenize(r); });
    }
    return rpc::HttpDispatch::Answer(
        ErrorPage(404, absl::StrCat("no such endpoint: ", q.method, " ", q.path)));
  }

 private:
  // A generation's slot: taken on admission, given back once, just before the answer's last
  // bytes go out (a client that has its answer may send the next request at once and must find
  // the slot free), or when the handler is dropped without answering.
  class Slot {
   public:
    explicit Slot(Handlers* h) : handlers_(h) {}
    ~Slot() { Release(); }
    void Release() {
      if (released_.exchange(true)) return;
      handlers_->running_.fetch_sub(1);
      handlers_->in_flight_.Add(-1);
    }

   private:
    Handlers* handlers_;
    std::atomic<bool> released_{false};
  };

  // The handler's responder, giving the slot back before the whole answer or a stream's end is
  // written (the client sees the end only after the slot is free).
  class SlotReleasingResponder : public rpc::HttpResponder {
   public:
    SlotReleasingResponder(rpc::HttpResponder& inner, Slot& slot) : inner_(inner), slot_(slot) {}
    bool Send(rpc::HttpResponse response) override {
      slot_.Release();
      return inner_.Send(std::move(response));
    }
    bool StartStream(int status, std::string content_type, rpc::HttpHeaders headers) override {
      return inner_.StartStream(status, std::move(content_type), std::move(headers));
    }
    bool Write(absl::string_view data) override { return inner_.Write(data); }
    bool Finish() override {
      slot_.Release();
      return inner_.Finish();
    }
    void OnClientGone(std::function<void()> on_gone) override {
      inner_.OnClientGone(std::move(on_gone));
    }
    bool client_gone() const override { return inner_.client_gone(); }

   private:
    rpc::HttpResponder& inner_;
    Slot& slot_;
  };

  // A slot per request, taken before the body is parsed or tokenized (admission first: a burst
  // beyond the cap costs no tokenizer work and no thread).
  rpc::HttpDispatch Admit(Endpoint endpoint) {
    if (running_.fetch_add(1) >= options_.max_concurrent_requests) {
      running_.fetch_sub(1);
      refused_busy_.Increment();
      return rpc::HttpDispatch::Answer(ErrorResponse(absl::ResourceExhaustedError(
          absl::StrCat("more than ", options_.max_concurrent_requests,
                       " requests at once (--http-max-concurrent-requests); retry later"))));
    }
    in_flight_.Add(1);
    auto slot = std::make_shared<Slot>(this);
    return rpc::HttpDispatch::Run(
        [this, slot, endpoint](const rpc::HttpRequest& q, rpc::HttpResponder& r) {
          SlotReleasingResponder releasing(r, *slot);
          Generate(q, releasing, endpoint);
        },
        /*long_running=*/true);
  }

  // A quick answer made on the short pool (it may tokenize a large body).
  static rpc::HttpDispatch Short(std::function<rpc::HttpResponse(const rpc::HttpRequest&)> answer) {
    return rpc::HttpDispatch::Run(
        [answer = std::move(answer)](const rpc::HttpRequest& q, rpc::HttpResponder& r) {
          r.Send(answer(q));
        },
        /*long_running=*/false);
  }

  rpc::HttpResponse Models() {
    nlohmann::json model = {{"id", options_.served_model},
                            {"object", "model"},
                            {"created", absl::ToUnixSeconds(started_)},
                            {"owned_by", "estuary"},
                            {"root", options_.served_model},
                            {"max_model_len", options_.context_length},
                            // Estuary's extension: bench-serve draws prompt ids below it.
                            {"vocab_size", tokenizer_.vocab_size()}};
    return JsonResponse(200, {{"object", "list"}, {"data", nlohmann::json::array({model})}});
  }

  // {"prompt": "text", "add_special_tokens": true} or {"messages": [...]} (the chat template).
  rpc::HttpResponse Tokenize(const rpc::HttpRequest& q) {
    absl::StatusOr<nlohmann::json> body = ParseBody(q);
    if (!body.ok()) return ErrorResponse(body.status());
    std::vector<int32_t> ids;
    if (Field(*body, "messages") != nullptr) {
      if (!chat_prompt_) return ErrorResponse(NoChatTemplate());
      absl::StatusOr<std::vector<int32_t>> rendered = chat_prompt_(*body);
      if (!rendered.ok()) return ErrorResponse(rendered.status());
      ids = std::move(*rendered);
    } else {
      absl::StatusOr<std::string> prompt = StringField(*body, "prompt", "");
      if (!prompt.ok()) return ErrorResponse(prompt.status());
      if (Field(*body, "prompt") == nullptr) {
        return ErrorResponse(InvalidField("prompt", "is required (or messages)"));
      }
      absl::StatusOr<bool> special = BoolField(*body, "add_special_tokens", true);
      if (!special.ok()) return ErrorResponse(special.status());
      absl::StatusOr<std::vector<int32_t>> encoded = tokenizer_.Encode(*prompt, *special);
      if (!encoded.ok()) return ErrorResponse(InvalidField("prompt", encoded.status().message()));
      ids = std::move(*encoded);
    }
    return JsonResponse(200, {{"tokens", ids},
                              {"count", ids.size()},
                              {"max_model_len", options_.context_length}});
  }

  rpc::HttpResponse Detokenize(const rpc::HttpRequest& q) {
    absl::StatusOr<nlohmann::json> body = ParseBody(q);
    if (!body.ok()) return ErrorResponse(body.status());
    if (Field(*body, "tokens") == nullptr) return ErrorResponse(InvalidField("tokens", "is required"));
    absl::StatusOr<std::vector<int64_t>> ids =
        IntsField(*body, "tokens", kMaxDetokenizeIds, 0, tokenizer_.vocab_size() - 1);
    if (!ids.ok()) return ErrorResponse(ids.status());
    const std::vector<int32_t> narrow(ids->begin(), ids->end());
    return JsonResponse(200, {{"prompt", tokenizer_.Decode(narrow)}});
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

  // On the long pool, holding the slot Admit took.
  void Generate(const rpc::HttpRequest& q, rpc::HttpResponder& r, Endpoint endpoint) {
    auto refuse = [&](const absl::Status& status) { r.Send(ErrorResponse(status)); };
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
    AnswerGeneration(*stub_, std::move(*request), std::move(envelope), options_.request_timeout, r);
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
  rpc::HttpServerOptions http;
  http.host = options_.host;
  http.port = options_.port;
  http.what = "HTTP";
  http.tls = options_.tls;
  http.max_body_bytes = options_.max_body_bytes;
  http.idle_timeout = kIdleTimeout;
  http.read_timeout = options_.read_timeout;
  http.write_timeout = options_.write_timeout;
  http.long_handler_threads = options_.max_concurrent_requests;
  http.short_handler_threads = kShortHandlerThreads;
  http.short_handler_queue = kShortQueue;
  http.error_page = ErrorPage;
  auto server = std::make_unique<rpc::HttpServer>(
      std::move(http), [h = handlers_.get()](const rpc::HttpRequest& q) { return h->Dispatch(q); });
  if (absl::Status started = server->Start(); !started.ok()) return started;
  port_ = server->port();
  address_ = server->address();
  server_ = std::move(server);
  return absl::OkStatus();
}

void OpenAiServer::Stop() {
  if (server_ == nullptr) return;
  server_->Stop();
  server_.reset();
}

}  // namespace estuary::openai
