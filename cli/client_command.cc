#include "cli/client_command.h"

#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "rpc/status_convert.h"
#include "rpc/worker_request.h"

namespace estuary::cli {

absl::Status RunClient(const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("client needs --server HOST:PORT");
  if (options.timeout_seconds <= 0) return absl::InvalidArgumentError("--timeout must be > 0");
  auto stub = estuary::v1::Inference::NewStub(
      grpc::CreateChannel(options.server, grpc::InsecureChannelCredentials()));
  estuary::v1::GenerateRequest request;
  request.set_text(options.prompt);
  rpc::SamplingToProto(options.sampling, options.max_tokens, request.mutable_sampling());
  request.mutable_exit()->set_threshold(options.exit_threshold);
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(options.timeout_seconds)));
  auto reader = stub->Generate(&context, request);
  if (!options.json && options.stream) std::cout << options.prompt << std::flush;
  estuary::v1::GenerateResponse response;
  std::vector<int32_t> ids;
  std::string text;
  estuary::v1::Complete complete;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      ids.insert(ids.end(), response.chunk().token_ids().begin(), response.chunk().token_ids().end());
      text += response.chunk().text();
      if (!options.json && options.stream) std::cout << response.chunk().text() << std::flush;
    } else if (response.has_complete()) {
      complete = response.complete();
    }
  }
  if (absl::Status status = rpc::FromGrpcStatus(reader->Finish()); !status.ok()) return status;
  if (!options.json) {
    if (!options.stream) std::cout << options.prompt << text;
    std::cout << std::endl;
    return absl::OkStatus();
  }
  const estuary::v1::Usage& usage = complete.usage();
  const estuary::v1::Timings& timings = complete.timings();
  const nlohmann::json out = {
      {"completion_ids", ids},
      {"completion_text", text},
      {"finish_reason", estuary::v1::FinishReason_Name(complete.finish_reason())},
      {"prompt_tokens", usage.prompt_tokens()},
      {"completion_tokens", usage.completion_tokens()},
      {"mean_backbone_layers", usage.mean_backbone_layers()},
      {"time_to_first_token_seconds", timings.time_to_first_token_seconds()},
      {"prefill_seconds", timings.prefill_seconds()},
      {"transfer_seconds", timings.transfer_seconds()},
      {"decode_seconds", timings.decode_seconds()},
  };
  std::cout << out.dump() << std::endl;
  return absl::OkStatus();
}

}  // namespace estuary::cli
