// The `estuary` command. Owns flags and wiring only: each subcommand parses its flags into an
// options struct, validates it before anything loads, and calls a library function.
//
//   estuary generate --model PATH --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
//                    [--top-k K] [--min-p M] [--repetition-penalty R] [--seed S]
//                    [--dtype f32|bf16] [--tensor-parallel-size N] [--river] [--json]
//   estuary up       [--model PATH] [--port P] [--prefill N] [--decode M] [--tp-prefill P]
//                    [--tp-decode D] [--policy least_loaded] [--local-prefill-max-tokens T]
//   estuary client   --server HOST:PORT --prompt TEXT [--max-tokens N] [--stream] [--json]
//   estuary bench-serve --server HOST:PORT --rate R --num-requests N --input-len I
//                       --output-len O [--json]
//   estuary convert  --from PATH --to DIR [--dtype f32|bf16]
//   estuary synth    --preset tiny|llama-3.2-1b|llama-3.1-8b --out DIR [--seed S]
//   estuary eval-exit --model PATH --taus LIST --prompts FILE --max-tokens N [--json]
//   estuary bench-decode --model PATH --batch LIST [--exit-after K] [--json]
//   estuary bench-prefill --model PATH [--tp-sizes 1,2] [--prompt-tokens N]
//                         [--max-num-batched-tokens C] [--json]
//   estuary bench-kv [--tls tcp,sm] [--quick] [--perftest=false] [--json]
// River flags (eval-exit, bench-decode): --river-group-size, --river-refine, --exit-rule,
// --min-backbone-layers, --max-backbone-layers, --resident-backbone-layers.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/default_model.h"
#include "cli/exit_commands.h"
#include "process/flag_spelling.h"
#include "cli/bench_serve.h"
#include "cli/client_command.h"
#include "cli/generate_command.h"
#include "cli/up_command.h"
#include "process/signals.h"
#include "kvtransfer/bench_kv.h"
#include "prefill/bench_prefill.h"
#include "core/backend/backend.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_writer.h"

ABSL_FLAG(std::string, model, "", "model folder (llama2.c or Hugging Face); default: "
                                  "$ESTUARY_MODEL, the repository's models/stories260K, or a tiny "
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
ABSL_FLAG(std::string, device, "cpu",
          "generate, up: where the engines run: cpu, or cuda / cuda:N (a CUDA build); up gives "
          "worker i GPU N + i, decode workers first, and moves KV over NCCL");
ABSL_FLAG(int, tensor_parallel_size, 1,
          "generate: tensor-parallel ranks (threads of this process, cores shared among them)");
ABSL_FLAG(std::vector<std::string>, tp_sizes, std::vector<std::string>({"1", "2"}),
          "bench-prefill: comma-separated tensor-parallel sizes");
ABSL_FLAG(int, prompt_tokens, 2048, "bench-prefill: random prompt length");
ABSL_FLAG(int, max_num_batched_tokens, 512, "bench-prefill: prefill chunk (tokens per step)");
ABSL_FLAG(int, iterations, 1, "bench-prefill: timed prefills per TP size");
ABSL_FLAG(bool, skip_matmul, false, "bench-prefill: skip the GEMM comparison");
ABSL_FLAG(std::vector<std::string>, tls, std::vector<std::string>({"tcp", "sm"}),
          "bench-kv: transports to measure (tcp, sm)");
ABSL_FLAG(bool, quick, false, "bench-kv: fewer bytes and requests per row");
ABSL_FLAG(int, port, 50051, "up: the router's port (0: any free port)");
ABSL_FLAG(int, prefill, 1, "up: prefill workers");
ABSL_FLAG(int, decode, 1, "up: decode workers");
ABSL_FLAG(int, tp_prefill, 1, "up: tensor-parallel size of each prefill worker");
ABSL_FLAG(int, tp_decode, 1, "up: tensor-parallel size of each decode worker");
ABSL_FLAG(std::string, ucx_tls, "tcp", "up: UCX transports of the KV push (tcp, sm,tcp, ...)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20, "up: KV pool bytes per worker");
ABSL_FLAG(std::string, policy, "least_loaded",
          "up: placement policy (round_robin, least_loaded, prefix_aware)");
ABSL_FLAG(int, local_prefill_max_tokens, 0,
          "up: prompts up to this many tokens prefill on the decode worker (0: none)");
ABSL_FLAG(std::string, ready_file, "", "up: written with the router's host:port once ready");
ABSL_FLAG(std::string, log_dir, "", "up: folder for the processes' logs (default: a temp folder)");
ABSL_FLAG(absl::Duration, shutdown_timeout, absl::Seconds(30),
          "up: on SIGTERM the router's requests in flight, then the workers', get this long");
ABSL_FLAG(std::string, server, "", "client: the router's host:port");
ABSL_FLAG(bool, stream, true, "client: print the text as it arrives");
ABSL_FLAG(double, rate, 4.0, "bench-serve: requests per second (Poisson); 0 = all at once");
ABSL_FLAG(int, num_requests, 32, "bench-serve: requests to send");
ABSL_FLAG(int, input_len, 64, "bench-serve: prompt tokens per request");
ABSL_FLAG(int, output_len, 64, "bench-serve: new tokens per request");
ABSL_FLAG(bool, perftest, true, "bench-kv: run ucx_perftest next to each row");
ABSL_FLAG(bool, receiver_spins, false,
          "bench-kv: the receiver's progress thread spins instead of sleeping on its event fd");
ABSL_FLAG(bool, transport_memory, true,
          "bench-kv: the receiver's pool in UCX-allocated (shareable) memory, as decode workers "
          "allocate it");
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
    "  up        start a local cluster (router, prefill and decode workers) on loopback\n"
    "  client    send one prompt to a router and print the streamed answer\n"
    "  bench-serve    load a router: TTFT, inter-token and end-to-end latency, tokens/s\n"
    "  convert   write a Hugging Face folder from a llama2.c model\n"
    "  synth     write a random-weight model with real shapes\n"
    "  eval-exit      fidelity and cost of the exit river at several thresholds\n"
    "  bench-decode   decode tokens/s: full depth, river, full int4\n"
    "  bench-prefill  prefill tokens/s at several TP sizes; batch-invariant GEMM vs OpenBLAS\n"
    "  bench-kv       KV push GB/s and latency over UCX next to ucx_perftest\n"
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

absl::Status BenchPrefill() {
  BenchPrefillOptions options;
  options.model_path = absl::GetFlag(FLAGS_model);
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError(
        "bench-prefill needs --model (e.g. a folder from `estuary synth --preset llama-3.2-1b`)");
  }
  options.dtype = absl::GetFlag(FLAGS_dtype);
  ESTUARY_ASSIGN_OR_RETURN(options.tp_sizes,
                           ParseList<int>("tp_sizes", absl::GetFlag(FLAGS_tp_sizes)));
  options.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  options.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.prefill_iterations = absl::GetFlag(FLAGS_iterations);
  options.skip_matmul = absl::GetFlag(FLAGS_skip_matmul);
  options.json = absl::GetFlag(FLAGS_json);
  return RunBenchPrefill(options);
}

absl::Status BenchKv() {
  kvtransfer::BenchKvOptions options;
  const std::vector<std::string> tls = absl::GetFlag(FLAGS_tls);
  std::erase_if(options.transports, [&](const kvtransfer::BenchKvTransport& t) {
    return std::find(tls.begin(), tls.end(), t.name) == tls.end();
  });
  if (options.transports.empty()) return absl::InvalidArgumentError("--tls: use tcp and/or sm");
  if (absl::GetFlag(FLAGS_quick)) {
    options.bandwidth_bytes = 64 << 20;
    options.bandwidth_bytes_tcp = 16 << 20;
    options.requests = 10;
  }
  options.run_perftest = absl::GetFlag(FLAGS_perftest);
  options.receiver_transport_memory = absl::GetFlag(FLAGS_transport_memory);
  options.receiver_busy_poll = absl::GetFlag(FLAGS_receiver_spins);
  options.json = absl::GetFlag(FLAGS_json);
  return kvtransfer::RunBenchKv(options, std::cout);
}

absl::Status Up() {
  UpOptions options;
  ESTUARY_ASSIGN_OR_RETURN(options.model, ResolveModelPath(absl::GetFlag(FLAGS_model)));
  options.port = absl::GetFlag(FLAGS_port);
  options.prefill = absl::GetFlag(FLAGS_prefill);
  options.decode = absl::GetFlag(FLAGS_decode);
  options.tp_prefill = absl::GetFlag(FLAGS_tp_prefill);
  options.tp_decode = absl::GetFlag(FLAGS_tp_decode);
  options.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  options.policy = absl::GetFlag(FLAGS_policy);
  options.local_prefill_max_tokens = absl::GetFlag(FLAGS_local_prefill_max_tokens);
  options.river = absl::GetFlag(FLAGS_river);
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.log_dir = absl::GetFlag(FLAGS_log_dir);
  options.shutdown_timeout = absl::GetFlag(FLAGS_shutdown_timeout);
  ESTUARY_ASSIGN_OR_RETURN(options.device, ParseDevice(absl::GetFlag(FLAGS_device)));
  return RunUp(options);
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

absl::StatusOr<SamplingParams> SamplingFlags() {
  SamplingParams sampling;
  sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  sampling.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  sampling.seed = absl::GetFlag(FLAGS_seed);
  ESTUARY_ASSIGN_OR_RETURN(sampling.stop_token_ids, ParseIds(absl::GetFlag(FLAGS_stop_token_ids)));
  return sampling;
}

absl::Status Generate() {
  GenerateOptions options;
  ESTUARY_ASSIGN_OR_RETURN(options.model, ResolveModelPath(absl::GetFlag(FLAGS_model)));
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  ESTUARY_ASSIGN_OR_RETURN(options.sampling, SamplingFlags());
  ESTUARY_ASSIGN_OR_RETURN(options.dtype, DTypeFlag());
  options.json = absl::GetFlag(FLAGS_json);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.river = absl::GetFlag(FLAGS_river);
  options.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  ESTUARY_ASSIGN_OR_RETURN(options.device, ParseDevice(absl::GetFlag(FLAGS_device)));
  ESTUARY_ASSIGN_OR_RETURN(options.river_options, RiverFlags());
  return RunGenerate(options);
}

absl::Status Client() {
  ClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  ESTUARY_ASSIGN_OR_RETURN(options.sampling, SamplingFlags());
  ESTUARY_RETURN_IF_ERROR(options.sampling.Validate());
  options.stream = absl::GetFlag(FLAGS_stream);
  options.json = absl::GetFlag(FLAGS_json);
  return RunClient(options);
}

absl::Status BenchServe() {
  BenchServeOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.rate = absl::GetFlag(FLAGS_rate);
  options.num_requests = absl::GetFlag(FLAGS_num_requests);
  options.input_len = absl::GetFlag(FLAGS_input_len);
  options.output_len = absl::GetFlag(FLAGS_output_len);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.json = absl::GetFlag(FLAGS_json);
  return RunBenchServe(options);
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
  // `up` takes SIGINT / SIGTERM synchronously; they must be blocked before any thread starts.
  if (command == "up") process::BlockTerminationSignals();
  // The subcommand takes argv[0]'s place so that absl parses only its flags.
  process::ParseFlags(argc - 1, argv + 1);
  absl::Status status;
  if (command == "generate") {
    status = Generate();
  } else if (command == "convert") {
    status = Convert();
  } else if (command == "synth") {
    status = Synth();
  } else if (command == "up") {
    status = Up();
  } else if (command == "client") {
    status = Client();
  } else if (command == "bench-serve") {
    status = BenchServe();
  } else if (command == "bench-prefill") {
    status = BenchPrefill();
  } else if (command == "bench-kv") {
    status = BenchKv();
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
