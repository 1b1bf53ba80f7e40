// Metrics parity (README "Metrics"): a real cluster (router with its HTTP door, one prefill and
// one decode worker, stories260K) serves a few requests over gRPC and HTTP, some prefilled on
// the prefill worker and two equal prompts prefilled on the decode worker (the second reuses
// the first's KV pages) and one that streams while check_metrics.py reads the running gauges;
// then check_metrics.py parses every process's /metrics with the Prometheus client library's
// parser and checks the new series against the requests' usage.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

using ::estuary::testing::Cluster;
using ::estuary::testing::ClusterSpec;
using ::estuary::testing::LoggedAddress;
using ::estuary::testing::RouterHttpAddress;
using ::estuary::testing::Generated;
using ::estuary::testing::GreedyIds;
using ::estuary::testing::RunProcess;

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, where python3-prometheus-client is
constexpr char kServedName[] = "stories-metrics";
constexpr int kLocalMaxTokens = 40;  // prompts up to this prefill on the decode worker
constexpr int kMaxTokens = 8;

std::vector<int32_t> Prompt(int length, int32_t first) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back(3 + (first + 7 * i) % 500);
  return ids;
}

// Sums of what the requests' usage said.
struct Served {
  int requests = 0;
  int prompt_tokens = 0;
  int generation_tokens = 0;
  int prefill_prompt_tokens = 0;  // of those prefilled on the prefill worker
  int local_prompt_tokens = 0;    // of those prefilled on the decode worker
  void Add(int prompt, int completion) {
    ++requests;
    prompt_tokens += prompt;
    generation_tokens += completion;
    (prompt <= kLocalMaxTokens ? local_prompt_tokens : prefill_prompt_tokens) += prompt;
  }
};

void ServeGrpc(Cluster& cluster, const std::vector<int32_t>& prompt, Served& served) {
  estuary::v1::GenerateRequest request = GreedyIds(prompt, kMaxTokens);
  request.mutable_sampling()->set_ignore_eos(true);
  const Generated out = testing::Generate(cluster.stub(), request);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message() << "\n" << cluster.Logs();
  ASSERT_EQ(static_cast<int>(out.ids.size()), kMaxTokens);
  served.Add(out.complete.usage().prompt_tokens(), out.complete.usage().completion_tokens());
}

// Serves one longer request and, once its first token came, checks the running gauges (the
// decode worker steps slowly in this test, so the request is still streaming then).
void ServeWhileChecking(Cluster& cluster, const std::vector<std::string>& check, Served& served) {
  estuary::v1::GenerateRequest request = GreedyIds(Prompt(20, 9), 48);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = cluster.stub().Generate(&context, request);
  estuary::v1::GenerateResponse response;
  int tokens = 0;
  while (tokens == 0 && reader->Read(&response)) {
    if (response.has_chunk()) tokens += response.chunk().token_ids_size();
  }
  ASSERT_GT(tokens, 0) << cluster.Logs();
  auto checked = RunProcess(check, absl::Minutes(1));
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->exit_code, 0) << checked->out << checked->err;
  estuary::v1::Usage usage;
  while (reader->Read(&response)) {
    if (response.has_complete()) usage = response.complete().usage();
  }
  ASSERT_TRUE(reader->Finish().ok()) << cluster.Logs();
  ASSERT_EQ(usage.completion_tokens(), 48);
  served.Add(usage.prompt_tokens(), usage.completion_tokens());
}

void ServeHttp(httplib::Client& http, const std::vector<int32_t>& prompt, Served& served) {
  const nlohmann::json body = {{"model", kServedName}, {"prompt", prompt},
                               {"max_tokens", kMaxTokens}, {"temperature", 0},
                               {"ignore_eos", true}};
  const httplib::Result result = http.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  ASSERT_EQ(result->status, 200) << result->body;
  const nlohmann::json answer = nlohmann::json::parse(result->body);
  served.Add(answer["usage"]["prompt_tokens"].get<int>(),
             answer["usage"]["completion_tokens"].get<int>());
}

TEST(MetricsParityTest, EveryProcessExposesTheNewSeriesWithSaneValues) {
  if (RunProcess({kPython, "-c", "import prometheus_client"}, absl::Seconds(30))
          .value_or(testing::ProcessResult{})
          .exit_code != 0) {
    GTEST_SKIP() << "no python3-prometheus-client (apt-get install python3-prometheus-client; "
                    "scripts/test.sh installs it)";
  }
  // Every port picked by its process (0) and read from its log.
  ClusterSpec spec = testing::Spec(
      "stories260K", 1, 1, 1, 1,
      {"--http-port", "0", "--served-model-name", kServedName, "--local-prefill-max-tokens",
       absl::StrCat(kLocalMaxTokens)});
  // Slow steps keep a request streaming while ServeWhileChecking reads the gauges.
  spec.decode_flags = {"--metrics-port", "0", "--debug-step-delay", "25ms"};
  spec.prefill_flags = {"--metrics-port", "0"};
  Cluster cluster(spec);
  const std::string router_http = RouterHttpAddress(cluster);
  const std::string decode_metrics = LoggedAddress(cluster.decode(0), "metrics on http://");
  const std::string prefill_metrics = LoggedAddress(cluster.prefill(0), "metrics on http://");
  ASSERT_FALSE(router_http.empty() || decode_metrics.empty() || prefill_metrics.empty())
      << cluster.Logs();
  httplib::Client http("http://" + router_http);
  http.set_read_timeout(60);

  Served served;
  const std::vector<int32_t> local = Prompt(kLocalMaxTokens, 1);
  ServeGrpc(cluster, local, served);
  ServeHttp(http, local, served);  // the same prompt: its first 32 tokens' pages are cached
  ServeGrpc(cluster, Prompt(60, 2), served);
  ServeHttp(http, Prompt(61, 3), served);
  auto url = [](const std::string& address) {
    return absl::StrCat("http://", address, "/metrics");
  };
  ServeWhileChecking(cluster,
                     {kPython, "tests/metrics/check_metrics.py", "--streaming", "1", "--router",
                      url(router_http), "--decode", url(decode_metrics), "--model", kServedName},
                     served);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(served.requests, 5);

  auto checked = RunProcess(
      {kPython, "tests/metrics/check_metrics.py", "--router", url(router_http), "--decode",
       url(decode_metrics), "--prefill", url(prefill_metrics), "--model", kServedName,
       "--requests", absl::StrCat(served.requests), "--prompt-tokens",
       absl::StrCat(served.prompt_tokens), "--generation-tokens",
       absl::StrCat(served.generation_tokens), "--prefill-prompt-tokens",
       absl::StrCat(served.prefill_prompt_tokens), "--local-prompt-tokens",
       absl::StrCat(served.local_prompt_tokens), "--min-prefix-hits", "32"},
      absl::Minutes(1));
  ASSERT_TRUE(checked.ok()) << checked.status();
  std::cout << checked->out;  // "N failed checks over ... samples"
  EXPECT_EQ(checked->exit_code, 0) << checked->out << checked->err << "\n" << cluster.Logs();
}

}  // namespace
}  // namespace estuary
