#include "cli/generate_command.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/progress_bar.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/generator.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "core/model/tensor_parallel.h"
#include "decode/decode_engine.h"
#include "nlohmann/json.hpp"

namespace estuary::cli {

absl::Status ValidateGenerateOptions(const GenerateOptions& options) {
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens = ", options.max_tokens, " must be >= 0"));
  }
  if (options.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  if (options.tensor_parallel_size < 1 || options.tensor_parallel_size > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size = ", options.tensor_parallel_size, " must be in [1, 64]"));
  }
  if (!options.device.is_cpu() && options.tensor_parallel_size > 1) {
    return absl::InvalidArgumentError(
        "--device cuda runs one GPU: tensor parallelism on GPUs is not wired yet");
  }
  if (options.lossless && !options.device.is_cpu()) {
    return absl::InvalidArgumentError(
        "--exit-mode lossless runs on CPU ranks only: the GPU step has no verification pass yet");
  }
  if (options.dtype && *options.dtype != DType::kF32 && *options.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("--dtype must be f32 or bf16");
  }
  return options.sampling.Validate();
}

namespace {

// The threads each rank's kernels run on: --threads (or every core) shared among the ranks.
// Every path of `generate` (plain, through the engine, tensor-parallel, lossless) decodes on as
// many, so that their speeds compare.
int ThreadsPerRank(const GenerateOptions& options) {
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, threads / options.tensor_parallel_size);
}

struct RiverGeneration {
  GenerateResult result;
  std::vector<int> backbone_layers;  // per generated token
  ExitStats stats;
};

// Decodes `request` through the DecodeEngine, with the exit river when `with_river`, on the CPU or
// on CUDA device `cuda_device` (>= 0). Drops backbone layers at and above
// --resident-backbone-layers first, and says how much memory that saves.
absl::StatusOr<RiverGeneration> GenerateThroughEngine(LlamaModel& model,
                                                      const GenerateRequest& request,
                                                      bool with_river,
                                                      const RiverOptions& river_options,
                                                      int cuda_device, int threads,
                                                      const std::function<void(int32_t)>& on_token) {
  ESTUARY_RETURN_IF_ERROR(river_options.policy.Validate(model.config().n_layers));
  std::unique_ptr<River> river;
  if (with_river) {
    ESTUARY_ASSIGN_OR_RETURN(river, River::Build(model.weights(), river_options.quant,
                                                 /*first_layer=*/0, /*row_parallel_blocks=*/1,
                                                 river_options.lm_head));
  }
  if (const int resident = river_options.policy.resident_backbone_layers;
      river != nullptr && resident > 0) {
    ESTUARY_ASSIGN_OR_RETURN(const int64_t saved, model.ReleaseBackboneLayersFrom(resident));
    ESTUARY_LOG(INFO) << "resident backbone layers: " << resident << " of "
                      << model.config().n_layers << "; " << saved
                      << " bytes of backbone weights not kept (river adds " << river->bytes()
                      << ")";
  }
  DecodeEngineOptions engine_options;
  engine_options.max_num_seqs = 1;
  engine_options.exit = river_options.policy;
  engine_options.cuda_device = cuda_device;
  RiverGeneration out{GenerateResult(), {}, ExitStats(model.config().n_layers)};
  const absl::Time start = absl::Now();
  absl::Time first_token = start;
  TokenSink sink = [&](const TokenEvent& e) {
    if (e.token_id >= 0) {
      if (out.result.completion_ids.empty()) first_token = absl::Now();
      out.result.completion_ids.push_back(e.token_id);
      out.backbone_layers.push_back(e.backbone_layers);
      on_token(e.token_id);
    }
    if (e.finished) out.result.finish_reason = e.finish_reason;
  };
  // The engine's kernels run on `threads` threads (a GPU step ignores them).
  const std::unique_ptr<ShardedModel> sharded = ShardedModel::Borrow(model, river.get(), threads);
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<DecodeEngine> engine,
                           DecodeEngine::Create(*sharded, engine_options, sink));
  DecodeRequest decode;
  decode.request_id = "generate";
  decode.prompt_ids = request.prompt_ids;
  decode.max_tokens = request.max_tokens;
  decode.sampling = request.sampling;
  ESTUARY_RETURN_IF_ERROR(engine->Submit(std::move(decode)));
  ESTUARY_RETURN_IF_ERROR(engine->RunUntilIdle());
  out.stats = engine->exit_stats();
  out.result.prefill_seconds = absl::ToDoubleSeconds(first_token - start);
  out.result.decode_seconds = absl::ToDoubleSeconds(absl::Now() - first_token);
  const size_t decoded = out.result.completion_ids.size();
  out.result.tokens_per_second = decoded > 1 && out.result.decode_seconds > 0
                                     ? (decoded - 1) / out.result.decode_seconds
                                     : 0.0;
  return out;
}

// Generates on `tp_size` tensor-parallel ranks; with the river, each step's exit decision is
// taken on every rank alike and recorded per generated token.
absl::StatusOr<RiverGeneration> GenerateTensorParallel(std::unique_ptr<LlamaModel> model,
                                                       const GenerateOptions& options,
                                                       const GenerateRequest& request,
                                                       const std::function<void(int32_t)>& on_token) {
  const int n_layers = model->config().n_layers;
  ShardedModelOptions sharding;
  sharding.tp_size = options.tensor_parallel_size;
  sharding.threads_per_rank = ThreadsPerRank(options);
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<ShardedModel> sharded,
                           ShardedModel::Create(std::move(model), sharding));
  ShardedForwardOptions forward;
  if (options.river) {
    ESTUARY_RETURN_IF_ERROR(sharded->BuildRiver(options.river_options.quant, /*first_layer=*/0,
                                                options.river_options.lm_head));
    forward.use_river = true;
    forward.policy = options.river_options.policy;
    if (const int resident = forward.policy.resident_backbone_layers; resident > 0) {
      ESTUARY_RETURN_IF_ERROR(sharded->ReleaseBackboneLayersFrom(resident).status());
    }
  }
  RiverGeneration out{GenerateResult(), {}, ExitStats(n_layers)};
  if (options.lossless) {
    ESTUARY_ASSIGN_OR_RETURN(out.result,
                             GenerateLossless(*sharded, request, *options.lossless, on_token));
    return out;
  }
  ESTUARY_ASSIGN_OR_RETURN(out.result, Generate(*sharded, request, on_token, forward));
  // backbone_layers[i] is the step that produced completion token i.
  const std::vector<int>& steps = out.result.backbone_layers;
  for (size_t i = 0; i < out.result.completion_ids.size() && i < steps.size(); ++i) {
    out.backbone_layers.push_back(steps[i]);
    out.stats.RecordDecodeToken(steps[i]);
  }
  return out;
}

}  // namespace

absl::Status RunGenerate(const GenerateOptions& options) {
  ESTUARY_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  kernels::cpu::SetCpuThreads(options.threads);
  LoadOptions load_options;
  load_options.dtype = options.dtype;
  load_options.progress = MakeProgressReporter();
  load_options.copy_mapped_weights = options.device.is_cpu();  // a GPU uploads from the mapping
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(options.model, load_options));
  const Tokenizer& tokenizer = *loaded.tokenizer;
  if (options.river) {
    ESTUARY_RETURN_IF_ERROR(options.river_options.policy.Validate(loaded.model->config().n_layers));
  }
  ESTUARY_RETURN_IF_ERROR(
      CheckTensorParallelSize(loaded.model->config(), options.tensor_parallel_size));

  GenerateRequest request;
  ESTUARY_ASSIGN_OR_RETURN(request.prompt_ids, tokenizer.Encode(options.prompt, /*add_bos=*/true));
  request.max_tokens = options.max_tokens;
  request.sampling = options.sampling;

  // The completion's text, built a complete UTF-8 piece at a time; text mode prints each piece
  // as soon as it exists.
  IncrementalDetokenizer detokenizer(tokenizer, request.prompt_ids.back());
  std::string completion_text;
  if (!options.json) std::cout << options.prompt << std::flush;
  auto on_token = [&](int32_t id) {
    const std::string piece = detokenizer.Push(id);
    completion_text += piece;
    if (!options.json) std::cout << piece << std::flush;
  };
  GenerateResult result;
  std::optional<RiverGeneration> river;
  if (options.tensor_parallel_size > 1 || options.lossless) {
    ESTUARY_ASSIGN_OR_RETURN(RiverGeneration tp, GenerateTensorParallel(std::move(loaded.model),
                                                                        options, request, on_token));
    result = tp.result;
    if (options.river && !options.lossless) river = std::move(tp);
  } else if (options.river || !options.device.is_cpu()) {
    const int cuda_device = options.device.is_cpu() ? -1 : options.device.ordinal;
    ESTUARY_ASSIGN_OR_RETURN(
        RiverGeneration engine,
        GenerateThroughEngine(*loaded.model, request, options.river, options.river_options,
                              cuda_device, ThreadsPerRank(options), on_token));
    result = engine.result;
    if (options.river) river = std::move(engine);
  } else {
    const std::unique_ptr<ShardedModel> sharded =
        ShardedModel::Borrow(*loaded.model, /*river=*/nullptr, ThreadsPerRank(options));
    ESTUARY_ASSIGN_OR_RETURN(result, Generate(*sharded, request, on_token));
  }
  const std::string tail = detokenizer.Flush();
  completion_text += tail;

  if (!options.json) {
    std::cout << tail << std::endl;
    ESTUARY_LOG(INFO) << result.completion_ids.size() << " tokens, "
                      << result.tokens_per_second << " tokens/s, finish: "
                      << FinishReasonName(result.finish_reason);
    if (river) ESTUARY_LOG(INFO) << "exit river: " << river->stats.ToString();
    if (options.lossless) {
      ESTUARY_LOG(INFO) << "lossless: " << result.accepted_tokens << " of " << result.draft_tokens
                        << " drafts accepted over " << result.verifications << " verifications, "
                        << result.plain_rounds << " plain rounds";
    }
    return absl::OkStatus();
  }
  nlohmann::json out = {
      {"model", options.model},
      {"prompt", options.prompt},
      {"prompt_ids", request.prompt_ids},
      {"completion_ids", result.completion_ids},
      {"completion_text", completion_text},
      {"finish_reason", FinishReasonName(result.finish_reason)},
      {"tokens_per_second", result.tokens_per_second},
      {"prefill_seconds", result.prefill_seconds},
      {"decode_seconds", result.decode_seconds},
      {"threads", ThreadsPerRank(options) * options.tensor_parallel_size},
  };
  if (options.lossless) {
    out["exit_mode"] = "lossless";
    out["draft_tokens"] = result.draft_tokens;
    out["accepted_tokens"] = result.accepted_tokens;
    out["verifications"] = result.verifications;
    out["plain_rounds"] = result.plain_rounds;
    out["acceptance_rate"] = result.draft_tokens > 0 ? static_cast<double>(result.accepted_tokens) /
                                                           result.draft_tokens
                                                     : 0.0;
  }
  if (river) {
    out["backbone_layers"] = river->backbone_layers;
    out["mean_backbone_layers"] = river->stats.mean_backbone_layers();
    out["exit_rate"] = river->stats.exit_rate();
    out["exit_histogram"] = river->stats.histogram();
  }
  std::cout << out.dump() << std::endl;
  return absl::OkStatus();
}

}  // namespace estuary::cli
