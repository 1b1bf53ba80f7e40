// The push protocol under injected faults, with both workers' real gRPC services in this
// process and the prefill worker's transport wrapped in the fault-injecting one
// (kvtransfer/fault_transport.h) over the in-process transport.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/model/model_loader.h"
#include "decode/decode_service.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_transport.h"
#include "kvtransfer/inprocess_transport.h"
#include "prefill/prefill_service.h"
#include "rpc/grpc_server.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;

std::unique_ptr<ShardedModel> Load() {
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir("stories260K"));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  auto model = ShardedModel::Create(std::move(loaded->model), ShardedModelOptions());
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

// A decode worker and a prefill worker in this process, the prefill one pushing through faults.
class FaultyCluster {
 public:
  FaultyCluster(const kvtransfer::FaultConfig& faults, absl::Duration lease) {
    decode_model_ = Load();
    prefill_model_ = Load();
    decode_transport_ = kvtransfer::InProcessTransport::Create();
    prefill_transport_ = std::make_unique<kvtransfer::FaultTransport>(
        kvtransfer::InProcessTransport::Create(), faults);
    DecodeServiceOptions decode_options;
    decode_options.model_id = "stories260K";
    decode_options.engine.kv_cache_bytes = int64_t{8} << 20;
    decode_options.default_lease = lease;
    auto decode = DecodeService::Create(*decode_model_, *decode_transport_, decode_options);
    EXPECT_TRUE(decode.ok()) << decode.status();
    decode_ = std::move(*decode);
    PrefillServiceOptions prefill_options;
    prefill_options.model_id = "stories260K";
    prefill_options.engine.kv_cache_bytes = int64_t{8} << 20;
    auto prefill = PrefillService::Create(*prefill_model_, *prefill_transport_, prefill_options);
    EXPECT_TRUE(prefill.ok()) << prefill.status();
    prefill_ = std::move(*prefill);
    auto server = rpc::StartGrpcServer("127.0.0.1", 0, {decode_.get(), prefill_.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials());
    decode_stub_ = estuary::v1::DecodeWorker::NewStub(channel);
    prefill_stub_ = estuary::v1::PrefillWorker::NewStub(channel);
  }
  ~FaultyCluster() { server_.server->Shutdown(); }

  estuary::v1::TransferDescriptor Reserve(const estuary::v1::WorkerRequest& request) {
    estuary::v1::ReserveRequest reserve;
    *reserve.mutable_request() = request;
    estuary::v1::ReserveResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(decode_stub_->Reserve(&context, reserve, &response).ok());
    return response.transfer();
  }
  grpc::Status Prefill(const estuary::v1::WorkerRequest& request,
                       const estuary::v1::TransferDescriptor& transfer) {
    estuary::v1::PrefillRequest prefill;
    *prefill.mutable_request() = request;
    *prefill.mutable_transfer() = transfer;
    estuary::v1::PrefillResponse response;
    grpc::ClientContext context;
    return prefill_stub_->Prefill(&context, prefill, &response);
  }
  // The decode stream's tokens and final status code.
  std::pair<std::vector<int32_t>, int> Decode(const std::string& id) {
    estuary::v1::DecodeRequest request;
    request.set_request_id(id);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = decode_stub_->Decode(&context, request);
    estuary::v1::DecodeResponse response;
    std::vector<int32_t> tokens;
    int code = -1;
    while (reader->Read(&response)) {
      tokens.insert(tokens.end(), response.token_ids().begin(), response.token_ids().end());
      if (response.finished()) code = response.status_code();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return {tokens, code};
  }
  int DecodeFreePages() {
    const KvPoolStats stats = decode_->engine().pool().Stats();
    return stats.free_pages + stats.cached_pages;
  }

 private:
  std::unique_ptr<ShardedModel> decode_model_, prefill_model_;
  std::unique_ptr<kvtransfer::Transport> decode_transport_;
  std::unique_ptr<kvtransfer::FaultTransport> prefill_transport_;
  std::unique_ptr<DecodeService> decode_;
  std::unique_ptr<PrefillService> prefill_;
  rpc::RunningServer server_;
  std::unique_ptr<estuary::v1::DecodeWorker::Stub> decode_stub_;
  std::unique_ptr<estuary::v1::PrefillWorker::Stub> prefill_stub_;
};

estuary::v1::WorkerRequest Greedy(const std::string& id, const std::vector<int32_t>& prompt,
                                  absl::Duration timeout = absl::Seconds(30)) {
  estuary::v1::WorkerRequest request;
  request.set_request_id(id);
  for (int32_t t : prompt) request.add_prompt_ids(t);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(::estuary::testing::kGoldenMaxNewTokens);
  request.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + timeout));
  return request;
}

// Every completion dropped: the KV lands but the decode worker never hears of it; the lease
// (300 ms) lapses on time, the request ends DEADLINE_EXCEEDED and the pages return.
TEST(PushFaultTest, ADroppedCompletionLapsesAtTheLeaseAndFreesThePages) {
  kvtransfer::FaultConfig faults;
  faults.drop_all_messages = true;
  FaultyCluster cluster(faults, absl::Milliseconds(300));
  const GoldenCase c = ::estuary::testing::LoadGoldenCases("stories260K")[0];
  const int free_at_start = cluster.DecodeFreePages();
  const absl::Time start = absl::Now();
  const estuary::v1::WorkerRequest request = Greedy("dropped", c.prompt_ids);
  const estuary::v1::TransferDescriptor transfer = cluster.Reserve(request);
  EXPECT_TRUE(cluster.Prefill(request, transfer).ok());  // prefill cannot know
  const auto [tokens, code] = cluster.Decode("dropped");
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Milliseconds(1500));
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);
}

// Every put delayed 20 ms: a request whose deadline is 50 ms away fails DEADLINE_EXCEEDED (and
// its reservation is aborted at once), while a request with time to spare completes with the
// golden ids.
TEST(PushFaultTest, ADelayPastTheDeadlineFailsOnlyThatRequest) {
  kvtransfer::FaultConfig faults;
  faults.put_delay = absl::Milliseconds(20);
  FaultyCluster cluster(faults, absl::Seconds(30));
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases("stories260K");
  const int free_at_start = cluster.DecodeFreePages();

  const estuary::v1::WorkerRequest hurried =
      Greedy("hurried", cases[1].prompt_ids, absl::Milliseconds(50));
  const grpc::Status failed = cluster.Prefill(hurried, cluster.Reserve(hurried));
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << failed.error_message();
  const auto [none, aborted] = cluster.Decode("hurried");
  EXPECT_TRUE(none.empty());
  EXPECT_NE(aborted, 0);

  const estuary::v1::WorkerRequest patient = Greedy("patient", cases[0].prompt_ids);
  ASSERT_TRUE(cluster.Prefill(patient, cluster.Reserve(patient)).ok());
  const auto [tokens, code] = cluster.Decode("patient");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(tokens, cases[0].completion_ids);
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);
}

}  // namespace
}  // namespace estuary
