// The lossless exit mode through the cluster (issue 16): router -> prefill -> UCX -> decode
// worker with the river, the mode chosen per request (exit.mode) or by the decode worker's
// --exit-mode default; greedy output is the golden ids, and the usage and the decode worker's
// metrics count the drafts.

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace t = ::estuary::testing;
using t::GoldenCase;

// The value of the first series named `name` in the Prometheus text at `address`/metrics; -1
// when absent or unreadable.
double Metric(const std::string& address, const std::string& name) {
  httplib::Client http("http://" + address);
  const auto response = http.Get("/metrics");
  if (!response || response->status != 200) return -1;
  std::istringstream lines(response->body);
  for (std::string line; std::getline(lines, line);) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size() ||
        (line[name.size()] != ' ' && line[name.size()] != '{')) {
      continue;
    }
    return std::strtod(line.substr(line.rfind(' ') + 1).c_str(), nullptr);
  }
  return -1;
}

// Lossless on request at TP 1, and as the worker's default at TP 2: the golden ids, with drafts
// verified and most of them kept; a lossy request on the same worker drafts nothing.
TEST(LosslessClusterTest, GoldenIdsPerRequestAndAsTheWorkersDefault) {
  for (const int tp_decode : {1, 2}) {
    t::ClusterSpec spec = t::Spec("stories12L", 1, 1, 1, tp_decode);
    // Every round drafts (the default, auto, may settle on plain rounds for this small model).
    spec.decode_flags = {"--river", "--exit-threshold", "0.8", "--drafting", "always",
                         "--metrics-port", "0"};
    if (tp_decode == 2) spec.decode_flags.insert(spec.decode_flags.end(), {"--exit-mode", "lossless"});
    t::Cluster cluster(spec);
    int64_t drafts = 0, accepted = 0;
    for (const GoldenCase& c : t::LoadGoldenCases(spec.model)) {
      estuary::v1::GenerateRequest request = cluster.Greedy(c.prompt_ids);
      if (tp_decode == 1) request.mutable_exit()->set_mode(estuary::v1::EXIT_MODE_LOSSLESS);
      const t::Generated got = t::Generate(cluster.stub(), request);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << cluster.Logs();
      EXPECT_EQ(got.ids, c.completion_ids) << "case " << c.index << " TP " << tp_decode;
      const estuary::v1::Usage& usage = got.complete.usage();
      EXPECT_GT(usage.draft_tokens(), 0) << "case " << c.index;
      EXPECT_LE(usage.accepted_tokens(), usage.draft_tokens());
      // Every kept token is the full model's.
      EXPECT_DOUBLE_EQ(usage.mean_backbone_layers(), 12.0);
      drafts += usage.draft_tokens();
      accepted += usage.accepted_tokens();
    }
    EXPECT_GT(accepted, drafts * 8 / 10) << "TP " << tp_decode;
    // The worker's metrics count the same drafts (they follow the engine's steps: polled).
    const std::string metrics = t::LoggedAddress(cluster.decode(0), "metrics on http://");
    ASSERT_FALSE(metrics.empty()) << cluster.Logs();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Metric(metrics, "estuary:lossless_draft_tokens_total") != static_cast<double>(drafts) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(Metric(metrics, "estuary:lossless_draft_tokens_total"), static_cast<double>(drafts));
    EXPECT_EQ(Metric(metrics, "estuary:lossless_accepted_tokens_total"),
              static_cast<double>(accepted));
    EXPECT_GT(Metric(metrics, "estuary:lossless_verifications_total"), 0.0);
    EXPECT_EQ(Metric(metrics, "estuary:lossless_plain_rounds_total"), 0.0);  // drafting always

    const GoldenCase c = t::LoadGoldenCases(spec.model).at(0);
    estuary::v1::GenerateRequest lossy = cluster.Greedy(c.prompt_ids, 32);
    lossy.mutable_exit()->set_mode(estuary::v1::EXIT_MODE_LOSSY);
    const t::Generated got = t::Generate(cluster.stub(), lossy);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.complete.usage().draft_tokens(), 0);
    EXPECT_LT(got.complete.usage().mean_backbone_layers(), 12.0);  // it exits: τ 0.8
  }
}

// An exit mode the API does not know is refused by the router; lossless on a decode worker
// without the river is refused with the reason; the worker refuses the mode's flags without
// --river.
TEST(LosslessClusterTest, BadModesAndSetupsAreRefused) {
  t::Cluster cluster(t::Spec("stories260K", 1, 1, 1, 1));
  const GoldenCase c = t::LoadGoldenCases("stories260K").at(0);
  estuary::v1::GenerateRequest request = cluster.Greedy(c.prompt_ids, 8);
  request.mutable_exit()->set_mode(static_cast<estuary::v1::ExitMode>(7));
  t::Generated got = t::Generate(cluster.stub(), request);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.status.error_message().find("exit.mode"), std::string::npos)
      << got.status.error_message();

  request.mutable_exit()->set_mode(estuary::v1::EXIT_MODE_LOSSLESS);
  got = t::Generate(cluster.stub(), request);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.status.error_message().find("--river"), std::string::npos)
      << got.status.error_message();

  struct BadFlags {
    std::vector<std::string> flags;
    std::string error;
  };
  for (const BadFlags& bad :
       {BadFlags{{"--exit-mode", "lossless"}, "add --river"},
        BadFlags{{"--draft-tokens", "3"}, "need --river"},
        BadFlags{{"--river", "--exit-mode", "bogus"}, "use lossy or lossless"}}) {
    std::vector<std::string> argv = {t::BinaryPath("decode/estuary-decode"),
                                     "--model", t::GoldenModelDir("stories260K"),
                                     "--router", cluster.router_address(), "--port", "0"};
    argv.insert(argv.end(), bad.flags.begin(), bad.flags.end());
    auto result = t::RunProcess(argv);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->exit_code, 1) << bad.flags[0] << "\n" << result->err;  // before serving
    EXPECT_NE(result->err.find(bad.error), std::string::npos) << result->err;
  }
}

}  // namespace
}  // namespace estuary
