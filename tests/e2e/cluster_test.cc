// The whole disaggregated cluster end to end (issue: router, gRPC API, `estuary up`): real
// estuary-router, estuary-prefill and estuary-decode processes on loopback with the tiny real
// models, called through the public estuary.v1.Inference API only.

#include <signal.h>

#include <algorithm>
#include <atomic>
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
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::GoldenCase;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / absl::StrCat("estuary-e2e-", ::getpid(), "-", name)).string();
}

using Process = ServingProcess;

Process Start(const std::string& binary, const std::string& name, std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--port", "0"});
  auto started = StartServing(BinaryPath(binary), flags, TempPath(name), absl::Seconds(60));
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? std::move(*started) : Process();
}

// The golden runs generated 200 tokens or up to the context (256 for stories12L); the router,
// like vLLM, refuses a max_tokens that does not fit, so the tests ask for what fits.
int FittingMaxTokens(const std::vector<int32_t>& prompt, int context, int wanted = 200) {
  return std::min(wanted, context - static_cast<int>(prompt.size()));
}

estuary::v1::GenerateRequest GreedyIds(const std::vector<int32_t>& prompt, int max_tokens) {
  estuary::v1::GenerateRequest request;
  for (int32_t t : prompt) request.mutable_tokens()->add_ids(t);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  return request;
}

struct ClusterSpec {
  std::string model = "stories12L";
  int prefill = 1, decode = 1, tp_prefill = 1, tp_decode = 1;
  std::vector<std::string> router_flags;
};
void PrintTo(const ClusterSpec& s, std::ostream* os) {
  *os << s.model << " " << s.prefill << "P(TP" << s.tp_prefill << ") " << s.decode << "D(TP"
      << s.tp_decode << ")";
}

// A router and its workers; the destructor kills what is left.
class Cluster {
 public:
  explicit Cluster(const ClusterSpec& spec) : spec_(spec) {
    const std::string model = ::estuary::testing::GoldenModelDir(spec.model);
    std::vector<std::string> router_flags = {"--model", model};
    router_flags.insert(router_flags.end(), spec.router_flags.begin(), spec.router_flags.end());
    router_ = Start("router/estuary-router", "router", router_flags);
    for (int i = 0; i < spec.decode + spec.prefill; ++i) {
      const bool decode = i < spec.decode;
      workers_.push_back(Start(
          decode ? "decode/estuary-decode" : "prefill/estuary-prefill",
          absl::StrCat(decode ? "decode" : "prefill", i),
          {"--model", model, "--router", router_.address, "--ucx-tls", "tcp",
           "--tensor-parallel-size", std::to_string(decode ? spec.tp_decode : spec.tp_prefill),
           "--kv-cache-bytes", "33554432"}));
    }
    stub_ = estuary::v1::Inference::NewStub(
        grpc::CreateChannel(router_.address, grpc::InsecureChannelCredentials()));
    WaitUntilRegistered();
  }

  estuary::v1::Inference::Stub& stub() { return *stub_; }
  // A greedy request for `prompt` with as many new tokens as the golden runs had.
  estuary::v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, int wanted = 200) const {
    return GreedyIds(prompt, FittingMaxTokens(prompt, context_, wanted));
  }
  Process& decode(int i) { return workers_[static_cast<size_t>(i)]; }
  Process& prefill(int i) { return workers_[static_cast<size_t>(spec_.decode + i)]; }
  std::string Logs() {
    std::string all = "router:\n" + router_.process->Log();
    for (Process& w : workers_) all += "\nworker " + w.address + ":\n" + w.process->Log();
    return all;
  }

 private:
  void WaitUntilRegistered() {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      estuary::v1::ModelInfo info;
      if (stub_->GetModelInfo(&context, {}, &info).ok() && info.decode_tp_size() > 0 &&
          (spec_.prefill == 0 || info.prefill_tp_size() > 0)) {
        context_ = info.context_length();
        return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "workers did not register:\n" << Logs();
  }

  ClusterSpec spec_;
  Process router_;
  std::vector<Process> workers_;
  std::unique_ptr<estuary::v1::Inference::Stub> stub_;
  int context_ = 0;
};

struct Generated {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  estuary::v1::Complete complete;
};

Generated Generate(estuary::v1::Inference::Stub& stub, const estuary::v1::GenerateRequest& request,
              grpc::ClientContext* context = nullptr) {
  grpc::ClientContext local;
  if (context == nullptr) {
    context = &local;
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  }
  auto reader = stub.Generate(context, request);
  Generated out;
  estuary::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      out.ids.insert(out.ids.end(), response.chunk().token_ids().begin(),
                     response.chunk().token_ids().end());
      out.text += response.chunk().text();
    } else if (response.has_complete()) {
      out.complete = response.complete();
    }
  }
  out.status = reader->Finish();
  return out;
}

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
    ::testing::Values(ClusterSpec{"stories260K", 1, 1, 1, 1, {}},
                      ClusterSpec{"stories12L", 1, 1, 1, 1, {}},
                      ClusterSpec{"stories12L", 2, 2, 1, 1, {}},
                      ClusterSpec{"stories12L", 1, 1, 2, 1, {}}),
    SpecName);

// Text in, text out: the golden completion text, and the same ids with local prefill.
TEST(ClusterTest, TextPromptAndLocalPrefillGiveTheGoldenCompletion) {
  Cluster cluster(ClusterSpec{"stories12L", 1, 1, 1, 1, {"--local-prefill-max-tokens", "8"}});
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
  Cluster cluster(ClusterSpec{"stories12L", 2, 2, 1, 1, {}});
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

int FreePages(const std::string& address, bool decode) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  estuary::v1::WorkerLoad load;
  grpc::ClientContext context;
  const grpc::Status status =
      decode ? estuary::v1::DecodeWorker::NewStub(channel)->GetLoad(&context, {}, &load)
             : estuary::v1::PrefillWorker::NewStub(channel)->GetLoad(&context, {}, &load);
  return status.ok() ? load.free_pages() : -1;
}

// A stream the client cancels after its first chunk frees its pages on both workers.
TEST(ClusterTest, ACancelledStreamFreesItsPagesOnBothWorkers) {
  Cluster cluster(ClusterSpec{"stories12L", 1, 1, 1, 1, {}});
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

// SIGKILL of a decode worker: its streams end UNAVAILABLE within 2 s; new requests go to the
// surviving one.
TEST(ClusterTest, AKilledDecodeWorkerEndsItsStreamsAndOthersCarryOn) {
  Cluster cluster(ClusterSpec{"stories12L", 1, 2, 1, 1, {"--policy", "round_robin"}});
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases("stories12L");
  constexpr int kStreams = 4;
  std::vector<grpc::ClientContext> contexts(kStreams);
  std::vector<std::unique_ptr<grpc::ClientReader<estuary::v1::GenerateResponse>>> readers;
  for (int i = 0; i < kStreams; ++i) {
    estuary::v1::GenerateRequest request = cluster.Greedy(cases[0].prompt_ids, 250);
    request.mutable_sampling()->set_ignore_eos(true);
    readers.push_back(cluster.stub().Generate(&contexts[i], request));
    estuary::v1::GenerateResponse first;
    ASSERT_TRUE(readers.back()->Read(&first)) << cluster.Logs();
  }
  cluster.decode(0).process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  int unavailable = 0;
  std::vector<std::thread> drains;
  std::atomic<int> ok{0};
  for (int i = 0; i < kStreams; ++i) {
    estuary::v1::GenerateResponse response;
    while (readers[i]->Read(&response)) {
    }
    const grpc::Status status = readers[i]->Finish();
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ++unavailable;
      EXPECT_LT(absl::Now() - killed, absl::Seconds(2)) << "stream " << i;
    } else {
      EXPECT_TRUE(status.ok()) << status.error_message();
      ++ok;
    }
  }
  EXPECT_GE(unavailable, 1);
  EXPECT_GE(ok.load(), 1);
  for (int i = 0; i < 3; ++i) {
    const Generated got = Generate(cluster.stub(), cluster.Greedy(cases[1].prompt_ids));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.ids, cases[1].completion_ids);
  }
}

// Bad requests are refused with INVALID_ARGUMENT naming the limit.
TEST(ClusterTest, InvalidRequestsNameTheLimit) {
  Cluster cluster(ClusterSpec{"stories260K", 1, 1, 1, 1, {}});
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
TEST(EstuaryUpTest, StartsTheClusterServesAndStopsOnSigterm) {
  const std::string ready = TempPath("up.ready");
  fs::remove(ready);
  auto up = ChildProcess::Start(
      {BinaryPath("cli/estuary"), "up", "--model",
       ::estuary::testing::GoldenModelDir("stories260K"), "--port", "0", "--ready-file", ready,
       "--log-dir", TempPath("up-logs")},
      TempPath("up.log"));
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

}  // namespace
}  // namespace estuary
