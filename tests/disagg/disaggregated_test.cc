// Disaggregated serving across real processes on loopback: an estuary-prefill process runs the
// golden prompts and pushes their KV over UCX into the pages an estuary-decode process reserved;
// the decode process continues greedily. Every (prefill TP, decode TP) pair in {1, 2} x {1, 2}
// must reproduce the golden ids of both shipped models. Also: dead peers and lapsed leases.

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "core/common/child_process.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/subprocess.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;
using ::estuary::testing::BinaryPath;
using ::estuary::testing::GoldenCase;

// A worker process and a stub to it.
template <typename Service>
struct Worker {
  std::unique_ptr<ChildProcess> process;
  std::string address;
  std::unique_ptr<typename Service::Stub> stub;
};

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / absl::StrCat("estuary-disagg-", ::getpid(), "-", name))
      .string();
}

template <typename Service>
Worker<Service> StartWorker(const std::string& binary, const std::string& name,
                            std::vector<std::string> flags) {
  Worker<Service> worker;
  flags.insert(flags.begin(), {"--ucx-tls", "tcp"});
  auto started = StartServing(BinaryPath(binary), flags, TempPath(name), absl::Seconds(60));
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return worker;
  worker.process = std::move(started->process);
  worker.address = started->address;
  worker.stub = Service::NewStub(
      grpc::CreateChannel(worker.address, grpc::InsecureChannelCredentials()));
  return worker;
}

using PrefillWorker = Worker<estuary::v1::PrefillWorker>;
using DecodeWorker = Worker<estuary::v1::DecodeWorker>;

PrefillWorker StartPrefill(const std::string& model, int tp, const std::string& name) {
  return StartWorker<estuary::v1::PrefillWorker>(
      "prefill/estuary-prefill", name,
      {"--model", ::estuary::testing::GoldenModelDir(model), "--tensor-parallel-size",
       std::to_string(tp), "--max-num-batched-tokens", "32", "--kv-cache-bytes", "16777216"});
}

DecodeWorker StartDecode(const std::string& model, int tp, const std::string& name,
                         std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--model", ::estuary::testing::GoldenModelDir(model),
                                    "--tensor-parallel-size", std::to_string(tp),
                                    "--kv-cache-bytes", "33554432"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return StartWorker<estuary::v1::DecodeWorker>("decode/estuary-decode", name, flags);
}

estuary::v1::WorkerRequest Greedy(const std::string& id, const std::vector<int32_t>& prompt) {
  estuary::v1::WorkerRequest request;
  request.set_request_id(id);
  for (int32_t t : prompt) request.add_prompt_ids(t);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(::estuary::testing::kGoldenMaxNewTokens);
  return request;
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(60)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

// Reserve on decode, Prefill (push) on prefill, then the decode stream. Returns the tokens, or
// the first failing status.
absl::StatusOr<std::vector<int32_t>> Disaggregated(PrefillWorker& prefill, DecodeWorker& decode,
                                                   const estuary::v1::WorkerRequest& request) {
  estuary::v1::ReserveRequest reserve;
  *reserve.mutable_request() = request;
  estuary::v1::ReserveResponse reserved;
  grpc::Status status = decode.stub->Reserve(Context().get(), reserve, &reserved);
  if (!status.ok()) return absl::InternalError("Reserve: " + status.error_message());
  estuary::v1::PrefillRequest prefill_request;
  *prefill_request.mutable_request() = request;
  *prefill_request.mutable_transfer() = reserved.transfer();
  estuary::v1::PrefillResponse prefilled;
  status = prefill.stub->Prefill(Context().get(), prefill_request, &prefilled);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        "Prefill: " + status.error_message());
  }
  estuary::v1::DecodeRequest decode_request;
  decode_request.set_request_id(request.request_id());
  auto context = Context();
  auto reader = decode.stub->Decode(context.get(), decode_request);
  std::vector<int32_t> tokens;
  estuary::v1::DecodeResponse response;
  int status_code = -1;
  std::string status_message;
  while (reader->Read(&response)) {
    tokens.insert(tokens.end(), response.token_ids().begin(), response.token_ids().end());
    if (response.finished()) {
      status_code = response.status_code();
      status_message = response.status_message();
    }
  }
  status = reader->Finish();
  if (!status.ok()) return absl::InternalError("Decode: " + status.error_message());
  if (status_code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(status_code), "Decode: " + status_message);
  }
  if (!tokens.empty() && tokens.front() != prefilled.first_token()) {
    return absl::InternalError("the first streamed token is not the one prefill sampled");
  }
  return tokens;
}

int FreePages(DecodeWorker& worker) {
  estuary::v1::WorkerLoad load;
  grpc::Status status = worker.stub->GetLoad(Context().get(), {}, &load);
  return status.ok() ? load.free_pages() : -1;
}
int FreePages(PrefillWorker& worker) {
  estuary::v1::WorkerLoad load;
  grpc::Status status = worker.stub->GetLoad(Context().get(), {}, &load);
  return status.ok() ? load.free_pages() : -1;
}

// (model, prefill TP, decode TP)
class DisaggregatedGoldenTest
    : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(DisaggregatedGoldenTest, PushedKvDecodesToTheGoldenIds) {
  const auto& [model, prefill_tp, decode_tp] = GetParam();
  const std::string tag = absl::StrCat(model, "-p", prefill_tp, "-d", decode_tp);
  PrefillWorker prefill = StartPrefill(model, prefill_tp, tag + "-prefill");
  DecodeWorker decode = StartDecode(model, decode_tp, tag + "-decode");
  ASSERT_NE(prefill.stub, nullptr);
  ASSERT_NE(decode.stub, nullptr);
  for (const GoldenCase& c : ::estuary::testing::LoadGoldenCases(model)) {
    auto tokens = Disaggregated(prefill, decode, Greedy(absl::StrCat("case", c.index), c.prompt_ids));
    ASSERT_TRUE(tokens.ok()) << tokens.status() << "\nprefill log:\n"
                             << prefill.process->Log() << "\ndecode log:\n"
                             << decode.process->Log();
    EXPECT_EQ(*tokens, c.completion_ids) << tag << " case " << c.index;
  }
}

std::string PairName(const ::testing::TestParamInfo<std::tuple<std::string, int, int>>& info) {
  return absl::StrCat(std::get<0>(info.param), "_prefill_tp", std::get<1>(info.param),
                      "_decode_tp", std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllPairs, DisaggregatedGoldenTest,
                         ::testing::Combine(::testing::Values("stories260K", "stories12L"),
                                            ::testing::Values(1, 2), ::testing::Values(1, 2)),
                         PairName);

// Mismatched KV formats (different block sizes) are refused before any byte moves, naming both.
TEST(DisaggregatedTest, MismatchedFingerprintsAreRefusedNamingBoth) {
  PrefillWorker prefill = StartPrefill("stories260K", 1, "fp-prefill");
  DecodeWorker decode = StartDecode("stories260K", 1, "fp-decode", {"--block-size", "32"});
  ASSERT_NE(prefill.stub, nullptr);
  ASSERT_NE(decode.stub, nullptr);
  auto result = Disaggregated(prefill, decode, Greedy("fp", {1, 403, 407}));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("block=16"), std::string::npos) << result.status();
  EXPECT_NE(result.status().message().find("block=32"), std::string::npos) << result.status();
}

// The decode process dies (SIGKILL) holding a reservation: the prefill worker answers that
// request UNAVAILABLE within 2 s, keeps serving a new decode worker, and its pool is whole again.
// The decode side of a dead prefill: the lease lapses and the pages return.
TEST(DisaggregatedTest, DeadPeersEndOnlyTheirRequests) {
  PrefillWorker prefill = StartPrefill("stories12L", 1, "kill-prefill");
  DecodeWorker doomed = StartDecode("stories12L", 1, "kill-decode");
  ASSERT_NE(prefill.stub, nullptr);
  ASSERT_NE(doomed.stub, nullptr);
  const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases("stories12L");
  const int prefill_free = FreePages(prefill);

  estuary::v1::ReserveRequest reserve;
  *reserve.mutable_request() = Greedy("doomed", cases[0].prompt_ids);
  estuary::v1::ReserveResponse reserved;
  ASSERT_TRUE(doomed.stub->Reserve(Context().get(), reserve, &reserved).ok());
  doomed.process->Signal(SIGKILL);
  ASSERT_TRUE(doomed.process->Wait(absl::Seconds(5)).ok());
  estuary::v1::PrefillRequest prefill_request;
  *prefill_request.mutable_request() = reserve.request();
  *prefill_request.mutable_transfer() = reserved.transfer();
  estuary::v1::PrefillResponse prefilled;
  const absl::Time start = absl::Now();
  const grpc::Status failed =
      prefill.stub->Prefill(Context().get(), prefill_request, &prefilled);
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE) << failed.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  DecodeWorker decode = StartDecode("stories12L", 1, "kill-decode2", {"--lease-ms", "500"});
  ASSERT_NE(decode.stub, nullptr);
  auto tokens = Disaggregated(prefill, decode, Greedy("survivor", cases[1].prompt_ids));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, cases[1].completion_ids);
  EXPECT_EQ(FreePages(prefill), prefill_free);

  // A reservation whose KV never comes (no prefill is asked): the lease lapses after 500 ms.
  const int decode_free = FreePages(decode);
  *reserve.mutable_request() = Greedy("lapsing", cases[2].prompt_ids);
  ASSERT_TRUE(decode.stub->Reserve(Context().get(), reserve, &reserved).ok());
  EXPECT_LT(FreePages(decode), decode_free);
  estuary::v1::DecodeRequest decode_request;
  decode_request.set_request_id("lapsing");
  auto context = Context();
  auto reader = decode.stub->Decode(context.get(), decode_request);
  estuary::v1::DecodeResponse response;
  int code = -1;
  while (reader->Read(&response)) {
    if (response.finished()) code = response.status_code();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(FreePages(decode), decode_free);
}

}  // namespace
}  // namespace estuary
