// The router's OpenAI HTTP door, driven as users drive it: the official npm `openai` SDK
// (sdk_test.mjs) against a real router and decode worker (stories260K), then
// the pages of the stream it dropped mid-way must come back; and 10,000
// malformed HTTP requests must get 4xx (never a 5xx or a crash) while correct requests keep
// being served. The SDK part installs package-lock.json's packages on first use and skips,
// saying why, without node, npm or the npm registry.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

using ::estuary::testing::Cluster;
using ::estuary::testing::FreePages;
using ::estuary::testing::RouterHttpAddress;
using ::estuary::testing::RunProcess;
using ::estuary::testing::Spec;

// The SDK's packages (tests/openai/node_modules); a skip reason when they cannot be had.
std::string InstallSdk() {
  if (::access("/usr/bin/node", X_OK) != 0) return "no node (apt-get install nodejs npm)";
  // One install for both tests of this file, which ctest may run at once.
  auto installed =
      RunProcess({"/bin/bash", "scripts/npm_install_once.sh", "tests/openai"}, absl::Minutes(7));
  if (!installed.ok() || installed->exit_code != 0) {
    return "npm could not install the openai SDK (no registry reachable?)";
  }
  return "";
}

// A router with its HTTP door and one decode worker that prefills locally: the door is what
// these tests are about (the disaggregated path has its own tests in tests/e2e).
struct HttpCluster {
  Cluster cluster{Spec("stories260K", 0, 1, 1, 1, {"--http-port", "0"})};
  std::string address = RouterHttpAddress(cluster);  // host:port
};

TEST(OpenAiSdkTest, TheOfficialSdkDrivesTheRouterAndADroppedStreamFreesItsPages) {
  const std::string skip = InstallSdk();
  if (!skip.empty()) GTEST_SKIP() << skip;
  HttpCluster http;
  const std::string decode = http.cluster.decode(0).address;
  const int decode_free = FreePages(decode, true);
  auto ran = RunProcess({"/usr/bin/node", "tests/openai/sdk_test.mjs",
                         absl::StrCat("http://", http.address, "/v1"),
                         testing::GoldenModelDir("stories260K") + "/golden.json", "stories260K"},
                        absl::Minutes(3));
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->exit_code, 0) << ran->out << "\n" << ran->err << "\n" << http.cluster.Logs();
  std::printf("%s", ran->out.c_str());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && FreePages(decode, true) != decode_free) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(FreePages(decode, true), decode_free) << "the dropped stream's pages";
}

// /v1/chat/completions with a chat template (TinyLlama's, whose markers the tiny tokenizer can
// spell): sdk_test.mjs's chat checks, streamed and not.
TEST(OpenAiSdkTest, ChatCompletionsThroughAChatTemplate) {
  const std::string skip = InstallSdk();
  if (!skip.empty()) GTEST_SKIP() << skip;
  Cluster cluster{Spec("stories260K", 0, 1, 1, 1,
                       {"--http-port", "0", "--chat-template",
                        ESTUARY_SOURCE_DIR "/tests/chat/templates/tinyllama-chat.jinja"})};
  auto ran = RunProcess({"/usr/bin/node", "tests/openai/sdk_test.mjs",
                         absl::StrCat("http://", RouterHttpAddress(cluster), "/v1"),
                         testing::GoldenModelDir("stories260K") + "/golden.json", "stories260K",
                         "chat"},
                        absl::Minutes(2));
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->exit_code, 0) << ran->out << "\n" << ran->err << "\n" << cluster.Logs();
  EXPECT_NE(ran->out.find("\"passed\":3"), std::string::npos) << ran->out;
  std::printf("%s", ran->out.c_str());
}

// Malformed requests of every kind, from a fixed seed.
std::vector<std::pair<std::string, std::string>> MalformedRequests(int count) {
  std::mt19937 random(20261202);
  const std::string valid =
      R"({"prompt":"Once upon a time","max_tokens":4,"temperature":0,"stop":["x"],"n":1})";
  const std::vector<std::string> fields = {"prompt", "max_tokens", "temperature", "top_p", "n",
                                           "stop", "seed", "stream", "top_k", "min_p",
                                           "stream_options", "stop_token_ids", "exit_threshold",
                                           "messages", "logprobs", "tokens"};
  const std::vector<std::string> bad_values = {
      "-1", "1e400", "-1e308", "99999999999999999999999", "{}", "[[[[[]]]]]",
      "true", "null", "\"\\ud800\"", "[1,\"a\"]", "0.5", "[-5]", "[4294967296]", "{\"a\":1}"};
  std::vector<std::pair<std::string, std::string>> out;
  for (int i = 0; i < count; ++i) {
    const std::string path =
        std::vector<std::string>{"/v1/completions", "/v1/chat/completions", "/tokenize",
                                 "/detokenize"}[random() % 4];
    std::string body;
    switch (random() % 6) {
      case 0:  // truncated
        body = valid.substr(0, 1 + random() % (valid.size() - 2));
        break;
      case 1:  // random bytes (invalid UTF-8 among them)
        for (size_t n = random() % 200; n > 0; --n) body.push_back(static_cast<char>(random()));
        break;
      case 2: {  // a field of the wrong type or out of range
        body = absl::StrCat("{\"", fields[random() % fields.size()], "\":",
                            bad_values[random() % bad_values.size()], "}");
        break;
      }
      case 3:  // invalid UTF-8 inside a string
        body = absl::StrCat(R"({"prompt":"a)", std::string(1, static_cast<char>(0x80 + random() % 64)),
                            R"(","max_tokens":2})");
        break;
      case 4:  // not an object
        body = std::vector<std::string>{"[]", "1", "\"x\"", "null", "", "{"}[random() % 6];
        break;
      default:  // huge numbers and deep nesting
        body = absl::StrCat(R"({"prompt":"x","max_tokens":)", std::string(400, '9'),
                            R"(,"n":)", std::string(2000, '['), "}");
        break;
    }
    out.push_back({path, body});
  }
  return out;
}

// A non-streamed answer that takes seconds (a decode worker slowed to 50 ms a step) comes back
// whole and parses; a client that gives up on one is noticed (the server keeps reading the
// connection while the answer is made) and its request ends on the decode worker: the pages
// come back long before it would have finished.
TEST(OpenAiHttpTest, ANonStreamedRequestWhoseClientLeavesEndsOnTheWorkers) {
  testing::ClusterSpec spec = Spec("stories260K", 0, 1, 1, 1, {"--http-port", "0"});
  spec.decode_flags = {"--debug-step-delay", "50ms"};
  Cluster cluster(spec);
  const std::string address = RouterHttpAddress(cluster);
  ASSERT_FALSE(address.empty());
  const std::string decode = cluster.decode(0).address;
  const int baseline = FreePages(decode, true);

  httplib::Client patient(absl::StrCat("http://", address));
  patient.set_read_timeout(30);
  auto whole = patient.Post("/v1/completions",
                            R"({"prompt":[1,403,407],"max_tokens":40,"temperature":0,)"
                            R"("ignore_eos":true})",
                            "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const nlohmann::json body = nlohmann::json::parse(whole->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << whole->body;
  EXPECT_EQ(body["usage"]["completion_tokens"], 40);

  const absl::Time start = absl::Now();
  {
    httplib::Client impatient(absl::StrCat("http://", address));
    impatient.set_read_timeout(1);  // 1 s of a 20 s answer
    auto given_up = impatient.Post("/v1/completions",
                                   R"({"prompt":[1,403,407],"max_tokens":400,"temperature":0,)"
                                   R"("ignore_eos":true})",
                                   "application/json");
    EXPECT_FALSE(given_up) << "the answer came within a second";
  }
  while (absl::Now() - start < absl::Seconds(10) && FreePages(decode, true) != baseline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(FreePages(decode, true), baseline) << "the abandoned request's pages";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "400 tokens at 50 ms would take 20 s";
}

// Beyond --http-max-concurrent-requests the door answers 429 at once, with OpenAI's error body
// and a Retry-After header (the openai client's back-off reads it); the slot frees when the
// running answer ends.
TEST(OpenAiHttpTest, BeyondItsConcurrencyTheDoorAnswers429WithRetryAfter) {
  testing::ClusterSpec spec =
      Spec("stories260K", 0, 1, 1, 1, {"--http-port", "0", "--http-max-concurrent-requests", "1"});
  spec.decode_flags = {"--debug-step-delay", "50ms"};
  Cluster cluster(spec);
  const std::string address = RouterHttpAddress(cluster);
  ASSERT_FALSE(address.empty());
  constexpr char kBody[] = R"({"prompt":[1,403,407],"max_tokens":30,"temperature":0,)"
                           R"("ignore_eos":true})";
  int long_status = 0;
  std::thread running([&] {
    httplib::Client client(absl::StrCat("http://", address));
    client.set_read_timeout(30);
    auto answer = client.Post("/v1/completions", kBody, "application/json");
    long_status = answer ? answer->status : -1;
  });
  absl::SleepFor(absl::Milliseconds(500));  // 30 tokens at 50 ms: it runs for 1.5 s
  httplib::Client client(absl::StrCat("http://", address));
  auto refused = client.Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429) << refused->body;
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  const nlohmann::json error = nlohmann::json::parse(refused->body, nullptr, false);
  ASSERT_FALSE(error.is_discarded()) << refused->body;
  EXPECT_NE(error["error"]["message"].get<std::string>().find("--http-max-concurrent-requests"),
            std::string::npos);
  running.join();
  EXPECT_EQ(long_status, 200);
  auto after = client.Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
}

TEST(OpenAiHttpTest, TenThousandMalformedRequestsGet4xxAndCorrectOnesKeepBeingServed) {
  HttpCluster http;
  httplib::Client client(absl::StrCat("http://", http.address));
  client.set_read_timeout(30);
  auto serves = [&] {
    auto r = client.Post("/v1/completions",
                         R"({"prompt":[1,403,407],"max_tokens":3,"temperature":0})",
                         "application/json");
    return r && r->status == 200;
  };
  ASSERT_TRUE(serves());
  int answered = 0;
  const auto requests = MalformedRequests(10000);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto r = client.Post(requests[i].first, requests[i].second, "application/json");
    ASSERT_TRUE(r) << "no answer to request " << i << ": " << requests[i].second;
    ASSERT_GE(r->status, 400) << requests[i].first << " " << requests[i].second << " -> " << r->body;
    ASSERT_LT(r->status, 500) << requests[i].first << " " << requests[i].second << " -> " << r->body;
    const nlohmann::json error = nlohmann::json::parse(r->body, nullptr, false);
    ASSERT_TRUE(error.contains("error")) << r->body;
    ++answered;
    if (i % 1000 == 0) {
      ASSERT_TRUE(serves()) << "after " << i << " malformed requests";
    }
  }
  // An oversize body, a bad request line and an unknown path.
  auto big = client.Post("/v1/completions", std::string(5 << 20, 'a'), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  auto unknown = client.Get("/v2/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_TRUE(serves()) << "after every malformed request";
  std::printf("%d malformed requests answered 4xx\n", answered);
}

}  // namespace
}  // namespace estuary
