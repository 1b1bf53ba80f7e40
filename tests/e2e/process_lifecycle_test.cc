// Cluster-ready processes on loopback (issue: truthful health, graceful drain, a router without
// weights): real estuary-router and estuary-decode processes, their grpc.health.v1 answers,
// SIGTERM drains, and the router's link dependencies.
//
// Engines are slowed down with --debug-step-delay (every step with work sleeps first), so that
// a request is reliably in flight when a signal or a stall check comes.

#include <signal.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/common/child_process.h"
#include "core/loader/hf_writer.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/health_check.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::CheckHealth;
using ::estuary::testing::Generate;
using ::estuary::testing::Generated;
using ::estuary::testing::GoldenCase;
using ::estuary::testing::GoldenModelDir;
using ::estuary::testing::GreedyIds;
using ::estuary::testing::kNotServing;
using ::estuary::testing::kServing;
using ::estuary::testing::StartWorker;
using ::estuary::testing::TempPath;
using ::estuary::testing::WaitForHealth;

constexpr char kLiveness[] = "liveness";

// A decode worker on stories260K; `flags` come last.
ServingProcess StartDecode(const std::string& name, std::vector<std::string> flags) {
  std::vector<std::string> all = {"--model", GoldenModelDir("stories260K"), "--ucx-tls", "tcp",
                                  "--kv-cache-bytes", "33554432"};
  all.insert(all.end(), flags.begin(), flags.end());
  return StartWorker("decode/estuary-decode", name, all);
}

ServingProcess StartRouter(const std::string& name, std::vector<std::string> flags) {
  std::vector<std::string> all = {"--model", GoldenModelDir("stories260K")};
  all.insert(all.end(), flags.begin(), flags.end());
  return StartWorker("router/estuary-router", name, all);
}

// A decode-local request straight to a decode worker (it prefills the prompt itself).
estuary::v1::DecodeRequest LocalDecode(const std::string& id, int max_tokens) {
  estuary::v1::DecodeRequest request;
  estuary::v1::WorkerRequest* r = request.mutable_local_prefill();
  r->set_request_id(id);
  for (int32_t t : {1, 403, 407, 261}) r->add_prompt_ids(t);
  r->mutable_sampling()->set_temperature(0.0f);
  r->mutable_sampling()->set_max_tokens(max_tokens);
  r->mutable_sampling()->set_ignore_eos(true);
  return request;
}

struct Streamed {
  grpc::Status status;
  int tokens = 0;
};

// Streams a Decode call; `on_first` runs once the first tokens arrived.
Streamed StreamDecode(const std::string& address, const estuary::v1::DecodeRequest& request,
                      const std::function<void()>& on_first = nullptr) {
  auto stub = estuary::v1::DecodeWorker::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->Decode(&context, request);
  Streamed out;
  estuary::v1::DecodeResponse response;
  while (reader->Read(&response)) {
    const bool first = out.tokens == 0 && response.token_ids_size() > 0;
    out.tokens += response.token_ids_size();
    if (first && on_first) on_first();
  }
  out.status = reader->Finish();
  return out;
}

void ExpectHealth(const std::string& address, const std::string& service,
                  testing::HealthStatus want, absl::Duration timeout, const char* what) {
  absl::StatusOr<absl::Duration> took = WaitForHealth(address, service, want, timeout);
  EXPECT_TRUE(took.ok()) << what << ": " << took.status();
}

// A stalled step turns the worker not ready; its load, read live (what heartbeats send), still
// counts the request queued behind the step rather than the figures of the engine's last step.
TEST(WorkerHealthTest, AStalledEngineIsNotServingUntilItsStepEnds) {
  ServingProcess decode = StartDecode(
      "stall", {"--debug-step-delay", "2s", "--engine-stall-timeout", "300ms"});
  ASSERT_NE(decode.process, nullptr);
  ExpectHealth(decode.address, "", kServing, absl::Seconds(10), "a fresh worker turns ready");
  std::thread request([&] {
    const Streamed got = StreamDecode(decode.address, LocalDecode("slow", 1));
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  });
  ExpectHealth(decode.address, "", kNotServing, absl::Seconds(2),
               "a step running past --engine-stall-timeout");
  {
    auto stub = estuary::v1::DecodeWorker::NewStub(
        grpc::CreateChannel(decode.address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    estuary::v1::WorkerLoad load;
    ASSERT_TRUE(stub->GetLoad(&context, {}, &load).ok());
    EXPECT_EQ(load.waiting_sequences() + load.running_sequences(), 1)
        << "the request waiting on the stalled step";
    EXPECT_TRUE(load.not_ready());
  }
  EXPECT_EQ(CheckHealth(decode.address, kLiveness).value_or(kNotServing), kServing)
      << "liveness never depends on the engine";
  request.join();
  ExpectHealth(decode.address, "", kServing, absl::Seconds(5), "the stall ended");
}

TEST(WorkerDrainTest, SigtermRefusesNewWorkAndFinishesWhatRuns) {
  ServingProcess decode = StartDecode("drain", {"--debug-step-delay", "100ms"});
  ASSERT_NE(decode.process, nullptr);
  ExpectHealth(decode.address, "", kServing, absl::Seconds(10), "ready");
  std::thread signaller;
  const Streamed got = StreamDecode(decode.address, LocalDecode("inflight", 20), [&] {
    decode.process->Signal(SIGTERM);
    signaller = std::thread([&] {
      ExpectHealth(decode.address, "", kNotServing, absl::Seconds(1), "NOT_SERVING on SIGTERM");
      const Streamed refused = StreamDecode(decode.address, LocalDecode("late", 2));
      EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << refused.status.error_message();
      EXPECT_NE(refused.status.error_message().find("draining"), std::string::npos)
          << refused.status.error_message();
    });
  });
  signaller.join();
  EXPECT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << decode.process->Log();
  EXPECT_EQ(got.tokens, 20);
  absl::StatusOr<int> exited = decode.process->Wait(absl::Seconds(10));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 0) << decode.process->Log();
}

TEST(WorkerDrainTest, ADrainPastItsTimeoutEndsStreamsWithUnavailable) {
  ServingProcess decode =
      StartDecode("timeout", {"--debug-step-delay", "200ms", "--shutdown-timeout", "500ms"});
  ASSERT_NE(decode.process, nullptr);
  absl::Time signalled;
  const Streamed got = StreamDecode(decode.address, LocalDecode("long", 100), [&] {
    signalled = absl::Now();
    decode.process->Signal(SIGTERM);
  });
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE) << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("shutdown-timeout"), std::string::npos)
      << got.status.error_message();
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(4));
  EXPECT_LT(got.tokens, 100);
  absl::StatusOr<int> exited = decode.process->Wait(absl::Seconds(10));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 0);
}

TEST(WorkerDrainTest, ASecondSignalExitsAtOnce) {
  ServingProcess decode =
      StartDecode("twice", {"--debug-step-delay", "200ms", "--shutdown-timeout", "60s"});
  ASSERT_NE(decode.process, nullptr);
  absl::Time second;
  std::thread request([&] {
    (void)StreamDecode(decode.address, LocalDecode("long", 100), [&] {
      decode.process->Signal(SIGTERM);
      absl::SleepFor(absl::Milliseconds(300));
      second = absl::Now();
      decode.process->Signal(SIGTERM);
    });
  });
  request.join();  // the stream ends when the process goes
  EXPECT_LT(absl::Now() - second, absl::Seconds(5));
  absl::StatusOr<int> exited = decode.process->Wait(absl::Seconds(5));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 1);
}

TEST(RouterHealthTest, ReadyOnlyWithADecodeWorkerWhileLivenessStaysUp) {
  ServingProcess router = StartRouter("router-health", {"--port", "0"});
  ASSERT_NE(router.process, nullptr);
  EXPECT_EQ(CheckHealth(router.address, "").value_or(kServing), kNotServing)
      << "no decode worker yet";
  EXPECT_EQ(CheckHealth(router.address, kLiveness).value_or(kNotServing), kServing);
  ServingProcess decode = StartDecode("decode-health", {"--router", router.address});
  ASSERT_NE(decode.process, nullptr);
  ExpectHealth(router.address, "", kServing, absl::Seconds(10), "a decode worker registered");
  decode.process->Signal(SIGKILL);  // gone without a word: the router notices by expiry
  ExpectHealth(router.address, "", kNotServing, absl::Seconds(8), "its only decode worker died");
  EXPECT_EQ(CheckHealth(router.address, kLiveness).value_or(kNotServing), kServing)
      << "one dead worker must not fail the router's liveness";
}

// A router and one decode worker that registers with it, slowed to 100 ms a step so that
// streams are still running when the test signals; ready when returned (check `router.process`).
struct RouterWithSlowDecode {
  ServingProcess router, decode;
  std::unique_ptr<estuary::v1::Inference::Stub> stub;
};

RouterWithSlowDecode StartRouterWithSlowDecode(const std::string& name,
                                               std::vector<std::string> router_flags) {
  RouterWithSlowDecode started;
  router_flags.insert(router_flags.begin(), {"--port", "0"});
  started.router = StartRouter("router-" + name, router_flags);
  if (started.router.process == nullptr) return started;
  started.decode = StartDecode(
      "decode-" + name, {"--router", started.router.address, "--debug-step-delay", "100ms"});
  if (started.decode.process == nullptr) {
    started.router.process = nullptr;
    return started;
  }
  ExpectHealth(started.router.address, "", kServing, absl::Seconds(10), "ready");
  started.stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(started.router.address, grpc::InsecureChannelCredentials()));
  return started;
}

// A greedy stream of `tokens` tokens that ignores EOS, with a 60 s deadline.
std::unique_ptr<grpc::ClientReader<estuary::v1::GenerateResponse>> StartStream(
    estuary::v1::Inference::Stub& stub, grpc::ClientContext& context, int tokens) {
  estuary::v1::GenerateRequest request = GreedyIds({1, 403, 407}, tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  return stub.Generate(&context, request);
}

TEST(RouterDrainTest, SigtermRefusesNewRequestsAndFinishesStreams) {
  RouterWithSlowDecode cluster = StartRouterWithSlowDecode("drain", {});
  ASSERT_NE(cluster.router.process, nullptr);
  ServingProcess& router = cluster.router;
  estuary::v1::Inference::Stub* stub = cluster.stub.get();
  grpc::ClientContext context;
  auto reader = StartStream(*stub, context, 20);
  estuary::v1::GenerateResponse response;
  int tokens = 0;
  bool signalled = false;
  while (reader->Read(&response)) {
    if (response.has_chunk()) tokens += response.chunk().token_ids_size();
    if (tokens > 0 && !signalled) {
      signalled = true;
      router.process->Signal(SIGTERM);
      ExpectHealth(router.address, "", kNotServing, absl::Seconds(1), "NOT_SERVING on SIGTERM");
      const Generated refused = Generate(*stub, GreedyIds({1, 403}, 2));
      EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << refused.status.error_message();
      EXPECT_NE(refused.status.error_message().find("draining"), std::string::npos)
          << refused.status.error_message();
    }
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message() << "\n" << router.process->Log();
  EXPECT_EQ(tokens, 20);
  absl::StatusOr<int> exited = router.process->Wait(absl::Seconds(10));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 0);
}

TEST(RouterDrainTest, ADrainPastItsTimeoutEndsStreamsWithUnavailable) {
  RouterWithSlowDecode cluster = StartRouterWithSlowDecode("timeout", {"--shutdown-timeout", "300ms"});
  ASSERT_NE(cluster.router.process, nullptr);
  ServingProcess& router = cluster.router;
  grpc::ClientContext context;
  auto reader = StartStream(*cluster.stub, context, 200);
  estuary::v1::GenerateResponse response;
  int tokens = 0;
  absl::Time signalled = absl::InfiniteFuture();
  while (reader->Read(&response)) {
    if (response.has_chunk()) tokens += response.chunk().token_ids_size();
    if (tokens > 0 && signalled == absl::InfiniteFuture()) {
      signalled = absl::Now();
      router.process->Signal(SIGTERM);
    }
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("shutdown-timeout"), std::string::npos)
      << status.error_message();
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(4));
  EXPECT_LT(tokens, 200);
  absl::StatusOr<int> exited = router.process->Wait(absl::Seconds(10));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 0);
}

// The router reads config, tokenizer and generation config only: a folder that holds no weight
// file serves, and the answers are the golden ones (the workers hold the weights).
TEST(RouterMetadataTest, ServesFromAFolderWithoutWeights) {
  const fs::path full = TempPath("hf-stories260K");
  const fs::path meta = TempPath("meta-stories260K");
  fs::remove_all(full);
  fs::remove_all(meta);
  ASSERT_TRUE(ConvertLlama2cToHf(GoldenModelDir("stories260K"), full.string(), DType::kF32).ok());
  fs::create_directories(meta);
  int weight_files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(full)) {
    if (entry.path().extension() == ".safetensors") {
      ++weight_files;
      continue;
    }
    fs::copy(entry.path(), meta / entry.path().filename());
  }
  ASSERT_GT(weight_files, 0);
  ServingProcess router = StartWorker("router/estuary-router", "router-meta",
                                      {"--model", meta.string(), "--model-id", "stories260K"});
  ASSERT_NE(router.process, nullptr);
  ServingProcess decode = StartWorker(
      "decode/estuary-decode", "decode-meta",
      {"--model", full.string(), "--model-id", "stories260K", "--router", router.address,
       "--ucx-tls", "tcp", "--kv-cache-bytes", "33554432"});
  ASSERT_NE(decode.process, nullptr);
  ExpectHealth(router.address, "", kServing, absl::Seconds(10), "ready");
  auto stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(router.address, grpc::InsecureChannelCredentials()));
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases("stories260K");
  ASSERT_FALSE(cases.empty());
  for (const GoldenCase& c : cases) {
    const Generated got = Generate(*stub, GreedyIds(c.prompt_ids, 200));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << router.process->Log();
    EXPECT_EQ(got.ids, c.completion_ids) << "case " << c.index;
  }
  fs::remove_all(full);
  fs::remove_all(meta);
}

// A wrong --advertise-address (not an address of this host) stops the worker at start, naming
// the flag, before anything loads.
TEST(WorkerAddressTest, AForeignAdvertiseAddressFailsAtStart) {
  absl::StatusOr<testing::ProcessResult> run = testing::RunProcess(
      {BinaryPath("decode/estuary-decode"), "--model", GoldenModelDir("stories260K"), "--host",
       "0.0.0.0", "--port", "0", "--advertise-address", "198.51.100.7"},
      absl::Seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(run->exit_code, 0);
  EXPECT_NE(run->err.find("--advertise-address = '198.51.100.7'"), std::string::npos) << run->err;
}

// estuary-router links no engine library: no BLAS, no UCX, no NCCL, no CUDA, no SIMD kernels.
TEST(RouterLinkTest, TheRouterBinaryLinksNoEngineLibrary) {
  const std::string router = BinaryPath("router/estuary-router");
  absl::StatusOr<testing::ProcessResult> ldd = testing::RunProcess({"/usr/bin/ldd", router});
  ASSERT_TRUE(ldd.ok()) << ldd.status();
  ASSERT_EQ(ldd->exit_code, 0) << ldd->err;
  absl::StatusOr<testing::ProcessResult> needed =
      testing::RunProcess({"/usr/bin/readelf", "-d", router});
  ASSERT_TRUE(needed.ok()) << needed.status();
  ASSERT_NE(needed->out.find("(NEEDED)"), std::string::npos) << needed->out;
  for (const char* library : {"libopenblas", "libblas", "libucp", "libucs", "libuct", "libucm",
                              "libnccl", "libcudart", "libcuda.", "libcublas", "libhwy"}) {
    EXPECT_EQ(ldd->out.find(library), std::string::npos)
        << "estuary-router loads " << library << ":\n" << ldd->out;
    EXPECT_EQ(needed->out.find(library), std::string::npos) << library;
  }
  // The check can fail: the decode worker does load the engine libraries.
  absl::StatusOr<testing::ProcessResult> decode =
      testing::RunProcess({"/usr/bin/ldd", BinaryPath("decode/estuary-decode")});
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_NE(decode->out.find("libucp"), std::string::npos) << decode->out;
}

}  // namespace
}  // namespace estuary
