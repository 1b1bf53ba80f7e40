#include "cli/client_command.h"

#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "rpc/status_convert.h"
#include "rpc/worker_request.h"
#include "rpc/api_key.h"
#include "rpc/client_tls.h"

namespace estuary::cli {
namespace {

// One line on what the request cost: tokens, time to first token, decode speed, and the exit
// river's figures (mean backbone layers, share of tokens that left the backbone early).
std::string Summary(const estuary::v1::Usage& usage, const estuary::v1::Timings& timings) {
  const int tokens = usage.completion_tokens();
  const double decode = timings.decode_seconds();
  std::string line = absl::StrFormat(
      "[%d prompt + %d new tokens; time to first token %.1f ms (prefill %.1f ms, KV transfer "
      "%.1f ms); decode %.1f tokens/s",
      usage.prompt_tokens(), tokens, 1e3 * timings.time_to_first_token_seconds(),
      1e3 * timings.prefill_seconds(), 1e3 * timings.transfer_seconds(),
      decode > 0 && tokens > 1 ? (tokens - 1) / decode : 0.0);
  const int num_layers = usage.exit_layer_histogram_size() - 1;
  if (num_layers > 0 && tokens > 0) {
    int64_t early = 0;
    for (int layers = 0; layers < num_layers; ++layers) early += usage.exit_layer_histogram(layers);
    absl::StrAppendFormat(&line, "; river: %.2f of %d backbone layers per token on average, "
                                 "%.0f%% of tokens exited early",
                          usage.mean_backbone_layers(), num_layers, 100.0 * early / tokens);
  }
  return line + "]";
}

}  // namespace

absl::Status RunClient(const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("client needs --server HOST:PORT");
  if (options.timeout_seconds <= 0) return absl::InvalidArgumentError("--timeout must be > 0");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      rpc::CreateRouterChannel(options.server, options.ssl_ca_certs);
  if (!channel.ok()) return channel.status();
  auto stub = estuary::v1::Inference::NewStub(*std::move(channel));
  estuary::v1::GenerateRequest request;
  request.set_text(options.prompt);
  rpc::SamplingToProto(options.sampling, options.max_tokens, request.mutable_sampling());
  request.mutable_exit()->set_threshold(options.exit_threshold);
  grpc::ClientContext context;
  rpc::AttachApiKey(context, options.api_key);
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
  const estuary::v1::Usage& usage = complete.usage();
  const estuary::v1::Timings& timings = complete.timings();
  if (!options.json) {
    if (!options.stream) std::cout << options.prompt << text;
    std::cout << "\n\n" << Summary(usage, timings) << std::endl;
    return absl::OkStatus();
  }
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
