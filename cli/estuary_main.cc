// The `estuary` command. Owns flags and wiring only: each subcommand parses its flags into an
// options struct, validates it before anything loads, and calls a library function.
//
//   estuary generate --model PATH --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
//                    [--top-k K] [--min-p M] [--repetition-penalty R] [--seed S]
//                    [--dtype f32|bf16] [--tensor-parallel-size N] [--river] [--json]
//   estuary convert  --from PATH --to DIR [--dtype f32|bf16]
//   estuary synth    --preset tiny|llama-3.2-1b|llama-3.1-8b --out DIR [--seed S]
//   estuary eval-exit --model PATH --taus LIST --prompts FILE --max-tokens N [--json]
//   estuary bench-decode --model PATH --batch LIST [--exit-after K] [--json]
// River flags (eval-exit, bench-decode): --river-group-size, --river-refine, --exit-rule,
// --min-backbone-layers, --max-backbone-layers, --resident-backbone-layers.

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/default_model.h"
#include "cli/exit_commands.h"
#include "cli/flag_spelling.h"
#include "cli/generate_command.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_writer.h"

ABSL_FLAG(std::string, model, "", "model folder (llama2.c or Hugging Face); default: "
                                  "$ESTUARY_MODEL, ../shared/models/stories260K, or a tiny "
                                  "synthesized model");
ABSL_FLAG(std::string, prompt, "Once upon a time", "prompt text");
ABSL_FLAG(int, max_tokens, 256, "new tokens at most");
ABSL_FLAG(double, temperature, 0.8, "sampling temperature; 0 = greedy");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling threshold in (0, 1]");
ABSL_FLAG(int, top_k, 0, "keep the k most likely tokens; 0 = off");
ABSL_FLAG(double, min_p, 0.0, "keep tokens with p >= min_p * p_max; 0 = off");
ABSL_FLAG(double, repetition_penalty, 1.0, "penalty for tokens already seen; 1 = off");
ABSL_FLAG(uint64_t, seed, 0, "random seed (same seed, same output)");
ABSL_FLAG(std::vector<std::string>, stop_token_ids, {}, "comma-separated token ids that end "
                                                        "generation");
ABSL_FLAG(std::string, dtype, "", "weight dtype at load: f32 or bf16 (default: the file's)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(int, threads, 0, "CPU threads for the GEMM library; 0 = its default");
ABSL_FLAG(std::string, from, "", "convert: llama2.c folder or model.bin");
ABSL_FLAG(std::string, to, "", "convert: output Hugging Face folder");
ABSL_FLAG(std::string, preset, "tiny", "synth: tiny, llama-3.2-1b or llama-3.1-8b");
ABSL_FLAG(std::string, out, "", "synth: output folder");
ABSL_FLAG(std::vector<std::string>, taus, {}, "eval-exit: comma-separated exit thresholds");
ABSL_FLAG(std::string, prompts, "", "eval-exit: file with one prompt per line");
ABSL_FLAG(std::vector<std::string>, batch, std::vector<std::string>({"1", "4", "16"}),
          "bench-decode: comma-separated batch sizes");
ABSL_FLAG(int, exit_after, 4, "bench-decode: backbone layers before the river's forced exit");
ABSL_FLAG(int, steps, 8, "bench-decode: timed decode steps per mode and batch");
ABSL_FLAG(bool, river, false, "generate: decode through the paged engine with the exit river");
ABSL_FLAG(int, tensor_parallel_size, 1,
          "generate: tensor-parallel ranks (threads of this process, cores shared among them)");
ABSL_FLAG(int, river_group_size, 64, "int4 group size of the exit river");
ABSL_FLAG(bool, river_refine, true, "refine the river's int4 scale and zero point (HQQ-style)");
ABSL_FLAG(std::string, exit_rule, "batch_min", "batch_min (the paper's) or split");
ABSL_FLAG(double, exit_threshold, 0.9, "default exit threshold τ; above 1 disables exit");
ABSL_FLAG(int, min_backbone_layers, 1, "exit is considered only after this many layers");
ABSL_FLAG(int, max_backbone_layers, -1, "forced exit after this many layers; -1 = none");
ABSL_FLAG(int, resident_backbone_layers, 0,
          "backbone layers at and above this are never loaded (forced exit there); 0 = all");

namespace estuary::cli {
namespace {

constexpr char kUsage[] =
    "estuary <command> [flags]\n"
    "commands:\n"
    "  generate  run one prompt on a model and print the completion\n"
    "  convert   write a Hugging Face folder from a llama2.c model\n"
    "  synth     write a random-weight model with real shapes\n"
    "  eval-exit      fidelity and cost of the exit river at several thresholds\n"
    "  bench-decode   decode tokens/s: full depth, river, full int4\n"
    "Run `estuary <command> --help` for the flags.";

absl::StatusOr<std::optional<DType>> DTypeFlag() {
  const std::string name = absl::GetFlag(FLAGS_dtype);
  if (name.empty()) return std::optional<DType>();
  std::optional<DType> dtype = ParseDType(name);
  if (!dtype || (*dtype != DType::kF32 && *dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype=", name, ": use f32 or bf16"));
  }
  return dtype;
}

template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const char* flag, const std::vector<std::string>& items) {
  std::vector<T> values;
  for (const std::string& item : items) {
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || (std::is_integral_v<T> && value != std::floor(value))) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", item,
                                                     "' is not a number"));
    }
    values.push_back(static_cast<T>(value));
  }
  return values;
}

absl::StatusOr<RiverOptions> RiverFlags() {
  RiverOptions river;
  river.quant.group_size = absl::GetFlag(FLAGS_river_group_size);
  river.quant.refine = absl::GetFlag(FLAGS_river_refine);
  ESTUARY_ASSIGN_OR_RETURN(river.policy.rule, ParseExitRule(absl::GetFlag(FLAGS_exit_rule)));
  river.policy.default_threshold = static_cast<float>(absl::GetFlag(FLAGS_exit_threshold));
  river.policy.min_backbone_layers = absl::GetFlag(FLAGS_min_backbone_layers);
  river.policy.max_backbone_layers = absl::GetFlag(FLAGS_max_backbone_layers);
  river.policy.resident_backbone_layers = absl::GetFlag(FLAGS_resident_backbone_layers);
  return river;
}

absl::Status EvalExit() {
  EvalExitCommandOptions options;
  ESTUARY_ASSIGN_OR_RETURN(options.model, ResolveModelPath(absl::GetFlag(FLAGS_model)));
  options.prompts_file = absl::GetFlag(FLAGS_prompts);
  if (options.prompts_file.empty()) return absl::InvalidArgumentError("eval-exit needs --prompts");
  ESTUARY_ASSIGN_OR_RETURN(options.taus, ParseList<float>("taus", absl::GetFlag(FLAGS_taus)));
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  ESTUARY_ASSIGN_OR_RETURN(options.river, RiverFlags());
  options.json = absl::GetFlag(FLAGS_json);
  options.threads = absl::GetFlag(FLAGS_threads);
  return RunEvalExitCommand(options);
}

absl::Status BenchDecode() {
  BenchDecodeCommandOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  if (options.model.empty()) {
    return absl::InvalidArgumentError(
        "bench-decode needs --model (e.g. a folder from `estuary synth --preset llama-3.2-1b`)");
  }
  ESTUARY_ASSIGN_OR_RETURN(options.bench.batches,
                           ParseList<int>("batch", absl::GetFlag(FLAGS_batch)));
  options.bench.exit_after = absl::GetFlag(FLAGS_exit_after);
  options.bench.steps = absl::GetFlag(FLAGS_steps);
  ESTUARY_ASSIGN_OR_RETURN(options.river, RiverFlags());
  options.json = absl::GetFlag(FLAGS_json);
  options.threads = absl::GetFlag(FLAGS_threads);
  return RunBenchDecodeCommand(options);
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::vector<std::string>& items) {
  std::vector<int32_t> ids;
  for (const std::string& item : items) {
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 0 || value > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("--stop-token-ids: '", item,
                                                     "' is not a token id"));
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

absl::Status Generate() {
  GenerateOptions options;
  ESTUARY_ASSIGN_OR_RETURN(options.model, ResolveModelPath(absl::GetFlag(FLAGS_model)));
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  options.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  options.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  options.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  options.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  options.sampling.repetition_penalty =
      static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  options.sampling.seed = absl::GetFlag(FLAGS_seed);
  ESTUARY_ASSIGN_OR_RETURN(options.sampling.stop_token_ids,
                           ParseIds(absl::GetFlag(FLAGS_stop_token_ids)));
  ESTUARY_ASSIGN_OR_RETURN(options.dtype, DTypeFlag());
  options.json = absl::GetFlag(FLAGS_json);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.river = absl::GetFlag(FLAGS_river);
  options.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  ESTUARY_ASSIGN_OR_RETURN(options.river_options, RiverFlags());
  return RunGenerate(options);
}

absl::Status Convert() {
  const std::string from = absl::GetFlag(FLAGS_from), to = absl::GetFlag(FLAGS_to);
  if (from.empty() || to.empty()) {
    return absl::InvalidArgumentError("convert needs --from PATH and --to DIR");
  }
  ESTUARY_ASSIGN_OR_RETURN(std::optional<DType> dtype, DTypeFlag());
  ESTUARY_RETURN_IF_ERROR(ConvertLlama2cToHf(from, to, dtype.value_or(DType::kF32)));
  std::printf("wrote %s\n", to.c_str());
  return absl::OkStatus();
}

absl::Status Synth() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("synth needs --out DIR");
  ESTUARY_RETURN_IF_ERROR(
      SynthesizeModel(absl::GetFlag(FLAGS_preset), out, absl::GetFlag(FLAGS_seed)));
  std::printf("wrote %s\n", out.c_str());
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "%s\n", kUsage);
    return argc < 2 ? 2 : (std::strcmp(argv[1], "--help") == 0 ? 0 : 2);
  }
  const std::string command = argv[1];
  // The subcommand takes argv[0]'s place so that absl parses only its flags.
  ParseFlags(argc - 1, argv + 1);
  absl::Status status;
  if (command == "generate") {
    status = Generate();
  } else if (command == "convert") {
    status = Convert();
  } else if (command == "synth") {
    status = Synth();
  } else if (command == "eval-exit") {
    status = EvalExit();
  } else if (command == "bench-decode") {
    status = BenchDecode();
  } else {
    std::fprintf(stderr, "unknown command '%s'\n%s\n", command.c_str(), kUsage);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "estuary %s: %s\n", command.c_str(), status.ToString().c_str());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace estuary::cli

int main(int argc, char** argv) { return estuary::cli::Main(argc, argv); }
