// The push protocol under injected faults, with both workers' real gRPC services in this
// process and the prefill worker's transport wrapped in the fault-injecting one
// (kvtransfer/fault_transport.h) over the in-process transport.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/clock.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_transport.h"
#include "kvtransfer/kv_control_codec.h"
#include "kvtransfer/inprocess_transport.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/inprocess_workers.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;

// Both workers in-process, the prefill one pushing through faults.
class FaultyCluster {
 public:
  FaultyCluster(const kvtransfer::FaultConfig& faults, absl::Duration lease,
                absl::Duration lease_grace = absl::Seconds(1))
      : workers_(::estuary::testing::InProcessWorkersOptions{
            "stories260K",
            std::make_unique<kvtransfer::FaultTransport>(kvtransfer::InProcessTransport::Create(),
                                                         faults),
            lease, lease_grace}) {
    auto channel = grpc::CreateChannel(workers_.address(), grpc::InsecureChannelCredentials());
    decode_stub_ = estuary::v1::DecodeWorker::NewStub(channel);
    prefill_stub_ = estuary::v1::PrefillWorker::NewStub(channel);
  }

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
  int DecodeFreePages() { return workers_.DecodeFreePages(); }
  // Waits up to `limit` for the decode pool's free pages to reach `want`; the time it took.
  absl::Duration UntilDecodeFreePages(int want, absl::Duration limit) {
    const absl::Time start = absl::Now();
    while (DecodeFreePages() != want && absl::Now() - start < limit) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::Now() - start;
  }

 private:
  ::estuary::testing::InProcessWorkers workers_;
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

// Every completion dropped (the attach goes through): the KV lands but the decode worker never
// hears of it; the lease (800 ms) lapses on time and the request ends DEADLINE_EXCEEDED; the
// pages, which the silent writer might still be writing, return at lease + grace (200 ms).
TEST(PushFaultTest, ADroppedCompletionLapsesAtTheLeaseAndFreesThePagesAfterTheGrace) {
  kvtransfer::FaultConfig faults;
  faults.drop_all_messages = true;
  faults.message_filter = [](std::string_view payload) {
    return kvtransfer::PeekKvControlKind(payload) == kvtransfer::KvControlKind::kCompletion;
  };
  FaultyCluster cluster(faults, absl::Milliseconds(800), absl::Milliseconds(200));
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
  EXPECT_GE(took, absl::Milliseconds(800));
  EXPECT_LT(took, absl::Milliseconds(2000));
  const absl::Duration back = took + cluster.UntilDecodeFreePages(free_at_start, absl::Seconds(3));
  EXPECT_EQ(cluster.DecodeFreePages(), free_at_start);
  EXPECT_GE(back, absl::Milliseconds(1000));  // not before lease + grace
  EXPECT_LT(back, absl::Milliseconds(2500));
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
