// libFuzzer target for the request protos, decoded and checked as the processes that receive
// them do, against the shipped stories260K model (its config, tokenizer and generation
// defaults, read once). The first byte picks the message; the rest is its serialized bytes:
//   0: a public GenerateRequest through the router's validation (router/request_validation.h,
//      PrepareRequest). What it accepts must keep PreparedRequest's promises (prompt inside the
//      vocabulary and the context with room for max_tokens >= 1, at most 16 stop strings of 1 to
//      256 bytes) and must pass the workers' checks as the router forwards it;
//   1: a ReserveRequest, 2: a DecodeRequest (local prefill), 3: a PrefillRequest: the
//      WorkerRequest converted as the workers convert it (rpc/worker_request.h) and checked as
//      their engines check it (core/model/request_checks.h); a PrefillRequest's descriptor is
//      checked as KvPusher::Create checks it (kvtransfer/descriptor_check.h).
// Seeds: fuzz/corpus/request_proto/ (fuzz/make_seeds.py). Run (see fuzz/CMakeLists.txt):
//   ./build-fuzz/fuzz/request_proto_fuzzer -max_total_time=60 fuzz/corpus/request_proto

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/loader/model_metadata.h"
#include "core/model/request_checks.h"
#include "estuary/v1/inference.pb.h"
#include "estuary/v1/worker.pb.h"
#include "kvtransfer/descriptor_check.h"
#include "kvtransfer/fingerprint.h"
#include "router/generation_defaults.h"
#include "router/request_validation.h"
#include "rpc/worker_request.h"

namespace {

struct Model {
  estuary::ModelMetadata metadata;
  estuary::router::ModelLimits limits;
  estuary::v1::KvFormatFingerprint fingerprint;
};

const Model* model = nullptr;

// The worker side: a WorkerRequest as the decode and prefill services convert it, through the
// checks both engines run first.
absl::Status WorkerChecks(const estuary::v1::WorkerRequest& in) {
  (void)estuary::rpc::DeadlineFromUnixMs(in.deadline_unix_ms());
  const std::vector<int32_t> prompt(in.prompt_ids().begin(), in.prompt_ids().end());
  return estuary::ValidateEngineRequest(model->metadata.config, prompt,
                                        estuary::rpc::SamplingFromProto(in.sampling()),
                                        estuary::rpc::ExitThresholdFromProto(in.exit()));
}

void FuzzGenerate(const uint8_t* data, size_t size) {
  estuary::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  auto prepared =
      estuary::router::PrepareRequest(request, *model->metadata.tokenizer, model->limits);
  if (!prepared.ok()) return;
  const int64_t context = model->limits.context_length;
  if (prepared->prompt_ids.empty() || prepared->max_tokens < 1 ||
      static_cast<int64_t>(prepared->prompt_ids.size()) + prepared->max_tokens > context ||
      prepared->sampling.max_tokens() != prepared->max_tokens ||
      prepared->stop.size() > static_cast<size_t>(estuary::router::kMaxStopStrings)) {
    __builtin_trap();
  }
  for (const int32_t id : prepared->prompt_ids) {
    if (id < 0 || id >= model->limits.vocab_size) __builtin_trap();
  }
  for (const std::string& stop : prepared->stop) {
    if (stop.empty() || stop.size() > static_cast<size_t>(estuary::router::kMaxStopStringBytes)) {
      __builtin_trap();
    }
  }
  // What the router accepts, a worker must accept: the router forwards it as this WorkerRequest.
  estuary::v1::WorkerRequest forwarded;
  forwarded.set_request_id("fuzz");
  forwarded.mutable_prompt_ids()->Add(prepared->prompt_ids.begin(), prepared->prompt_ids.end());
  *forwarded.mutable_sampling() = prepared->sampling;
  *forwarded.mutable_exit() = prepared->exit;
  if (!WorkerChecks(forwarded).ok()) __builtin_trap();
}

template <typename Message>
bool Parse(Message& message, const uint8_t* data, size_t size) {
  return message.ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  auto metadata = estuary::LoadModelMetadata(ESTUARY_SOURCE_DIR "/models/stories260K");
  auto defaults = estuary::router::LoadGenerationDefaults(ESTUARY_SOURCE_DIR "/models/stories260K");
  if (!metadata.ok() || !defaults.ok()) __builtin_trap();  // the shipped model must load
  auto* m = new Model;
  m->metadata = std::move(*metadata);
  const estuary::LlamaConfig& c = m->metadata.config;
  m->limits = {c.max_seq_len, c.vocab_size, c.n_layers, std::move(*defaults)};
  m->fingerprint = estuary::kvtransfer::MakeFingerprint("stories260K", c.n_layers, c.n_kv_heads,
                                                        c.head_dim, /*block_size=*/16);
  model = m;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* rest = data + 1;
  const size_t rest_size = size - 1;
  switch (data[0] % 4) {
    case 0:
      FuzzGenerate(rest, rest_size);
      break;
    case 1: {
      estuary::v1::ReserveRequest reserve;
      if (Parse(reserve, rest, rest_size)) (void)WorkerChecks(reserve.request());
      break;
    }
    case 2: {
      estuary::v1::DecodeRequest decode;
      if (Parse(decode, rest, rest_size) && decode.has_local_prefill()) {
        (void)WorkerChecks(decode.local_prefill());
      }
      break;
    }
    case 3: {
      estuary::v1::PrefillRequest prefill;
      if (!Parse(prefill, rest, rest_size)) break;
      (void)estuary::kvtransfer::CheckTransferDescriptor(
          prefill.transfer(), model->fingerprint, "ucx", prefill.request().prompt_ids_size());
      (void)WorkerChecks(prefill.request());
      break;
    }
  }
  return 0;
}
