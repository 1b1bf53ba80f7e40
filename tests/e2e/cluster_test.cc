// The whole disaggregated cluster end to end (issue: router, gRPC API, `estuary up`): real
// estuary-router, estuary-prefill and estuary-decode processes on loopback with the tiny real
// models, called through the public estuary.v1.Inference API only.

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/child_process.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::Cluster;
using ::estuary::testing::FreePages;
using ::estuary::testing::ClusterSpec;
using ::estuary::testing::Generate;
using ::estuary::testing::Generated;
using ::estuary::testing::Spec;
using ::estuary::testing::GoldenCase;
using ::estuary::testing::GreedyIds;
using ::estuary::testing::TempPath;

class ClusterGoldenTest : public ::testing::TestWithParam<ClusterSpec> {};

// Golden greedy ids (and text) through router -> prefill -> UCX -> decode.
TEST_P(ClusterGoldenTest, GoldenIdsThroughTheCluster) {
  const ClusterSpec& spec = GetParam();
  Cluster cluster(spec);
  for (const GoldenCase& c : ::estuary::testing::LoadGoldenCases(spec.model)) {
    const Generated got = Generate(cluster.stub(), cluster.Greedy(c.prompt_ids));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << cluster.Logs();
    EXPECT_EQ(got.ids, c.completion_ids) << "case " << c.index;
    EXPECT_EQ(got.complete.usage().prompt_tokens(), static_cast<int>(c.prompt_ids.size()));
    EXPECT_EQ(got.complete.usage().completion_tokens(), static_cast<int>(got.ids.size()));
  }
}

std::string SpecName(const ::testing::TestParamInfo<ClusterSpec>& info) {
  const ClusterSpec& s = info.param;
  return absl::StrCat(s.model, "_", s.prefill, "P", s.tp_prefill, "_", s.decode, "D",
                      s.tp_decode);
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, ClusterGoldenTest,
    ::testing::Values(Spec("stories260K", 1, 1, 1, 1),
                      Spec("stories12L", 1, 1, 1, 1),
                      Spec("stories12L", 2, 2, 1, 1),
                      Spec("stories12L", 1, 1, 2, 1)),
    SpecName);

// Text in, text out: the golden completion text, and the same ids with local prefill.
TEST(ClusterTest, TextPromptAndLocalPrefillGiveTheGoldenCompletion) {
  Cluster cluster(Spec("stories12L", 1, 1, 1, 1, {"--local-prefill-max-tokens", "8"}));
  for (const GoldenCase& c : ::estuary::testing::LoadGoldenCases("stories12L")) {
    if (c.prompt.empty()) continue;  // empty text is refused; token input covers BOS alone
    estuary::v1::GenerateRequest request = cluster.Greedy(c.prompt_ids);
    request.set_text(c.prompt);
    const Generated got = Generate(cluster.stub(), request);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.ids, c.completion_ids) << "case " << c.index << " (" << c.prompt_ids.size()
                                         << " prompt tokens)";
    EXPECT_EQ(got.text, c.completion_text) << "case " << c.index;
  }
}

// 32 concurrent streams over two prefill and two decode workers all finish with golden ids.
TEST(ClusterTest, ThirtyTwoConcurrentStreams) {
  Cluster cluster(Spec("stories12L", 2, 2, 1, 1));
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases("stories12L");
  std::vector<Generated> results(32);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < results.size(); ++i) {
    clients.emplace_back([&, i] {
      results[i] = Generate(cluster.stub(), cluster.Greedy(cases[i % cases.size()].prompt_ids));
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, cases[i % cases.size()].completion_ids) << "stream " << i;
  }
}

// A stream the client cancels after its first chunk frees its pages on both workers.
TEST(ClusterTest, ACancelledStreamFreesItsPagesOnBothWorkers) {
  Cluster cluster(Spec("stories12L", 1, 1, 1, 1));
  const int decode_free = FreePages(cluster.decode(0).address, true);
  const int prefill_free = FreePages(cluster.prefill(0).address, false);
  grpc::ClientContext context;
  estuary::v1::GenerateRequest request =
      cluster.Greedy(::estuary::testing::LoadGoldenCases("stories12L")[0].prompt_ids);
  request.mutable_sampling()->set_ignore_eos(true);
  auto reader = cluster.stub().Generate(&context, request);
  estuary::v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && FreePages(cluster.decode(0).address, true) != decode_free) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(FreePages(cluster.decode(0).address, true), decode_free);
  EXPECT_EQ(FreePages(cluster.prefill(0).address, false), prefill_free);
}

// Bad requests are refused with INVALID_ARGUMENT naming the limit.
TEST(ClusterTest, InvalidRequestsNameTheLimit) {
  Cluster cluster(Spec("stories260K", 1, 1, 1, 1));
  struct Case {
    std::string what;
    estuary::v1::GenerateRequest request;
    std::string names;
  };
  std::vector<Case> bad;
  bad.push_back({"no input", estuary::v1::GenerateRequest(), "input"});
  bad.push_back({"id outside the vocabulary", GreedyIds({1, 512}, 10), "512"});
  bad.push_back({"too long", GreedyIds(std::vector<int32_t>(600, 5), 10), "context"});
  bad.push_back({"max_tokens past the context", GreedyIds({1, 2}, 5000), "context"});
  estuary::v1::GenerateRequest hot = GreedyIds({1, 2}, 10);
  hot.mutable_sampling()->set_temperature(1000.0f);
  bad.push_back({"temperature", hot, "temperature"});
  estuary::v1::GenerateRequest top_p = GreedyIds({1, 2}, 10);
  top_p.mutable_sampling()->set_top_p(1.5f);
  bad.push_back({"top_p", top_p, "top_p"});
  estuary::v1::GenerateRequest tau = GreedyIds({1, 2}, 10);
  tau.mutable_exit()->set_threshold(5.0f);
  bad.push_back({"threshold", tau, "threshold"});
  for (const Case& c : bad) {
    const Generated got = Generate(cluster.stub(), c.request);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_NE(got.status.error_message().find(c.names), std::string::npos)
        << c.what << ": " << got.status.error_message();
  }
}

// `estuary up` starts everything, answers, and stops cleanly on SIGTERM.
// `estuary up` with `extra` flags: serves the first golden case and stops on SIGTERM.
void UpServesAndStops(const std::string& name, const std::vector<std::string>& extra) {
  const std::string ready = TempPath(name + ".ready");
  fs::remove(ready);
  std::vector<std::string> argv = {BinaryPath("cli/estuary"),
                                   "up",
                                   "--model",
                                   ::estuary::testing::GoldenModelDir("stories260K"),
                                   "--port",
                                   "0",
                                   "--ready-file",
                                   ready,
                                   "--log-dir",
                                   TempPath(name + "-logs")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto up = ChildProcess::Start(argv, TempPath(name + ".log"));
  ASSERT_TRUE(up.ok()) << up.status();
  auto address = WaitForReadyFile(ready, **up, absl::Seconds(60));
  ASSERT_TRUE(address.ok()) << address.status();
  auto stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(*address, grpc::InsecureChannelCredentials()));
  const GoldenCase c = ::estuary::testing::LoadGoldenCases("stories260K")[0];
  const Generated got = Generate(*stub, GreedyIds(c.prompt_ids, 200));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << (*up)->Log();
  EXPECT_EQ(got.ids, c.completion_ids);
  (*up)->Signal(SIGTERM);
  auto code = (*up)->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << (*up)->Log();
  EXPECT_EQ(*code, 0) << (*up)->Log();
}

TEST(EstuaryUpTest, StartsTheClusterServesAndStopsOnSigterm) { UpServesAndStops("up", {}); }

// No prefill worker: the decode worker prefills every prompt itself.
TEST(EstuaryUpTest, DecodeOnlyClusterServes) { UpServesAndStops("up-decode", {"--prefill", "0"}); }

}  // namespace
}  // namespace estuary
