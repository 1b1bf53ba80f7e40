#include "cli/bench_serve.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "rpc/status_convert.h"

namespace estuary::cli {
namespace {

struct RequestTiming {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;  // gaps between chunks, per token
  int tokens = 0;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

RequestTiming RunOne(estuary::v1::Inference::Stub& stub, const std::vector<int32_t>& prompt,
                     int output_len) {
  estuary::v1::GenerateRequest request;
  for (int32_t t : prompt) request.mutable_tokens()->add_ids(t);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(output_len);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
  RequestTiming timing;
  const absl::Time start = absl::Now();
  absl::Time last = start;
  auto reader = stub.Generate(&context, request);
  estuary::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (!response.has_chunk() || response.chunk().token_ids().empty()) continue;
    const absl::Time now = absl::Now();
    const int n = response.chunk().token_ids_size();
    if (timing.tokens == 0) {
      timing.ttft = absl::ToDoubleSeconds(now - start);
    } else {
      for (int i = 0; i < n; ++i) timing.itl.push_back(absl::ToDoubleSeconds(now - last) / n);
    }
    timing.tokens += n;
    last = now;
  }
  const grpc::Status status = reader->Finish();
  timing.e2e = absl::ToDoubleSeconds(absl::Now() - start);
  timing.ok = status.ok();
  if (!status.ok()) timing.error = status.error_message();
  return timing;
}

}  // namespace

absl::Status ValidateBenchServeOptions(const BenchServeOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("bench-serve needs --server");
  if (options.rate < 0) return absl::InvalidArgumentError("--rate must be >= 0");
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
  auto stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(options.server, grpc::InsecureChannelCredentials()));
  estuary::v1::ModelInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ESTUARY_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->GetModelInfo(&context, {}, &info)));
  }
  if (options.input_len + options.output_len > info.context_length()) {
    return absl::InvalidArgumentError(absl::StrCat("--input-len + --output-len = ",
                                                   options.input_len + options.output_len,
                                                   " exceeds the model's context of ",
                                                   info.context_length()));
  }
  std::mt19937_64 rng(options.seed);
  // Ids past the first few (BOS/EOS and friends) of the vocabulary.
  std::uniform_int_distribution<int32_t> token(3, std::max(3, info.vocab_size() - 1));
  std::exponential_distribution<double> gap(options.rate > 0 ? options.rate : 1.0);
  std::vector<RequestTiming> timings(static_cast<size_t>(options.num_requests));
  std::vector<std::thread> clients;
  const absl::Time start = absl::Now();
  absl::Time next = start;
  for (int i = 0; i < options.num_requests; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(options.input_len));
    for (int32_t& t : prompt) t = token(rng);
    if (options.rate > 0) {
      absl::SleepFor(next - absl::Now());
      next += absl::Seconds(gap(rng));
    }
    clients.emplace_back([&, i, prompt] {
      timings[static_cast<size_t>(i)] = RunOne(*stub, prompt, options.output_len);
    });
  }
  for (std::thread& t : clients) t.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  std::vector<double> ttft, itl, e2e;
  int64_t tokens = 0;
  int errors = 0;
  std::string first_error;
  for (const RequestTiming& t : timings) {
    if (!t.ok) {
      ++errors;
      if (first_error.empty()) first_error = t.error;
      continue;
    }
    ttft.push_back(t.ttft);
    e2e.push_back(t.e2e);
    itl.insert(itl.end(), t.itl.begin(), t.itl.end());
    tokens += t.tokens;
  }
  const nlohmann::json out = {
      {"server", options.server},
      {"rate", options.rate},
      {"num_requests", options.num_requests},
      {"input_len", options.input_len},
      {"output_len", options.output_len},
      {"errors", errors},
      {"first_error", first_error},
      {"wall_seconds", wall},
      {"output_tokens_per_second", static_cast<double>(tokens) / wall},
      {"ttft_p50_ms", 1e3 * Percentile(ttft, 0.5)},
      {"ttft_p99_ms", 1e3 * Percentile(ttft, 0.99)},
      {"itl_p50_ms", 1e3 * Percentile(itl, 0.5)},
      {"itl_p99_ms", 1e3 * Percentile(itl, 0.99)},
      {"e2e_p50_ms", 1e3 * Percentile(e2e, 0.5)},
      {"e2e_p99_ms", 1e3 * Percentile(e2e, 0.99)},
  };
  if (options.json) {
    std::cout << out.dump() << std::endl;
    return absl::OkStatus();
  }
  std::printf("%d requests (%d in, %d out) at %.2f req/s: %d errors%s%s\n", options.num_requests,
              options.input_len, options.output_len, options.rate, errors,
              first_error.empty() ? "" : ", first: ", first_error.c_str());
  std::printf("output tokens/s %.1f over %.1f s\n", static_cast<double>(tokens) / wall, wall);
  std::printf("%-8s %10s %10s\n", "ms", "p50", "p99");
  for (const char* name : {"ttft", "itl", "e2e"}) {
    std::printf("%-8s %10.2f %10.2f\n", name, out[absl::StrCat(name, "_p50_ms")].get<double>(),
                out[absl::StrCat(name, "_p99_ms")].get<double>());
  }
  return absl::OkStatus();
}

}  // namespace estuary::cli
