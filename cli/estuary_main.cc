// The `estuary` command. Owns flags and wiring only: each subcommand parses its flags into an
// options struct, validates it before anything loads, and calls a library function.
//
//   estuary generate --model PATH --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
//                    [--top-k K] [--min-p M] [--repetition-penalty R] [--seed S]
//                    [--dtype f32|bf16] [--tensor-parallel-size N] [--river] [--json]
//   estuary up       [--model PATH] [--port P] [--prefill N] [--decode M] [--tp-prefill P]
//                    [--tp-decode D] [--policy least_loaded] [--local-prefill-max-tokens T]
//   estuary client   --server HOST:PORT --prompt TEXT [--max-tokens N] [--stream] [--json]
//   estuary bench-serve --server HOST:PORT [--backend grpc|openai] [--endpoint URL] --rate R
//                       [--max-concurrency C] [--result-file F] --num-requests N --input-len I
//                       --output-len O [--json]
//   estuary convert  --from PATH --to DIR [--dtype f32|bf16]
//   estuary synth    --preset tiny|llama-3.2-1b|llama-3.1-8b --out DIR [--seed S]
//   estuary widen    --from PATH --preset llama-1b-v512 --to DIR [--dtype bf16]
//   estuary eval-exit --model PATH --taus LIST --prompts FILE --max-tokens N [--json]
//   estuary bench-decode --model PATH --batch LIST [--exit-after K] [--json]
//   estuary bench-prefill --model PATH [--tp-sizes 1,2] [--prompt-tokens N]
//                         [--max-num-batched-tokens C] [--json]
//   estuary bench-kv [--tls tcp,sm] [--quick] [--perftest=false] [--json]
// River flags (eval-exit, bench-decode): --river-group-size, --river-refine, --exit-rule,
// --min-backbone-layers, --max-backbone-layers, --resident-backbone-layers.
// Which flags each subcommand takes: cli/command_tables.cc (`estuary <command> --help` prints
// them; another command's flag is refused). `estuary up` passes the server flags it is given
// (--max-num-seqs, --max-model-len, --http-port, ...) to the processes they apply to.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "cli/command_tables.h"
#include "cli/default_model.h"
#include "process/byte_size.h"
#include "process/command_flags.h"
#include "rpc/api_key.h"
#include "rpc/cluster_security.h"
#include "cli/exit_commands.h"
#include "cli/bench_serve.h"
#include "cli/client_command.h"
#include "cli/generate_command.h"
#include "cli/up_command.h"
#include "cli/kernel_flags.h"
#include "cli/exit_mode_flags.h"
#include "cli/river_flags.h"
#include "process/signals.h"
#include "kvtransfer/bench_kv.h"
#include "prefill/bench_prefill.h"
#include "core/backend/backend.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_writer.h"
#include "core/loader/widen_model.h"

ABSL_FLAG(std::string, model, "", "model folder (llama2.c or Hugging Face); default: "
                                  "$ESTUARY_MODEL, the repository's models/stories260K, or a tiny "
                                  "synthesized model");
ABSL_FLAG(std::string, prompt, "Once upon a time", "prompt text");
ABSL_FLAG(int, max_tokens, 256, "new tokens at most");
ABSL_FLAG(double, temperature, 1.0, "sampling temperature (1.0, as OpenAI and vLLM); 0 = greedy");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling threshold in (0, 1]");
ABSL_FLAG(int, top_k, 0, "keep the k most likely tokens; 0 = off");
ABSL_FLAG(double, min_p, 0.0, "keep tokens with p >= min_p * p_max; 0 = off");
ABSL_FLAG(double, repetition_penalty, 1.0, "penalty for tokens already seen; 1 = off");
ABSL_FLAG(int64_t, seed, -1, "random seed (same seed, same output); -1 = a fresh random one");
ABSL_FLAG(double, presence_penalty, 0.0,
          "subtracted once from every token already generated, in [-2, 2]; 0 = off");
ABSL_FLAG(double, frequency_penalty, 0.0,
          "subtracted per occurrence among the generated tokens, in [-2, 2]; 0 = off");
ABSL_FLAG(int, min_tokens, 0, "end-of-sequence and stop ids cannot end the output before this "
                              "many new tokens");
ABSL_FLAG(std::vector<std::string>, stop_token_ids, {}, "comma-separated token ids that end "
                                                        "generation");
ABSL_FLAG(std::string, dtype, "", "weight dtype at load: f32 or bf16 (default: the file's); convert, widen: the dtype written (default f32, widen bf16)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(int, threads, 0,
          "CPU threads of the kernels and the GEMM library (generate: all ranks together); 0 = "
          "every core; eval-exit: the GEMM library's only (it decodes on one thread)");
ABSL_FLAG(std::string, from, "", "convert, widen: llama2.c folder or model.bin");
ABSL_FLAG(std::string, to, "", "convert, widen: output Hugging Face folder");
ABSL_FLAG(std::string, preset, "tiny", "synth: tiny, small, llama-3.2-1b, llama-1b-v512 (the 1B decoder, vocabulary 512) or llama-3.1-8b; widen: the preset whose widths the model is written into");
ABSL_FLAG(std::string, out, "", "synth: output folder");
ABSL_FLAG(std::vector<std::string>, taus, {}, "eval-exit: comma-separated exit thresholds");
ABSL_FLAG(std::string, prompts, "", "eval-exit: file with one prompt per line");
ABSL_FLAG(std::vector<std::string>, batch, std::vector<std::string>({"1", "4", "16"}),
          "bench-decode: comma-separated batch sizes");
ABSL_FLAG(int, exit_after, 4, "bench-decode: backbone layers before the river's forced exit");
ABSL_FLAG(int, steps, 8, "bench-decode: timed decode steps per mode and batch");
ABSL_FLAG(bool, river, false,
          "generate: decode through the paged engine with the exit river; up: the decode "
          "workers decode with it");
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
ABSL_FLAG(estuary::process::ByteSize, kv_cache_memory,
          estuary::process::ByteSize{int64_t{256} << 20},
          "up: KV pool size of each worker: bytes, or with a unit (KiB, MiB, GiB, KB, MB, GB)");
ABSL_FLAG(int64_t, kv_cache_bytes, 0,
          "up: older spelling of --kv-cache-memory in plain bytes; when > 0 it is used instead");
ABSL_FLAG(int, metrics_port, -1,
          "up: Prometheus /metrics: -1 = off; 0 = every process on a free port; P = the router "
          "on P, the workers on P + 1, P + 2, ... (decode workers first)");
ABSL_FLAG(std::string, api_key, "",
          "client, bench-serve: sent as `authorization: Bearer KEY`; up: the router requires it; "
          "default: $ESTUARY_API_KEY");
ABSL_FLAG(std::string, ssl_ca_certs, "",
          "client, bench-serve: TLS to the router, whose certificate must chain to this CA "
          "(PEM) and name the host dialled");
ABSL_FLAG(std::string, cluster_token, "",
          "up: the token every process of the local cluster demands and sends, and from which "
          "its workers derive the KV descriptor seal's key (at least 16 characters); default: "
          "$ESTUARY_CLUSTER_TOKEN, else a fresh random one");
// Passed by `estuary up` to the servers that take them (cli/command_tables.cc), when given;
// defaults and meaning as in those servers.
ABSL_FLAG(std::string, served_model_name, "",
          "up -> router: the model name clients see and send; default: the model folder's name");
ABSL_FLAG(int, http_port, -1,
          "up -> router: OpenAI-compatible HTTP port; -1 = off, 0 = any free port");
ABSL_FLAG(int, max_model_len, 0,
          "up -> router and workers: prompt + max_tokens per request at most; 0 = the model's "
          "context length");
ABSL_FLAG(int, max_queued_requests, 1024,
          "up -> router: requests waiting for their first token at most");
ABSL_FLAG(int, max_concurrent_streams, 1024,
          "up -> router: Generate calls at once (queued or streaming); beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, worker_timeout, absl::Seconds(3),
          "up -> router: a worker silent for this long is dropped");
ABSL_FLAG(int, http_max_concurrent_requests, 256,
          "up -> router: HTTP generation requests answered at once; beyond: 429");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{4} << 20,
          "up -> router: HTTP request bodies at most; beyond: 413");
ABSL_FLAG(absl::Duration, http_request_timeout, absl::Minutes(10),
          "up -> router: an HTTP generation request is given this long in all");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(30),
          "up -> router: an HTTP client that sends nothing for this long is dropped");
ABSL_FLAG(int, migration_limit, 3,
          "up -> router: times a stream is resumed on another decode worker when its own fails "
          "or drains; 0 = never");
ABSL_FLAG(absl::Duration, reserve_timeout, absl::Seconds(5),
          "up -> router: a decode worker's Reserve may take this long");
ABSL_FLAG(absl::Duration, prefill_timeout, absl::Seconds(120),
          "up -> router: a prefill worker's Prefill may take this long");
ABSL_FLAG(absl::Duration, first_token_timeout, absl::Seconds(120),
          "up -> router: a decode stream's first token may take this long");
ABSL_FLAG(absl::Duration, token_gap_timeout, absl::Seconds(30),
          "up -> router: the gap between two tokens of a decode stream may last this long");
ABSL_FLAG(absl::Duration, abort_timeout, absl::Seconds(1),
          "up -> router: a worker Abort may take this long");
ABSL_FLAG(std::string, chat_template, "",
          "up -> router: Jinja chat template file for /v1/chat/completions; default: "
          "tokenizer_config.json's chat_template");
ABSL_FLAG(double, gpu_memory_utilization, 0,
          "up -> workers: CUDA devices only: share of the GPU's memory to use; 0 = off");
ABSL_FLAG(int, max_num_seqs, 64, "up -> workers: sequences admitted at once");
ABSL_FLAG(int, max_waiting_requests, 256,
          "up -> workers: requests waiting beyond --max-num-seqs at most; beyond: "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int, block_size, 16, "up -> workers: token slots per KV page");
ABSL_FLAG(absl::Duration, engine_stall_timeout, absl::Seconds(60),
          "up -> workers: a step running longer than this makes the worker not ready");
ABSL_FLAG(int, max_failed_steps, 3,
          "up -> workers: this many failed engine steps in a row make the worker not ready");
ABSL_FLAG(absl::Duration, engine_watchdog_timeout, absl::Seconds(600),
          "up -> workers: a step running longer than this (a stuck rank) makes the worker exit "
          "with status 3, and `estuary up` restarts it; 0 = off");
ABSL_FLAG(int64_t, lease_ms, 30000, "up -> decode workers: how long reserved pages wait for KV");
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
ABSL_FLAG(std::string, backend, "",
          "bench-serve: grpc (the router's gRPC port) or openai (HTTP /v1/completions, SSE); "
          "default: openai with --endpoint, else grpc");
ABSL_FLAG(std::string, endpoint, "",
          "bench-serve: the OpenAI completions URL, e.g. http://127.0.0.1:8000/v1/completions "
          "(default with --backend openai: http://<--server>/v1/completions)");
ABSL_FLAG(int, max_concurrency, 0,
          "bench-serve: requests in flight at most (later arrivals wait); 0 = no cap");
ABSL_FLAG(std::string, result_file, "",
          "bench-serve: also write the result JSON (vllm bench serve's keys) to this file");
ABSL_FLAG(bool, perftest, true, "bench-kv: run ucx_perftest next to each row");
ABSL_FLAG(bool, receiver_spins, false,
          "bench-kv: the receiver's progress thread spins instead of sleeping on its event fd");
ABSL_FLAG(bool, transport_memory, true,
          "bench-kv: the receiver's pool in UCX-allocated (shareable) memory, as decode workers "
          "allocate it");
// The river's other flags (group size, rule, threshold, backbone bounds): cli/river_flags.h.
ABSL_FLAG(int, resident_backbone_layers, 0,
          "backbone layers at and above this are never loaded (forced exit there); 0 = all");

namespace estuary::cli {
namespace {

// The top-level usage: every subcommand with its summary (cli/command_tables.cc), and any flag
// defined here that no subcommand takes (a table error; tests/cli/command_flags_cli_test asserts
// there is none).
std::string Usage() {
  std::string usage = "usage: estuary <command> [flags]\ncommands:\n";
  for (const process::CommandFlags& command : EstuaryCommands()) {
    const size_t pad = 15 - std::min<size_t>(14, command.label.size());
    absl::StrAppend(&usage, "  ", command.label, std::string(pad, ' '), command.summary, "\n");
  }
  absl::StrAppend(&usage, "Run `estuary <command> --help` for its flags.\n");
  std::vector<std::string> unclaimed;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::EndsWith(flag->Filename(), "cli/estuary_main.cc")) continue;
    bool claimed = false;
    for (const process::CommandFlags& command : EstuaryCommands()) {
      claimed = claimed || std::find(command.flags.begin(), command.flags.end(), name) !=
                               command.flags.end();
    }
    if (!claimed) unclaimed.push_back(absl::StrCat("--", name));
  }
  std::sort(unclaimed.begin(), unclaimed.end());
  if (!unclaimed.empty()) {
    absl::StrAppend(&usage,
                    "internal: flags no command takes (add them to cli/command_tables.cc): ",
                    absl::StrJoin(unclaimed, " "), "\n");
  }
  return usage;
}

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
  ESTUARY_ASSIGN_OR_RETURN(RiverOptions river, RiverOptionsFromFlags());
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
  // eval-exit always builds the river: lossless rows need no --river.
  ESTUARY_ASSIGN_OR_RETURN(options.lossless,
                           LosslessOptionsFromFlags(/*river=*/true, options.river.policy));
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
  // The lossless rows draft with the river rows' forced exit (after --exit-after layers).
  ExitPolicy drafts;
  drafts.max_backbone_layers = options.bench.exit_after;
  drafts.min_backbone_layers = std::min(1, options.bench.exit_after);
  ESTUARY_ASSIGN_OR_RETURN(options.bench.lossless, LosslessOptionsFromFlags(true, drafts));
  // Every draft leaves after --exit-after layers (the cap), as the river rows' tokens.
  if (options.bench.lossless) {
    options.bench.lossless->draft_backbone_layers = -1;
    options.bench.lossless->drafting = LosslessOptions::Drafting::kAlways;  // it measures drafts
  }
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

// The flags given to `estuary up` that a server takes and up does not set itself, as
// --name=value for each server that takes them (cli/command_tables.h).
absl::Status PassThrough(const std::set<std::string>& given, UpOptions& options) {
  const absl::Span<const char* const> managed = UpManagedFlags();
  std::vector<std::string>* targets[] = {&options.router_flags, &options.prefill_flags,
                                         &options.decode_flags};
  for (const std::string& name : given) {
    if (std::find(managed.begin(), managed.end(), name) != managed.end()) continue;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) return absl::InternalError(absl::StrCat("--", name, " is not defined"));
    const std::string arg = absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}), "=",
                                         flag->CurrentValue());
    for (size_t i = 0; i < ServerCommands().size(); ++i) {
      const std::vector<std::string>& flags = ServerCommands()[i].flags;
      if (std::find(flags.begin(), flags.end(), name) != flags.end()) targets[i]->push_back(arg);
    }
  }
  return absl::OkStatus();
}

absl::Status Up(const std::set<std::string>& given) {
  UpOptions options;
  ESTUARY_ASSIGN_OR_RETURN(options.model, ResolveModelPath(absl::GetFlag(FLAGS_model)));
  options.port = absl::GetFlag(FLAGS_port);
  options.prefill = absl::GetFlag(FLAGS_prefill);
  options.decode = absl::GetFlag(FLAGS_decode);
  options.tp_prefill = absl::GetFlag(FLAGS_tp_prefill);
  options.tp_decode = absl::GetFlag(FLAGS_tp_decode);
  options.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes) > 0
                               ? absl::GetFlag(FLAGS_kv_cache_bytes)
                               : absl::GetFlag(FLAGS_kv_cache_memory).bytes;
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.api_key = rpc::ApiKeyFromFlagOrEnv(absl::GetFlag(FLAGS_api_key));
  options.cluster_token = absl::GetFlag(FLAGS_cluster_token);
  if (options.cluster_token.empty()) {
    if (const char* env = std::getenv(rpc::kClusterTokenEnv); env != nullptr) {
      options.cluster_token = env;
    }
  }
  ESTUARY_RETURN_IF_ERROR(PassThrough(given, options));
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
  sampling.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  sampling.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  sampling.min_tokens = absl::GetFlag(FLAGS_min_tokens);
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed < -1) return absl::InvalidArgumentError("--seed must be >= 0 (or -1: a random one)");
  sampling.seed = seed >= 0 ? static_cast<uint64_t>(seed) : absl::Uniform<uint64_t>(absl::BitGen());
  ESTUARY_ASSIGN_OR_RETURN(sampling.stop_token_ids, ParseIds(absl::GetFlag(FLAGS_stop_token_ids)));
  return sampling;
}

absl::Status Generate(const std::set<std::string>& given) {
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
  ESTUARY_ASSIGN_OR_RETURN(options.lossless,
                           LosslessOptionsFromFlags(options.river, options.river_options.policy));
  if (options.lossless.has_value() && options.lossless->draft_backbone_layers == 0 &&
      given.count("exit_threshold") > 0) {
    return absl::InvalidArgumentError(
        "--exit-threshold moves no draft: with --draft-backbone-layers 0 (the default) every "
        "lossless draft runs wholly on the river; set it above 0, or to -1 for drafts that "
        "leave by τ alone");
  }
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
  options.api_key = rpc::ApiKeyFromFlagOrEnv(absl::GetFlag(FLAGS_api_key));
  options.ssl_ca_certs = absl::GetFlag(FLAGS_ssl_ca_certs);
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
  options.backend = absl::GetFlag(FLAGS_backend);
  options.endpoint = absl::GetFlag(FLAGS_endpoint);
  options.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  options.result_file = absl::GetFlag(FLAGS_result_file);
  options.api_key = rpc::ApiKeyFromFlagOrEnv(absl::GetFlag(FLAGS_api_key));
  options.ssl_ca_certs = absl::GetFlag(FLAGS_ssl_ca_certs);
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

absl::Status Widen(const std::set<std::string>& given) {
  const std::string from = absl::GetFlag(FLAGS_from), to = absl::GetFlag(FLAGS_to);
  if (from.empty() || to.empty() || given.count("preset") == 0) {
    return absl::InvalidArgumentError("widen needs --from PATH, --preset NAME and --to DIR");
  }
  ESTUARY_ASSIGN_OR_RETURN(LlamaConfig widths, SynthPresetConfig(absl::GetFlag(FLAGS_preset)));
  ESTUARY_ASSIGN_OR_RETURN(std::optional<DType> dtype, DTypeFlag());
  ESTUARY_RETURN_IF_ERROR(WidenLlama2cToHf(from, widths, to, dtype.value_or(DType::kBF16)));
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
  if (argc < 2 || argv[1][0] == '-') {
    const bool help = argc >= 2 && (std::strcmp(argv[1], "--help") == 0 ||
                                    std::strcmp(argv[1], "-h") == 0);
    std::fputs(Usage().c_str(), help ? stdout : stderr);
    return help ? 0 : 2;
  }
  const std::string command = argv[1];
  const process::CommandFlags* flags = FindEstuaryCommand(command);
  if (flags == nullptr) {
    std::fprintf(stderr, "error: unknown command '%s'\n%s", command.c_str(), Usage().c_str());
    return 2;
  }
  // `up` takes SIGINT / SIGTERM synchronously; they must be blocked before any thread starts.
  if (command == "up") process::BlockTerminationSignals();
  process::IgnoreBrokenPipes();  // https clients (bench-serve) write through OpenSSL
  // The subcommand takes argv[0]'s place; its flags are checked against its own table.
  const std::set<std::string> given =
      process::ParseCommandFlags(argc - 1, argv + 1, *flags, EstuaryCommands());
  // Kernel choices first, for the commands that run a model here (up passes them on).
  const bool runs_a_model =
      command != "up" &&
      std::find(flags->flags.begin(), flags->flags.end(), "bf16_kernel") != flags->flags.end();
  absl::Status status = runs_a_model ? ApplyKernelFlags() : absl::OkStatus();
  if (status.ok()) {
    if (command == "generate") {
      status = Generate(given);
    } else if (command == "convert") {
      status = Convert();
    } else if (command == "synth") {
      status = Synth();
    } else if (command == "widen") {
      status = Widen(given);
    } else if (command == "up") {
      status = Up(given);
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
      std::fprintf(stderr, "error: no runner for command '%s'\n", command.c_str());
      return 2;
    }
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
