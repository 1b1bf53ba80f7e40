// `estuary bench-serve` against a real cluster (router with its HTTP door, one prefill and one
// decode worker, stories260K) on both protocols: gRPC, OpenAI HTTP by --backend, and by
// --endpoint. Each run must complete every request with exactly output_len tokens and write
// vLLM's result keys to --result-file; --api-key goes out on both; a server that does not
// answer is a clear error.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

using ::estuary::testing::BinaryPath;
using ::estuary::testing::Cluster;
using ::estuary::testing::ClusterSpec;
using ::estuary::testing::FreePort;
using ::estuary::testing::RouterHttpAddress;
using ::estuary::testing::RunProcess;
using ::estuary::testing::Spec;
using ::estuary::testing::TempPath;

constexpr int kRequests = 4;
constexpr int kOutputLen = 8;

struct BenchRun {
  int exit_code = -1;
  std::string log;
  nlohmann::json result;
};

BenchRun RunBench(const std::string& name, std::vector<std::string> flags) {
  const std::string file = TempPath(name + ".json");
  std::vector<std::string> argv = {BinaryPath("cli/estuary"), "bench-serve",
                                   "--num-requests", absl::StrCat(kRequests),
                                   "--input-len", "24",
                                   "--output-len", absl::StrCat(kOutputLen),
                                   "--rate", "0",
                                   "--max-concurrency", "2",
                                   "--result-file", file};
  argv.insert(argv.end(), flags.begin(), flags.end());
  BenchRun run;
  auto ran = RunProcess(argv, absl::Minutes(2));
  EXPECT_TRUE(ran.ok()) << ran.status();
  if (!ran.ok()) return run;
  run.exit_code = ran->exit_code;
  run.log = ran->out + ran->err;
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  run.result = nlohmann::json::parse(text.str(), nullptr, false);
  return run;
}

void ExpectCompleteResult(const BenchRun& run, const std::string& backend) {
  ASSERT_EQ(run.exit_code, 0) << run.log;
  ASSERT_TRUE(run.result.is_object()) << "no JSON in --result-file\n" << run.log;
  const nlohmann::json& r = run.result;
  EXPECT_EQ(r["backend"], backend);
  EXPECT_EQ(r["completed"], kRequests) << r.dump(2);
  EXPECT_EQ(r["failed"], 0) << r.dump(2);
  EXPECT_EQ(r["total_output_tokens"], kRequests * kOutputLen) << r.dump(2);
  EXPECT_EQ(r["total_input_tokens"], kRequests * 24) << r.dump(2);
  EXPECT_EQ(r["max_concurrency"], 2);
  for (const char* key : {"duration", "request_throughput", "output_throughput",
                          "total_token_throughput"}) {
    ASSERT_TRUE(r.contains(key) && r[key].is_number()) << key << "\n" << r.dump(2);
    EXPECT_GT(r[key].get<double>(), 0) << key;
  }
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* stat : {"mean", "median", "p99"}) {
      const std::string key = absl::StrCat(stat, "_", metric, "_ms");
      ASSERT_TRUE(r.contains(key) && r[key].is_number()) << key << "\n" << r.dump(2);
      // ITL is per chunk: a request whose tokens all came in one chunk (the tiny model can
      // outrun the HTTP door's writer) has no gaps, so only ITL may be 0.
      if (std::string(metric) == "itl") {
        EXPECT_GE(r[key].get<double>(), 0) << key;
      } else {
        EXPECT_GT(r[key].get<double>(), 0) << key;
      }
    }
  }
  EXPECT_LE(r["median_ttft_ms"].get<double>(), r["p99_ttft_ms"].get<double>() + 1e-9);
  EXPECT_LE(r["mean_ttft_ms"].get<double>(), r["mean_e2el_ms"].get<double>());
}

// The router's HTTP door (started with --http-port 0), as host:port.
std::string HttpAddress(const Cluster& cluster) {
  const std::string http = RouterHttpAddress(cluster);
  EXPECT_FALSE(http.empty()) << "the router logged no HTTP address";
  return http;
}

TEST(BenchServeTest, BothProtocolsCompleteEveryRequestWithVllmKeys) {
  Cluster cluster(Spec("stories260K", 1, 1, 1, 1, {"--http-port", "0"}));
  const std::string http = HttpAddress(cluster);

  ExpectCompleteResult(RunBench("grpc", {"--server", cluster.router_address()}), "grpc");
  ExpectCompleteResult(RunBench("openai", {"--backend", "openai", "--server", http}), "openai");
  ExpectCompleteResult(
      RunBench("endpoint", {"--endpoint", absl::StrCat("http://", http, "/v1/completions")}),
      "openai");
}

TEST(BenchServeTest, TheApiKeyGoesOutOnBothProtocols) {
  ClusterSpec spec = Spec("stories260K", 0, 1, 1, 1, {"--http-port", "0"});
  spec.api_key = "bench-key";
  Cluster cluster(spec);
  const std::string http = absl::StrCat("http://", HttpAddress(cluster), "/v1/completions");
  ExpectCompleteResult(
      RunBench("grpc-key", {"--server", cluster.router_address(), "--api-key", "bench-key"}),
      "grpc");
  ExpectCompleteResult(RunBench("http-key", {"--endpoint", http, "--api-key", "bench-key"}),
                       "openai");
  const BenchRun refused = RunBench("http-nokey", {"--endpoint", http});
  EXPECT_NE(refused.exit_code, 0) << refused.log;
  EXPECT_NE(refused.log.find("401"), std::string::npos) << refused.log;
}

TEST(BenchServeTest, AServerThatDoesNotAnswerIsAClearError) {
  const std::string closed = absl::StrCat("http://127.0.0.1:", FreePort(), "/v1/completions");
  const BenchRun run = RunBench("closed", {"--endpoint", closed});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.log.find("/v1/models"), std::string::npos) << run.log;
  const BenchRun bad = RunBench("bad", {"--server", "127.0.0.1:1", "--backend", "udp"});
  EXPECT_EQ(bad.exit_code, 2) << bad.log;
  EXPECT_NE(bad.log.find("--backend"), std::string::npos) << bad.log;
}

}  // namespace
}  // namespace estuary
