// bench-serve over the router's gRPC Inference API (cli/bench_client.h).
#include "absl/time/clock.h"
#include "cli/bench_client.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rpc/api_key.h"
#include "rpc/client_tls.h"
#include "rpc/status_convert.h"

namespace estuary::cli {
namespace {

class GrpcBenchClient final : public BenchClient {
 public:
  GrpcBenchClient(std::shared_ptr<grpc::Channel> channel, std::string api_key)
      : stub_(estuary::v1::Inference::NewStub(std::move(channel))), api_key_(std::move(api_key)) {}

  absl::StatusOr<ServedModelInfo> Describe() override {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    rpc::AttachApiKey(context, api_key_);
    estuary::v1::ModelInfo info;
    const absl::Status status = rpc::FromGrpcStatus(stub_->GetModelInfo(&context, {}, &info));
    if (!status.ok()) return status;
    return ServedModelInfo{info.name(), info.context_length(), info.vocab_size()};
  }

  RequestTiming Run(const std::vector<int32_t>& prompt, int output_len) override {
    estuary::v1::GenerateRequest request;
    for (int32_t t : prompt) request.mutable_tokens()->add_ids(t);
    request.mutable_sampling()->set_temperature(0.0f);
    request.mutable_sampling()->set_max_tokens(output_len);
    request.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
    rpc::AttachApiKey(context, api_key_);
    RequestTiming timing;
    timing.prompt_tokens = static_cast<int>(prompt.size());
    const absl::Time start = absl::Now();
    absl::Time last = start;
    auto reader = stub_->Generate(&context, request);
    estuary::v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_complete()) {
        timing.prompt_tokens = response.complete().usage().prompt_tokens();
      }
      if (!response.has_chunk() || response.chunk().token_ids().empty()) continue;
      const absl::Time now = absl::Now();
      if (timing.output_tokens == 0) {
        timing.ttft = absl::ToDoubleSeconds(now - start);
      } else {
        timing.itl.push_back(absl::ToDoubleSeconds(now - last));
      }
      timing.output_tokens += response.chunk().token_ids_size();
      last = now;
    }
    const grpc::Status status = reader->Finish();
    timing.e2e = absl::ToDoubleSeconds(absl::Now() - start);
    timing.ok = status.ok();
    if (!status.ok()) timing.error = status.error_message();
    return timing;
  }

 private:
  std::unique_ptr<estuary::v1::Inference::Stub> stub_;
  const std::string api_key_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchClient>> MakeGrpcBenchClient(const std::string& server,
                                                                 const std::string& api_key,
                                                                 const std::string& ca_file) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::CreateRouterChannel(server, ca_file);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<BenchClient>(
      std::make_unique<GrpcBenchClient>(*std::move(channel), api_key));
}

}  // namespace estuary::cli
