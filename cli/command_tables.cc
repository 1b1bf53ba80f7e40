#include "cli/command_tables.h"

#include <algorithm>
#include <initializer_list>

namespace estuary::cli {
namespace {

using process::CommandFlags;
using Names = std::vector<std::string>;

Names Join(std::initializer_list<Names> parts) {
  Names all;
  for (const Names& part : parts) {
    for (const std::string& name : part) {
      if (std::find(all.begin(), all.end(), name) == all.end()) all.push_back(name);
    }
  }
  return all;
}

// --- The server binaries. ---

const Names& WorkerFlags() {
  static const Names names = {
      "model", "model_id", "host", "port", "advertise_address", "router", "ready_file",
      "tensor_parallel_size", "device", "dtype", "max_model_len", "kv_cache_memory",
      "kv_cache_bytes", "gpu_memory_utilization", "block_size", "max_num_seqs",
      "max_num_batched_tokens", "ucx_tls", "kv_transport", "metrics_port", "shutdown_timeout",
      "engine_stall_timeout", "max_failed_steps", "bf16_kernel", "max_waiting_requests",
      "debug_step_delay", "engine_watchdog_timeout", "debug_stall_rank"};
  return names;
}

// Security between the cluster's processes (rpc/cluster_flags.h): every server binary.
const Names& ClusterSecurityFlags() {
  static const Names names = {"cluster_token", "cluster_ca_file", "cluster_cert_file",
                              "cluster_key_file", "tls_refresh_interval"};
  return names;
}

const Names& DecodeOnlyFlags() {
  static const Names names = {"river",
                              "exit_threshold",
                              "exit_rule",
                              "min_backbone_layers",
                              "max_backbone_layers",
                              "river_group_size",
                              "river_refine",
                              "river_lm_head",
                              "int4_kernel",
                              "lease_ms",
                              "exit_mode",
                              "draft_tokens",
                              "min_draft_confidence",
                              "draft_backbone_layers",
                              "drafting"};
  return names;
}

const std::vector<CommandFlags>& Servers() {
  static const std::vector<CommandFlags> servers = {
      {"estuary-router", "",
       "the client-facing process: estuary.v1.Inference (gRPC) and OpenAI HTTP; workers "
       "register with it",
       Join({{"model", "model_id", "served_model_name", "host", "port", "http_port", "api_key",
              "max_model_len", "policy", "local_prefill_max_tokens", "max_queued_requests",
              "max_concurrent_streams", "worker_timeout", "discover_workers",
              "discovery_interval", "ready_file", "metrics_port", "shutdown_timeout",
              "http_max_concurrent_requests", "http_max_body_bytes", "http_request_timeout",
              "http_read_timeout", "chat_template", "ssl_certfile", "ssl_keyfile",
              "cluster_port", "migration_limit", "reserve_timeout", "prefill_timeout",
              "first_token_timeout", "token_gap_timeout", "abort_timeout"},
             ClusterSecurityFlags()})},
      {"estuary-prefill", "", "the prefill worker: prompts in, KV pages pushed to decode workers",
       Join({WorkerFlags(), ClusterSecurityFlags()})},
      {"estuary-decode", "",
       "the decode worker: receives KV pages and streams tokens (optionally through the exit "
       "river)",
       Join({WorkerFlags(), DecodeOnlyFlags(), ClusterSecurityFlags()})},
  };
  return servers;
}

// --- The `estuary` subcommands. ---

const Names& SamplingFlags() {
  static const Names names = {"temperature",      "top_p",           "top_k",
                              "min_p",            "repetition_penalty", "presence_penalty",
                              "frequency_penalty", "min_tokens",      "seed",
                              "stop_token_ids"};
  return names;
}

const Names& RiverFlags() {
  static const Names names = {"river_group_size",    "river_refine",
                              "river_lm_head",       "exit_rule",
                              "exit_threshold",      "min_backbone_layers",
                              "max_backbone_layers", "resident_backbone_layers",
                              "int4_kernel"};
  return names;
}

// The lossless exit mode (cli/exit_mode_flags.h).
const Names& LosslessFlags() {
  static const Names names = {"exit_mode", "draft_tokens", "min_draft_confidence"};
  return names;
}

// What `estuary up` sets on its processes itself (UpOptions); the rest of its flags that a
// server takes are passed through to that server as given.
constexpr const char* kUpManaged[] = {
    "model", "port", "prefill", "decode", "tp_prefill", "tp_decode", "ucx_tls", "kv_cache_bytes",
    "kv_cache_memory", "policy", "local_prefill_max_tokens", "river", "ready_file", "log_dir",
    "shutdown_timeout", "device", "metrics_port", "api_key", "cluster_token"};

const Names& UpPassThroughFlags() {
  static const Names names = {
      // router
      "served_model_name", "http_port", "max_queued_requests", "max_concurrent_streams",
      "worker_timeout",
      "http_max_concurrent_requests", "http_max_body_bytes", "http_request_timeout",
      "http_read_timeout", "chat_template", "migration_limit", "reserve_timeout",
      "prefill_timeout", "first_token_timeout", "token_gap_timeout", "abort_timeout",
      // router and workers
      "max_model_len",
      // workers
      "dtype", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "block_size",
      "engine_stall_timeout", "max_failed_steps", "bf16_kernel", "max_waiting_requests",
      "engine_watchdog_timeout",
      // decode workers
      "exit_threshold", "exit_rule", "min_backbone_layers", "max_backbone_layers",
      "river_group_size", "river_refine", "river_lm_head", "int4_kernel", "lease_ms", "exit_mode",
      "draft_tokens", "min_draft_confidence", "draft_backbone_layers", "drafting"};
  return names;
}

const std::vector<CommandFlags>& Subcommands() {
  static const std::vector<CommandFlags> commands = {
      {"estuary generate", "generate", "run one prompt on a model and print the completion",
       Join({{"model", "prompt", "max_tokens"}, SamplingFlags(),
             {"dtype", "json", "threads", "river", "tensor_parallel_size", "device", "bf16_kernel",
              "draft_backbone_layers", "drafting"},
             RiverFlags(), LosslessFlags()})},
      {"estuary up", "up",
       "start a local cluster (router, prefill and decode workers) on loopback",
       Join({Names(std::begin(kUpManaged), std::end(kUpManaged)), UpPassThroughFlags()})},
      {"estuary client", "client", "send one prompt to a router and print the streamed answer",
       Join({{"server", "api_key", "ssl_ca_certs", "prompt", "max_tokens"}, SamplingFlags(),
             {"stream", "json"}})},
      {"estuary bench-serve", "bench-serve",
       "load a router: TTFT, inter-token and end-to-end latency, tokens/s",
       {"server", "api_key", "ssl_ca_certs", "backend", "endpoint", "rate", "max_concurrency",
        "num_requests",
        "input_len", "output_len", "seed", "json", "result_file"}},
      {"estuary convert", "convert", "write a Hugging Face folder from a llama2.c model",
       {"from", "to", "dtype"}},
      {"estuary synth", "synth", "write a random-weight model with real shapes",
       {"preset", "out", "seed"}},
      {"estuary widen", "widen",
       "write a trained llama2.c model into a preset's widths as the same function "
       "(real outputs at a realistic model's cost, for benchmarks)",
       {"from", "to", "preset", "dtype"}},
      {"estuary eval-exit", "eval-exit",
       "fidelity and cost of the exit river at several thresholds",
       Join({{"model", "taus", "prompts", "max_tokens", "json", "threads", "bf16_kernel"},
             RiverFlags(), LosslessFlags()})},
      {"estuary bench-decode", "bench-decode",
       "decode tokens/s: full depth, river, full int4 (and the lossless mode)",
       Join({{"model", "batch", "exit_after", "steps", "json", "threads", "bf16_kernel"},
             RiverFlags(), LosslessFlags()})},
      {"estuary bench-prefill", "bench-prefill",
       "prefill tokens/s at several TP sizes; batch-invariant GEMM vs OpenBLAS",
       {"model", "dtype", "tp_sizes", "prompt_tokens", "max_num_batched_tokens", "threads",
        "iterations", "skip_matmul", "json", "bf16_kernel"}},
      {"estuary bench-kv", "bench-kv", "KV push GB/s and latency over UCX next to ucx_perftest",
       {"tls", "quick", "perftest", "transport_memory", "receiver_spins", "json"}},
  };
  return commands;
}

}  // namespace

const CommandFlags& RouterCommand() { return Servers()[0]; }
const CommandFlags& PrefillWorkerCommand() { return Servers()[1]; }
const CommandFlags& DecodeWorkerCommand() { return Servers()[2]; }
absl::Span<const CommandFlags> ServerCommands() { return Servers(); }

absl::Span<const CommandFlags> EstuaryCommands() { return Subcommands(); }

const CommandFlags* FindEstuaryCommand(absl::string_view name) {
  for (const CommandFlags& command : Subcommands()) {
    if (command.label == name) return &command;
  }
  return nullptr;
}

absl::Span<const char* const> UpManagedFlags() { return kUpManaged; }

}  // namespace estuary::cli
