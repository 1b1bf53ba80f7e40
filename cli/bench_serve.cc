#include "cli/bench_serve.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/bench_client.h"
#include "cli/bench_result.h"
#include "core/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace estuary::cli {
namespace {

// Without the served model's vocabulary size (an OpenAI server that does not say it), prompts
// use ids below this, which every real vocabulary has.
constexpr int kFallbackVocab = 256;

// The requests released so far (by their arrival times) and the workers that take them: at
// most `workers` run at once.
class Dispatch {
 public:
  explicit Dispatch(int total) : total_(total) {}
  void Release() {
    absl::MutexLock lock(&mu_);
    ++released_;
  }
  // The next released request's index, waiting for one; -1 once all were taken.
  int Take() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return taken_ < released_ || taken_ == total_;
    };
    mu_.Await(absl::Condition(&ready));
    return taken_ == total_ ? -1 : taken_++;
  }

 private:
  const int total_;
  absl::Mutex mu_;
  int released_ ABSL_GUARDED_BY(mu_) = 0;
  int taken_ ABSL_GUARDED_BY(mu_) = 0;
};

std::string OpenAiEndpoint(const BenchServeOptions& options) {
  if (!options.endpoint.empty()) return options.endpoint;
  return absl::StrCat(options.ssl_ca_certs.empty() ? "http://" : "https://", options.server,
                      "/v1/completions");
}

absl::StatusOr<std::unique_ptr<BenchClient>> MakeClient(const BenchServeOptions& options) {
  if (BenchBackend(options) == "grpc") {
    return MakeGrpcBenchClient(options.server, options.api_key, options.ssl_ca_certs);
  }
  return MakeOpenAiBenchClient(OpenAiEndpoint(options), options.api_key, /*model=*/"",
                               options.ssl_ca_certs);
}

void PrintTable(const nlohmann::json& r) {
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %s\n", "Backend:", r["backend"].get<std::string>().c_str());
  std::printf("%-40s %d\n", "Successful requests:", r["completed"].get<int>());
  std::printf("%-40s %d\n", "Failed requests:", r["failed"].get<int>());
  if (!r["first_error"].get<std::string>().empty()) {
    std::printf("%-40s %s\n", "First error:", r["first_error"].get<std::string>().c_str());
  }
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", r["duration"].get<double>());
  std::printf("%-40s %lld\n", "Total input tokens:", r["total_input_tokens"].get<long long>());
  std::printf("%-40s %lld\n", "Total generated tokens:", r["total_output_tokens"].get<long long>());
  std::printf("%-40s %.2f\n", "Request throughput (req/s):", r["request_throughput"].get<double>());
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s):",
              r["output_throughput"].get<double>());
  std::printf("%-40s %.2f\n", "Total token throughput (tok/s):",
              r["total_token_throughput"].get<double>());
  const struct {
    const char* key;
    const char* title;
    const char* short_name;
  } sections[] = {{"ttft", "Time to First Token", "TTFT"},
                  {"tpot", "Time per Output Token (excl. 1st token)", "TPOT"},
                  {"itl", "Inter-token Latency", "ITL"},
                  {"e2el", "End-to-end Latency", "E2EL"}};
  for (const auto& s : sections) {
    std::printf("%s\n", absl::StrCat("---- ", s.title, " ----").c_str());
    for (const auto& [stat, label] : {std::pair<const char*, const char*>{"mean", "Mean"},
                                      {"median", "Median"},
                                      {"p99", "P99"}}) {
      std::printf("%-40s %.2f\n", absl::StrCat(label, " ", s.short_name, " (ms):").c_str(),
                  r[absl::StrCat(stat, "_", s.key, "_ms")].get<double>());
    }
  }
  std::printf("==================================================\n");
}

}  // namespace

std::string BenchBackend(const BenchServeOptions& options) {
  if (!options.backend.empty()) return options.backend;
  return options.endpoint.empty() ? "grpc" : "openai";
}

absl::Status ValidateBenchServeOptions(const BenchServeOptions& options) {
  const std::string backend = BenchBackend(options);
  if (backend != "grpc" && backend != "openai") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend '", options.backend, "': use grpc or openai"));
  }
  if (backend == "grpc" && !options.endpoint.empty()) {
    return absl::InvalidArgumentError("--endpoint is for --backend openai (HTTP)");
  }
  if (options.server.empty() && options.endpoint.empty()) {
    return absl::InvalidArgumentError(
        "bench-serve needs --server HOST:PORT (or, for HTTP, --endpoint "
        "http://HOST:PORT/v1/completions)");
  }
  if (options.rate < 0) return absl::InvalidArgumentError("--rate must be >= 0");
  if (options.max_concurrency < 0) {
    return absl::InvalidArgumentError("--max-concurrency must be >= 0 (0: no cap)");
  }
  if (options.num_requests < 1 || options.num_requests > 100000) {
    return absl::InvalidArgumentError("--num-requests must be in [1, 100000]");
  }
  if (options.input_len < 1 || options.output_len < 1) {
    return absl::InvalidArgumentError("--input-len and --output-len must be >= 1");
  }
  return absl::OkStatus();
}

absl::Status RunBenchServe(const BenchServeOptions& options) {
  ESTUARY_RETURN_IF_ERROR(ValidateBenchServeOptions(options));
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<BenchClient> client, MakeClient(options));
  ESTUARY_ASSIGN_OR_RETURN(const ServedModelInfo info, client->Describe());
  if (info.context_length > 0 && options.input_len + options.output_len > info.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("--input-len + --output-len = ",
                                                   options.input_len + options.output_len,
                                                   " exceeds the model's context of ",
                                                   info.context_length));
  }
  // The same seed gives the same prompts on both backends.
  std::mt19937_64 rng(options.seed);
  const int vocab = info.vocab_size > 0 ? info.vocab_size : kFallbackVocab;
  // Ids past the first few (BOS/EOS and friends) of the vocabulary.
  std::uniform_int_distribution<int32_t> token(3, std::max(3, vocab - 1));
  std::exponential_distribution<double> gap(options.rate > 0 ? options.rate : 1.0);
  const size_t n = static_cast<size_t>(options.num_requests);
  std::vector<std::vector<int32_t>> prompts(n);
  for (std::vector<int32_t>& prompt : prompts) {
    prompt.resize(static_cast<size_t>(options.input_len));
    for (int32_t& t : prompt) t = token(rng);
  }
  std::vector<absl::Duration> arrivals(n, absl::ZeroDuration());
  for (size_t i = 1; i < n && options.rate > 0; ++i) {
    arrivals[i] = arrivals[i - 1] + absl::Seconds(gap(rng));
  }

  std::vector<RequestTiming> timings(n);
  Dispatch dispatch(options.num_requests);
  const int workers = options.max_concurrency > 0
                          ? std::min(options.max_concurrency, options.num_requests)
                          : options.num_requests;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (int i = dispatch.Take(); i >= 0; i = dispatch.Take()) {
        const size_t r = static_cast<size_t>(i);
        timings[r] = client->Run(prompts[r], options.output_len);
      }
    });
  }
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < n; ++i) {
    absl::SleepFor(start + arrivals[i] - absl::Now());
    dispatch.Release();
  }
  for (std::thread& t : threads) t.join();
  const double duration = absl::ToDoubleSeconds(absl::Now() - start);

  nlohmann::json result = SummarizeBench(timings, duration);
  std::string first_error;
  for (const RequestTiming& t : timings) {
    if (!t.ok) {
      first_error = t.error;
      break;
    }
  }
  result["backend"] = BenchBackend(options);
  result["endpoint"] =
      BenchBackend(options) == "grpc" ? options.server : OpenAiEndpoint(options);
  result["model_id"] = info.name;
  result["num_prompts"] = options.num_requests;
  if (options.rate > 0) {
    result["request_rate"] = options.rate;
  } else {
    result["request_rate"] = "inf";  // as vLLM writes an unbounded rate
  }
  result["max_concurrency"] =
      options.max_concurrency > 0 ? nlohmann::json(options.max_concurrency) : nlohmann::json();
  result["input_len"] = options.input_len;
  result["output_len"] = options.output_len;
  result["first_error"] = first_error;
  const std::string text = result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!options.result_file.empty()) {
    std::ofstream out(options.result_file);
    out << text << "\n";
    if (!out.flush()) {
      return absl::UnavailableError(
          absl::StrCat("--result-file ", options.result_file, ": cannot write"));
    }
  }
  if (options.json) {
    std::cout << result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << std::endl;
  } else {
    PrintTable(result);
  }
  return absl::OkStatus();
}

}  // namespace estuary::cli
