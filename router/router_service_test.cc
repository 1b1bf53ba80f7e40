// The router end to end in one process: a DecodeService and a PrefillService (KV over the
// in-process transport) on one gRPC server, registered with a RouterService through
// RegistrationClient; a client calls estuary.v1.Inference on the router's own server.
// The golden greedy prompt of stories260K must come back with the golden ids and text,
// disaggregated and locally prefilled.

#include "router/router_service.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "core/model/model_loader.h"
#include "decode/decode_service.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess_transport.h"
#include "prefill/prefill_service.h"
#include "worker/registration_client.h"
#include "rpc/grpc_server.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/inprocess_workers.h"

namespace estuary::router {
namespace {

using worker::DefaultWorkerId;
using worker::RegistrationClient;

using ::estuary::testing::GoldenCase;
using ::estuary::testing::GoldenModelDir;

estuary::v1::WorkerInfo InfoOf(const LlamaConfig& config, estuary::v1::WorkerRole role,
                               const std::string& address,
                               const estuary::v1::KvFormatFingerprint& fingerprint) {
  estuary::v1::WorkerInfo info;
  info.set_worker_id(DefaultWorkerId(role, address));
  info.set_role(role);
  info.set_address(address);
  info.set_model_id("stories260K");
  info.set_tp_size(1);
  info.set_block_size(16);
  *info.mutable_fingerprint() = fingerprint;
  info.set_context_length(config.max_seq_len);
  info.set_vocab_size(config.vocab_size);
  info.set_num_layers(config.n_layers);
  return info;
}

// Both workers and the router, each worker registered through a RegistrationClient.
class Cluster {
 public:
  explicit Cluster(RouterOptions options, bool with_prefill = true)
      : workers_(::estuary::testing::InProcessWorkersOptions{}) {
    options.model = GoldenModelDir("stories260K");
    options.port = 0;
    auto router = RouterService::Create(options);
    EXPECT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    auto server = rpc::StartGrpcServer("127.0.0.1", 0, router_->services());
    EXPECT_TRUE(server.ok()) << server.status();
    router_server_ = std::move(*server);
    stub_ = estuary::v1::Inference::NewStub(
        grpc::CreateChannel(router_server_.address, grpc::InsecureChannelCredentials()));

    const LlamaConfig& config = workers_.config();
    decode_registration_.Start(
        router_server_.address,
        InfoOf(config, estuary::v1::WORKER_ROLE_DECODE, workers_.address(),
               workers_.decode().fingerprint()),
        [this] {
          estuary::v1::WorkerLoad load;
          (void)workers_.decode().GetLoad(nullptr, nullptr, &load);
          return load;
        });
    if (with_prefill) {
      prefill_registration_.Start(
          router_server_.address,
          InfoOf(config, estuary::v1::WORKER_ROLE_PREFILL, workers_.address(),
                 workers_.prefill().fingerprint()),
          [this] {
            estuary::v1::WorkerLoad load;
            (void)workers_.prefill().GetLoad(nullptr, nullptr, &load);
            return load;
          });
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    // Both sides must agree: the registry lists the workers and each client saw its answer.
    while (absl::Now() < give_up &&
           (router_->registry().Live(estuary::v1::WORKER_ROLE_DECODE, absl::Now()).empty() ||
            !decode_registration_.registered() ||
            (with_prefill &&
             (router_->registry().Live(estuary::v1::WORKER_ROLE_PREFILL, absl::Now()).empty() ||
              !prefill_registration_.registered())))) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(decode_registration_.registered());
    if (with_prefill) {
      EXPECT_TRUE(prefill_registration_.registered());
    }
  }
  ~Cluster() {
    decode_registration_.Stop();
    prefill_registration_.Stop();
    router_server_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }

  estuary::v1::Inference::Stub& stub() { return *stub_; }
  RouterService& router() { return *router_; }
  DecodeService& decode() { return workers_.decode(); }
  const std::string& worker_address() const { return workers_.address(); }
  int DecodeFreePages() { return workers_.DecodeFreePages(); }

 private:
  ::estuary::testing::InProcessWorkers workers_;
  std::unique_ptr<RouterService> router_;
  rpc::RunningServer router_server_;
  std::unique_ptr<estuary::v1::Inference::Stub> stub_;
  RegistrationClient decode_registration_;
  RegistrationClient prefill_registration_;
};

struct Generated {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::vector<int32_t> exit_layers;
  std::string text;
  std::string request_id;
  int chunks = 0;
  std::optional<estuary::v1::Complete> complete;
};

Generated Generate(estuary::v1::Inference::Stub& stub, const estuary::v1::GenerateRequest& request,
                   absl::Duration timeout = absl::Seconds(60)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto reader = stub.Generate(&context, request);
  Generated out;
  estuary::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    out.request_id = response.request_id();
    if (response.has_chunk()) {
      ++out.chunks;
      EXPECT_EQ(response.chunk().token_ids_size(), response.chunk().exit_layers_size());
      out.ids.insert(out.ids.end(), response.chunk().token_ids().begin(),
                     response.chunk().token_ids().end());
      out.exit_layers.insert(out.exit_layers.end(), response.chunk().exit_layers().begin(),
                             response.chunk().exit_layers().end());
      out.text += response.chunk().text();
    } else if (response.has_complete()) {
      EXPECT_FALSE(out.complete.has_value()) << "two Complete messages";
      out.complete = response.complete();
    }
  }
  out.status = reader->Finish();
  return out;
}

estuary::v1::GenerateRequest GoldenRequest(const GoldenCase& c) {
  estuary::v1::GenerateRequest request;
  request.set_text(c.prompt);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(::estuary::testing::kGoldenMaxNewTokens);
  return request;
}

void ExpectGolden(const Generated& out, const GoldenCase& c, const std::string& golden_text,
                  int num_layers) {
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.ids, c.completion_ids);
  EXPECT_EQ(out.text, golden_text);
  ASSERT_TRUE(out.complete.has_value());
  const estuary::v1::Complete& complete = *out.complete;
  EXPECT_EQ(complete.finish_reason(),
            static_cast<int>(c.completion_ids.size()) == ::estuary::testing::kGoldenMaxNewTokens
                ? estuary::v1::FINISH_REASON_LENGTH
                : estuary::v1::FINISH_REASON_EOS);
  EXPECT_EQ(complete.usage().prompt_tokens(), static_cast<int>(c.prompt_ids.size()));
  EXPECT_EQ(complete.usage().completion_tokens(), static_cast<int>(c.completion_ids.size()));
  // No river on these workers: every token runs the full depth.
  EXPECT_DOUBLE_EQ(complete.usage().mean_backbone_layers(), num_layers);
  ASSERT_EQ(complete.usage().exit_layer_histogram_size(), num_layers + 1);
  EXPECT_EQ(complete.usage().exit_layer_histogram(num_layers),
            static_cast<int64_t>(c.completion_ids.size()));
  for (int32_t layer : out.exit_layers) EXPECT_EQ(layer, -1);
  const estuary::v1::Timings& t = complete.timings();
  EXPECT_GT(t.time_to_first_token_seconds(), 0.0);
  EXPECT_GE(t.time_to_first_token_seconds(), t.queue_seconds());
  EXPECT_GT(t.prefill_seconds(), 0.0);
  EXPECT_GT(t.decode_seconds(), 0.0);
}

class RouterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cases_ = ::estuary::testing::LoadGoldenCases("stories260K");
    ASSERT_FALSE(cases_.empty());
  }
  std::vector<GoldenCase> cases_;
};

TEST_F(RouterServiceTest, GoldenPromptDisaggregated) {
  Cluster cluster{RouterOptions()};
  const int free_at_start = cluster.DecodeFreePages();
  for (size_t i = 0; i < std::min<size_t>(2, cases_.size()); ++i) {
    const Generated out = Generate(cluster.stub(), GoldenRequest(cases_[i]));
    ExpectGolden(out, cases_[i], cases_[i].completion_text, cluster.router().limits().num_layers);
    ASSERT_TRUE(out.complete.has_value());
    EXPECT_GE(out.complete->timings().transfer_seconds(), 0.0);
    EXPECT_FALSE(out.request_id.empty());
  }
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);
  EXPECT_EQ(cluster.router().queued(), 0);
}

TEST_F(RouterServiceTest, GoldenPromptPrefilledLocally) {
  RouterOptions options;
  options.local_prefill_max_tokens = 4096;
  Cluster cluster{options};
  const Generated out = Generate(cluster.stub(), GoldenRequest(cases_[0]));
  ExpectGolden(out, cases_[0], cases_[0].completion_text, cluster.router().limits().num_layers);
  ASSERT_TRUE(out.complete.has_value());
  EXPECT_EQ(out.complete->timings().transfer_seconds(), 0.0);
}

TEST_F(RouterServiceTest, WithoutAPrefillWorkerTheDecodeWorkerPrefills) {
  Cluster cluster{RouterOptions(), /*with_prefill=*/false};
  const Generated out = Generate(cluster.stub(), GoldenRequest(cases_[0]));
  ExpectGolden(out, cases_[0], cases_[0].completion_text, cluster.router().limits().num_layers);
}

TEST_F(RouterServiceTest, TokenInputAndClientRequestId) {
  Cluster cluster{RouterOptions()};
  estuary::v1::GenerateRequest request = GoldenRequest(cases_[0]);
  for (int32_t id : cases_[0].prompt_ids) request.mutable_tokens()->add_ids(id);
  request.set_request_id("my-request");
  request.mutable_sampling()->set_max_tokens(10);
  const Generated out = Generate(cluster.stub(), request);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.request_id, "my-request");
  EXPECT_EQ(out.ids, std::vector<int32_t>(cases_[0].completion_ids.begin(),
                                          cases_[0].completion_ids.begin() + 10));
  ASSERT_TRUE(out.complete.has_value());
  EXPECT_EQ(out.complete->finish_reason(), estuary::v1::FINISH_REASON_LENGTH);
}

TEST_F(RouterServiceTest, StopStringTruncatesTheTextAndEndsTheRequest) {
  Cluster cluster{RouterOptions()};
  const int free_at_start = cluster.DecodeFreePages();
  const std::string& golden = cases_[0].completion_text;
  // A stop string from the middle of the golden text.
  const std::string stop = "Lily";
  const size_t at = golden.find(stop);
  ASSERT_NE(at, std::string::npos);
  estuary::v1::GenerateRequest request = GoldenRequest(cases_[0]);
  request.mutable_sampling()->add_stop(stop);
  const Generated out = Generate(cluster.stub(), request);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.text, golden.substr(0, at));
  ASSERT_TRUE(out.complete.has_value());
  EXPECT_EQ(out.complete->finish_reason(), estuary::v1::FINISH_REASON_STOP_STRING);
  EXPECT_LT(out.ids.size(), cases_[0].completion_ids.size());
  EXPECT_EQ(out.complete->usage().completion_tokens(), static_cast<int>(out.ids.size()));
  EXPECT_EQ(out.ids, std::vector<int32_t>(cases_[0].completion_ids.begin(),
                                          cases_[0].completion_ids.begin() + out.ids.size()));
  // The decode worker dropped the request and its pages.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (cluster.DecodeFreePages() != free_at_start && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);
}

TEST_F(RouterServiceTest, InvalidRequestsNameTheLimit) {
  Cluster cluster{RouterOptions()};
  estuary::v1::GenerateRequest request = GoldenRequest(cases_[0]);
  request.mutable_sampling()->set_max_tokens(1000000);
  Generated out = Generate(cluster.stub(), request);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(out.status.error_message().find("context length"), std::string::npos)
      << out.status.error_message();
  EXPECT_TRUE(out.ids.empty());

  request = GoldenRequest(cases_[0]);
  request.set_model("gpt-5");
  out = Generate(cluster.stub(), request);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RouterServiceTest, AbortEndsTheStreamWithCancelled) {
  Cluster cluster{RouterOptions()};
  const int free_at_start = cluster.DecodeFreePages();
  estuary::v1::GenerateRequest request = GoldenRequest(cases_[0]);
  request.set_request_id("to-abort");
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->set_max_tokens(
      cluster.router().limits().context_length - static_cast<int>(cases_[0].prompt_ids.size()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = cluster.stub().Generate(&context, request);
  estuary::v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));  // streaming has begun
  {
    grpc::ClientContext abort_context;
    estuary::v1::AbortRequest abort;
    abort.set_request_id("to-abort");
    estuary::v1::AbortResponse aborted;
    ASSERT_TRUE(cluster.stub().Abort(&abort_context, abort, &aborted).ok());
    EXPECT_TRUE(aborted.found());
  }
  std::optional<estuary::v1::Complete> complete;
  while (reader->Read(&response)) {
    if (response.has_complete()) complete = response.complete();
  }
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(complete.has_value());
  EXPECT_EQ(complete->finish_reason(), estuary::v1::FINISH_REASON_CANCELLED);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (cluster.DecodeFreePages() != free_at_start && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);

  grpc::ClientContext again;
  estuary::v1::AbortRequest abort;
  abort.set_request_id("to-abort");
  estuary::v1::AbortResponse aborted;
  ASSERT_TRUE(cluster.stub().Abort(&again, abort, &aborted).ok());
  EXPECT_FALSE(aborted.found());
}

TEST_F(RouterServiceTest, ClientCancelAbortsOnTheWorkers) {
  Cluster cluster{RouterOptions()};
  const int free_at_start = cluster.DecodeFreePages();
  estuary::v1::GenerateRequest request = GoldenRequest(cases_[0]);
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->set_max_tokens(
      cluster.router().limits().context_length - static_cast<int>(cases_[0].prompt_ids.size()));
  {
    grpc::ClientContext context;
    auto reader = cluster.stub().Generate(&context, request);
    estuary::v1::GenerateResponse response;
    ASSERT_TRUE(reader->Read(&response));
    context.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (cluster.DecodeFreePages() != free_at_start && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);
  EXPECT_EQ(cluster.decode().engine().running(), 0);
}

TEST_F(RouterServiceTest, AnUnreachableWorkerIsDroppedAndTheRequestRetried) {
  RouterOptions options;
  options.policy = Policy::kRoundRobin;
  Cluster cluster{options};
  // A decode worker that registered and then vanished (nothing listens on port 1).
  estuary::v1::WorkerInfo ghost = InfoOf(
      LlamaConfig{}, estuary::v1::WORKER_ROLE_DECODE, "127.0.0.1:1", cluster.decode().fingerprint());
  ghost.set_context_length(0);
  ghost.set_vocab_size(0);
  ghost.set_num_layers(0);
  ASSERT_TRUE(cluster.router().registry().Register(ghost, {}, absl::Now()).ok());
  for (int i = 0; i < 2; ++i) {  // one of the two meets the ghost first (round robin)
    const Generated out = Generate(cluster.stub(), GoldenRequest(cases_[0]));
    ExpectGolden(out, cases_[0], cases_[0].completion_text, cluster.router().limits().num_layers);
  }
  EXPECT_EQ(cluster.router().registry().Live(estuary::v1::WORKER_ROLE_DECODE, absl::Now()).size(),
            1u);
}

TEST_F(RouterServiceTest, ModelInfoAndModels) {
  Cluster cluster{RouterOptions()};
  grpc::ClientContext context;
  estuary::v1::ModelInfo info;
  ASSERT_TRUE(cluster.stub().GetModelInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.name(), "stories260K");
  EXPECT_EQ(info.context_length(), cluster.router().limits().context_length);
  EXPECT_EQ(info.vocab_size(), cluster.router().limits().vocab_size);
  EXPECT_EQ(info.num_layers(), cluster.router().limits().num_layers);
  EXPECT_EQ(info.prefill_tp_size(), 1);
  EXPECT_EQ(info.decode_tp_size(), 1);
  grpc::ClientContext list_context;
  estuary::v1::ListModelsResponse models;
  ASSERT_TRUE(cluster.stub().ListModels(&list_context, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0), "stories260K");
}

TEST(RegistrationClientTest, RegistersAgainWhenTheRouterForgetsTheWorker) {
  RouterOptions options;
  options.model = GoldenModelDir("stories260K");
  auto router = RouterService::Create(options);
  ASSERT_TRUE(router.ok()) << router.status();
  auto server = rpc::StartGrpcServer("127.0.0.1", 0, (*router)->services());
  ASSERT_TRUE(server.ok());
  estuary::v1::WorkerInfo info;
  info.set_worker_id("decode@somewhere");
  info.set_role(estuary::v1::WORKER_ROLE_DECODE);
  info.set_address("127.0.0.1:9");
  info.set_model_id("stories260K");
  info.set_block_size(16);
  RegistrationClient client;
  client.Start(server->address, info, [] {
    estuary::v1::WorkerLoad load;
    load.set_running_sequences(3);
    return load;
  });
  auto wait_for = [&](auto predicate) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!predicate() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
    return predicate();
  };
  ASSERT_TRUE(wait_for([&] { return client.registrations() == 1; }));
  auto live = (*router)->registry().Live(estuary::v1::WORKER_ROLE_DECODE, absl::Now());
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].load.running_sequences(), 3);
  (*router)->registry().MarkDead("decode@somewhere");
  EXPECT_TRUE(wait_for([&] { return client.registrations() == 2; }));
  EXPECT_EQ((*router)->registry().Live(estuary::v1::WORKER_ROLE_DECODE, absl::Now()).size(), 1u);
  client.Stop();
  server->server->Shutdown();
}

}  // namespace
}  // namespace estuary::router
