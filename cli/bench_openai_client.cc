// bench-serve over OpenAI HTTP: POST /v1/completions streamed as SSE (cli/bench_client.h).
#include <chrono>

#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/bench_client.h"
#include "cli/sse_reader.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "rpc/tls_files.h"

namespace estuary::cli {
namespace {

struct HttpEndpoint {
  std::string base;         // http://host:port
  std::string path;         // /v1/completions
  std::string models_path;  // /v1/models, beside it
};

absl::StatusOr<HttpEndpoint> ParseEndpoint(const std::string& url) {
  absl::string_view rest = url;
  std::string scheme = "http://";
  if (absl::ConsumePrefix(&rest, "https://")) {
    scheme = "https://";
  } else if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--endpoint '", url, "': give an http:// or https:// URL such as "
        "http://127.0.0.1:8000/v1/completions"));
  }
  const size_t slash = rest.find('/');
  const absl::string_view authority = rest.substr(0, slash);
  if (authority.empty() || slash == absl::string_view::npos || rest.size() == slash + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--endpoint '", url,
        "': needs a host and a path, e.g. http://127.0.0.1:8000/v1/completions"));
  }
  const size_t colon = authority.rfind(':');
  int port = 0;
  if (colon != absl::string_view::npos &&
      (!absl::SimpleAtoi(authority.substr(colon + 1), &port) || port < 1 || port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("--endpoint '", url, "': bad port"));
  }
  HttpEndpoint endpoint;
  endpoint.base = absl::StrCat(scheme, authority);
  endpoint.path = std::string(rest.substr(slash));
  absl::string_view dir = endpoint.path;
  if (!absl::ConsumeSuffix(&dir, "/chat/completions")) {
    absl::ConsumeSuffix(&dir, "/completions");
  }
  endpoint.models_path = absl::StrCat(dir == endpoint.path ? "/v1" : dir, "/models");
  return endpoint;
}

std::string Dump(const nlohmann::json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class OpenAiBenchClient final : public BenchClient {
 public:
  OpenAiBenchClient(HttpEndpoint endpoint, const std::string& api_key, std::string model,
                    std::string ca_file)
      : endpoint_(std::move(endpoint)), model_(std::move(model)), ca_file_(std::move(ca_file)) {
    if (!api_key.empty()) headers_.emplace("Authorization", absl::StrCat("Bearer ", api_key));
  }

  absl::StatusOr<ServedModelInfo> Describe() override {
    httplib::Client client(endpoint_.base);
    TrustCa(client);
    client.set_connection_timeout(std::chrono::seconds(10));
    client.set_read_timeout(std::chrono::seconds(10));
    const httplib::Result result = client.Get(endpoint_.models_path.c_str(), headers_);
    const std::string where = absl::StrCat(endpoint_.base, endpoint_.models_path);
    if (!result) {
      return absl::UnavailableError(
          absl::StrCat("GET ", where, ": ", httplib::to_string(result.error())));
    }
    if (result->status != 200) {
      return absl::UnavailableError(
          absl::StrCat("GET ", where, ": HTTP ", result->status, " ", result->body));
    }
    const nlohmann::json body = nlohmann::json::parse(result->body, nullptr, false);
    const nlohmann::json* model = nullptr;
    if (body.is_object() && body.contains("data") && body["data"].is_array()) {
      for (const nlohmann::json& m : body["data"]) {
        if (m.is_object() && m.value("id", "") != "" && (model_.empty() || m["id"] == model_)) {
          model = &m;
          break;
        }
      }
    }
    if (model == nullptr) {
      return absl::NotFoundError(absl::StrCat("GET ", where, " lists no model",
                                              model_.empty() ? "" : " named " + model_));
    }
    ServedModelInfo info;
    info.name = (*model)["id"].get<std::string>();
    auto number = [&](const char* key) {
      const auto it = model->find(key);
      return it != model->end() && it->is_number_integer() ? it->get<int>() : 0;
    };
    info.context_length = number("max_model_len");
    info.vocab_size = number("vocab_size");  // Estuary's extension; 0 elsewhere
    model_ = info.name;
    return info;
  }

  RequestTiming Run(const std::vector<int32_t>& prompt, int output_len) override {
    const nlohmann::json body = {{"model", model_},
                                 {"prompt", prompt},
                                 {"max_tokens", output_len},
                                 {"temperature", 0.0},
                                 {"ignore_eos", true},
                                 {"stream", true},
                                 {"stream_options", {{"include_usage", true}}},
                                 {"return_token_ids", true}};
    httplib::Client client(endpoint_.base);
    TrustCa(client);
    client.set_connection_timeout(std::chrono::seconds(10));
    client.set_read_timeout(std::chrono::minutes(10));
    client.set_write_timeout(std::chrono::seconds(30));
    httplib::Request request;
    request.method = "POST";
    request.path = endpoint_.path;
    request.headers = headers_;
    request.headers.emplace("Content-Type", "application/json");
    request.headers.emplace("Accept", "text/event-stream");
    request.body = Dump(body);

    RequestTiming timing;
    timing.prompt_tokens = static_cast<int>(prompt.size());
    int status = 0;
    std::string error_body;
    bool done = false;
    bool usage_seen = false;
    int chunk_tokens = 0;  // from token_ids
    int content_chunks = 0;
    const absl::Time start = absl::Now();
    absl::Time last = start;
    SseReader sse([&](const std::string& data) {
      if (data == "[DONE]") {
        done = true;
        return;
      }
      const nlohmann::json event = nlohmann::json::parse(data, nullptr, false);
      if (!event.is_object()) {
        if (timing.error.empty()) timing.error = "an SSE event that is not a JSON object";
        return;
      }
      if (event.contains("error")) {
        if (timing.error.empty()) timing.error = Dump(event["error"]);
        return;
      }
      int tokens = 0;
      bool content = false;
      if (event.contains("choices") && event["choices"].is_array()) {
        for (const nlohmann::json& choice : event["choices"]) {
          if (!choice.is_object()) continue;
          const auto ids = choice.find("token_ids");
          if (ids != choice.end() && ids->is_array()) tokens += static_cast<int>(ids->size());
          const auto text = choice.find("text");
          if (text != choice.end() && text->is_string() && !text->get<std::string>().empty()) {
            content = true;
          }
        }
      }
      const auto usage = event.find("usage");
      if (usage != event.end() && usage->is_object()) {
        usage_seen = true;
        timing.output_tokens = usage->value("completion_tokens", 0);
        timing.prompt_tokens = usage->value("prompt_tokens", timing.prompt_tokens);
      }
      if (tokens == 0 && !content) return;
      const absl::Time now = absl::Now();
      if (content_chunks == 0) {
        timing.ttft = absl::ToDoubleSeconds(now - start);
      } else {
        timing.itl.push_back(absl::ToDoubleSeconds(now - last));
      }
      last = now;
      ++content_chunks;
      chunk_tokens += tokens;
    });
    request.response_handler = [&](const httplib::Response& response) {
      status = response.status;
      return true;
    };
    request.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status != 200) {
        if (error_body.size() < 4096) error_body.append(data, n);
      } else {
        sse.Feed(absl::string_view(data, n));
      }
      return true;
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    const bool sent = client.send(request, response, error);
    timing.e2e = absl::ToDoubleSeconds(absl::Now() - start);
    if (!usage_seen) timing.output_tokens = chunk_tokens > 0 ? chunk_tokens : content_chunks;
    if (!sent) {
      timing.error = absl::StrCat("POST ", endpoint_.path, ": ", httplib::to_string(error));
    } else if (status != 200) {
      timing.error = absl::StrCat("HTTP ", status, ": ", error_body);
    } else if (timing.error.empty() && !done) {
      timing.error = "the stream ended without data: [DONE]";
    }
    timing.ok = timing.error.empty();
    return timing;
  }

 private:
  // https: the server's certificate must chain to --ssl-ca-certs when given (else to the
  // system's CAs) and name the host.
  void TrustCa(httplib::Client& client) const {
    if (!ca_file_.empty()) client.set_ca_cert_path(ca_file_.c_str());
  }

  const HttpEndpoint endpoint_;
  std::string model_;  // set by Describe before any Run
  const std::string ca_file_;
  httplib::Headers headers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchClient>> MakeOpenAiBenchClient(const std::string& endpoint,
                                                                   const std::string& api_key,
                                                                   const std::string& model,
                                                                   const std::string& ca_file) {
  absl::StatusOr<HttpEndpoint> parsed = ParseEndpoint(endpoint);
  if (!parsed.ok()) return parsed.status();
  if (!ca_file.empty()) {
    if (absl::Status s = rpc::CheckCaFile(ca_file, "ssl-ca-certs"); !s.ok()) return s;
  }
  return std::unique_ptr<BenchClient>(
      std::make_unique<OpenAiBenchClient>(std::move(*parsed), api_key, model, ca_file));
}

}  // namespace estuary::cli
