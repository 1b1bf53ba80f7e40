// n > 1 over the OpenAI door: the samples of a prompt share its KV pages. The first sample runs
// disaggregated (prefill worker, KV pushed over UCX); the others start once it has a token and
// run beside it on its decode worker, adopting the prompt's full pages from the prefix cache
// and computing only the last, partial page. Checked on a real cluster (stories260K): each
// sample's text equals that of a lone request with its seed (seed + k), and the decode worker's
// prefix-cache hits grow by the shared pages' tokens of every later sample.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::Cluster;
using ::estuary::testing::ClusterSpec;
using ::estuary::testing::LoggedAddress;
using ::estuary::testing::RouterHttpAddress;
using ::estuary::testing::Spec;

constexpr int kBlockSize = 16;  // the workers' default --block-size

// The sample of a Prometheus text page named `name` (whatever its labels: a worker's carry
// model_name), or -1 when absent.
double Metric(const std::string& address, const std::string& name) {
  httplib::Client client(absl::StrCat("http://", address));
  auto page = client.Get("/metrics");
  if (!page || page->status != 200) return -1;
  for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    double value = 0;
    if (fields.size() != 2) continue;
    const absl::string_view series = fields[0].substr(0, fields[0].find('{'));
    if (series == name && absl::SimpleAtod(fields[1], &value)) return value;
  }
  return -1;
}

nlohmann::json Complete(httplib::Client& client, const nlohmann::json& body) {
  auto r = client.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r) << "no answer";
  if (!r) return nlohmann::json();
  EXPECT_EQ(r->status, 200) << r->body;
  return nlohmann::json::parse(r->body, nullptr, false);
}

TEST(SharedSamplesTest, NSamplesShareThePromptsPagesAndMatchLoneRequests) {
  ClusterSpec spec = Spec("stories260K", 1, 1, 1, 1, {"--http-port", "0"});
  spec.decode_flags = {"--metrics-port", "0"};
  Cluster cluster(spec);
  const std::string http = RouterHttpAddress(cluster);
  const std::string metrics = LoggedAddress(cluster.decode(0), "metrics on http://");
  ASSERT_FALSE(http.empty());
  ASSERT_FALSE(metrics.empty());
  httplib::Client client(absl::StrCat("http://", http));
  client.set_read_timeout(60);

  // A prompt of several full pages: a golden prompt and the start of its story.
  const testing::GoldenCase c = testing::LoadGoldenCases("stories260K")[0];
  std::vector<int32_t> prompt = c.prompt_ids;
  prompt.insert(prompt.end(), c.completion_ids.begin(), c.completion_ids.begin() + 60);
  const int full_page_tokens = static_cast<int>(prompt.size()) / kBlockSize * kBlockSize;
  ASSERT_GE(full_page_tokens, 3 * kBlockSize);
  constexpr int kN = 4;
  constexpr int kSeed = 4242;
  const nlohmann::json base = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0.8},
                               {"ignore_eos", true}, {"return_token_ids", true}};

  const double hits_before = Metric(metrics, "estuary:prefix_cache_hits_total");
  ASSERT_GE(hits_before, 0);
  nlohmann::json together = base;
  together["n"] = kN;
  together["seed"] = kSeed;
  const nlohmann::json shared = Complete(client, together);
  ASSERT_EQ(shared["choices"].size(), static_cast<size_t>(kN)) << shared.dump();
  const double hits_after = Metric(metrics, "estuary:prefix_cache_hits_total");
  // Every later sample adopted the prompt's full pages (a page holding the prompt's last token
  // is never adopted, so at most full_page_tokens each, at least one page less).
  EXPECT_GE(hits_after - hits_before, (kN - 1) * (full_page_tokens - kBlockSize))
      << "before " << hits_before << ", after " << hits_after;
  std::printf("%d samples of a %zu-token prompt: %.0f prompt tokens' KV adopted from the prefix "
              "cache\n", kN, prompt.size(), hits_after - hits_before);

  std::vector<std::vector<int32_t>> distinct;
  for (int k = 0; k < kN; ++k) {
    nlohmann::json lone = base;
    lone["seed"] = kSeed + k;
    const nlohmann::json alone = Complete(client, lone);
    ASSERT_EQ(alone["choices"].size(), 1u);
    const auto ids = shared["choices"][k]["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, alone["choices"][0]["token_ids"].get<std::vector<int32_t>>()) << "sample " << k;
    EXPECT_EQ(ids.size(), 24u);
    if (std::find(distinct.begin(), distinct.end(), ids) == distinct.end()) distinct.push_back(ids);
  }
  EXPECT_GT(distinct.size(), 1u) << "the samples are not different samples";
}

}  // namespace
}  // namespace estuary
