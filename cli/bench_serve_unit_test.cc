// bench-serve's pure parts: the SSE reader, vLLM's summary figures, and option checks. The
// end-to-end runs on both protocols are tests/bench_serve/bench_serve_test.cc.
#include <string>
#include <vector>

#include "cli/bench_result.h"
#include "cli/bench_serve.h"
#include "cli/sse_reader.h"
#include "gtest/gtest.h"

namespace estuary::cli {
namespace {

std::vector<std::string> ReadAll(const std::vector<std::string>& pieces) {
  std::vector<std::string> events;
  SseReader reader([&](const std::string& data) { events.push_back(data); });
  for (const std::string& piece : pieces) reader.Feed(piece);
  EXPECT_EQ(reader.pending_bytes(), 0u);
  return events;
}

TEST(SseReaderTest, SplitsEventsHoweverTheBytesArrive) {
  const std::string stream =
      "data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\r\n\r\nevent: x\ndata: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "[DONE]"};
  EXPECT_EQ(ReadAll({stream}), want);
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(ReadAll(bytes), want);
}

TEST(SseReaderTest, JoinsDataLinesAndKeepsAnUnendedEvent) {
  EXPECT_EQ(ReadAll({"data:x\ndata: y\n\n"}), std::vector<std::string>({"x\ny"}));
  std::vector<std::string> events;
  SseReader reader([&](const std::string& data) { events.push_back(data); });
  reader.Feed("data: half");
  EXPECT_TRUE(events.empty());
  EXPECT_GT(reader.pending_bytes(), 0u);
}

TEST(BenchResultTest, PercentileInterpolatesAsNumpy) {
  EXPECT_EQ(Percentile({}, 99), 0);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 99), 3.97);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
}

TEST(BenchResultTest, SummaryHasVllmKeysAndFigures) {
  RequestTiming a;
  a.ok = true;
  a.ttft = 0.1;
  a.e2e = 0.5;
  a.itl = {0.1, 0.1, 0.2};
  a.prompt_tokens = 8;
  a.output_tokens = 5;
  RequestTiming b = a;
  b.ttft = 0.3;
  b.e2e = 0.7;
  RequestTiming failed;
  failed.error = "boom";
  const nlohmann::json r = SummarizeBench({a, b, failed}, 2.0);
  EXPECT_EQ(r["completed"], 2);
  EXPECT_EQ(r["failed"], 1);
  EXPECT_EQ(r["total_input_tokens"], 16);
  EXPECT_EQ(r["total_output_tokens"], 10);
  EXPECT_DOUBLE_EQ(r["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["output_throughput"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(r["total_token_throughput"].get<double>(), 13.0);
  EXPECT_DOUBLE_EQ(r["mean_ttft_ms"].get<double>(), 200);
  EXPECT_DOUBLE_EQ(r["median_ttft_ms"].get<double>(), 200);
  EXPECT_NEAR(r["std_ttft_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(r["mean_tpot_ms"].get<double>(), 100, 1e-9);  // (0.5 - 0.1) / 4
  EXPECT_NEAR(r["median_itl_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(r["mean_e2el_ms"].get<double>(), 600, 1e-9);
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* s : {"mean", "median", "std", "p99"}) {
      EXPECT_TRUE(r.contains(std::string(s) + "_" + m + "_ms")) << s << " " << m;
    }
  }
}

TEST(BenchServeOptionsTest, RefusesWhatCannotRun) {
  BenchServeOptions ok;
  ok.server = "127.0.0.1:1";
  EXPECT_TRUE(ValidateBenchServeOptions(ok).ok());
  EXPECT_EQ(BenchBackend(ok), "grpc");
  BenchServeOptions http = ok;
  http.server.clear();
  http.endpoint = "http://127.0.0.1:8000/v1/completions";
  EXPECT_TRUE(ValidateBenchServeOptions(http).ok());
  EXPECT_EQ(BenchBackend(http), "openai");
  BenchServeOptions bad = ok;
  bad.backend = "tcp";
  EXPECT_EQ(ValidateBenchServeOptions(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = http;
  bad.backend = "grpc";
  EXPECT_EQ(ValidateBenchServeOptions(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.max_concurrency = -1;
  EXPECT_EQ(ValidateBenchServeOptions(bad).code(), absl::StatusCode::kInvalidArgument);
  BenchServeOptions none;
  EXPECT_EQ(ValidateBenchServeOptions(none).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BenchServeOptionsTest, AnEndpointThatIsNotHttpIsRefusedBeforeAnyRequest) {
  BenchServeOptions https;
  https.endpoint = "ftp://127.0.0.1:8000/v1/completions";
  const absl::Status status = RunBenchServe(https);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("http://"), std::string::npos) << status;
}

}  // namespace
}  // namespace estuary::cli
