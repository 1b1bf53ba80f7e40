// estuary-decode: the decode worker process (design §1). Flags are parsed into options and
// validated before anything loads; then the model is loaded onto its TP ranks, the exit river
// built when asked, the KV pool registered with UCX, and the DecodeWorker service served until
// SIGINT / SIGTERM.
//
//   estuary-decode --model PATH [--port P] [--tensor-parallel-size N] [--river
//                  --exit-threshold T --exit-rule batch_min|split --min-backbone-layers N
//                  --max-backbone-layers N --river-group-size G --river-lm-head H]
//                  [--kv-cache-bytes B] [--ucx-tls tcp] [--ready-file F]
//                  [--host 0.0.0.0 --advertise-address A] [--router HOST:PORT]
//                  [--shutdown-timeout 30s] [--engine-stall-timeout 60s] [--max-failed-steps 3]
//                  [--engine-watchdog-timeout 600s]
//                  [--device cuda[:N] --kv-transport nccl]   (a CUDA build: steps on the GPU)
//                  [--max-model-len L] [--kv-cache-memory 2GiB] [--dtype f32|bf16]
//                  [--cluster-token T] [--cluster-ca-file F --cluster-cert-file F --cluster-key-file F]
// Its flags: cli/command_tables.cc (DecodeWorkerCommand); `estuary-decode --help` lists them.

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/command_tables.h"
#include "cli/kernel_flags.h"
#include "cli/exit_mode_flags.h"
#include "cli/river_flags.h"
#include "core/common/status_macros.h"
#include "decode/decode_service.h"
#include "process/process_main.h"
#include "rpc/cluster_flags.h"
#include "worker/worker_flags.h"
#include "worker/worker_process.h"

// --river turns the exit river on; how it is built and when tokens exit: cli/river_flags.h.
ABSL_FLAG(bool, river, false, "decode with the exit river (int4 copy of the layers)");
ABSL_FLAG(int64_t, lease_ms, 30000, "how long reserved pages wait for their KV");

namespace estuary {
namespace {

absl::Status Run() {
  worker::WorkerProcessOptions process = worker::WorkerProcessOptionsFromFlags();
  ESTUARY_RETURN_IF_ERROR(worker::ValidateWorkerProcessOptions(process));
  ESTUARY_RETURN_IF_ERROR(rpc::ConfigureClusterSecurityFromFlags());
  ESTUARY_RETURN_IF_ERROR(cli::ApplyKernelFlags());
  DecodeServiceOptions options;
  options.model_id = process.model_id;
  options.max_requests_in_flight = process.max_requests_in_flight;
  ESTUARY_ASSIGN_OR_RETURN(options.descriptor_key, worker::KvDescriptorKey());
  ESTUARY_ASSIGN_OR_RETURN(options.engine.kv_cache_bytes, worker::KvCacheBytesFromFlags(process));
  options.engine.gpu_memory_utilization = worker::GpuMemoryUtilizationFlag();
  options.engine.block_size = absl::GetFlag(FLAGS_block_size);
  options.engine.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  options.engine.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  if (!absl::GetFlag(FLAGS_river)) ESTUARY_RETURN_IF_ERROR(cli::RefuseRiverFlagsWithoutRiver());
  ESTUARY_ASSIGN_OR_RETURN(const cli::RiverOptions river, cli::RiverOptionsFromFlags());
  options.engine.exit = river.policy;
  ESTUARY_ASSIGN_OR_RETURN(const cli::WorkerExitMode exit_mode,
                           cli::WorkerExitModeFromFlags(absl::GetFlag(FLAGS_river)));
  options.default_lossless = exit_mode.default_lossless;
  options.engine.lossless = exit_mode.lossless;
  if (absl::GetFlag(FLAGS_lease_ms) <= 0) return absl::InvalidArgumentError("--lease-ms must be > 0");
  options.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.debug_step_delay = process.debug_step_delay;

  ESTUARY_ASSIGN_OR_RETURN(const Device device, worker::WorkerDevice(process));
  options.engine.cuda_device = device.is_cpu() ? -1 : device.ordinal;
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<ShardedModel> model, worker::LoadShardedModel(process));
  ESTUARY_RETURN_IF_ERROR(options.engine.Validate(model->config()));
  if (absl::GetFlag(FLAGS_river)) {
    ESTUARY_RETURN_IF_ERROR(model->BuildRiver(river.quant, /*first_layer=*/0, river.lm_head));
  }
  return worker::ServeRoleService<DecodeService>(process, estuary::v1::WORKER_ROLE_DECODE,
                                                 "decode", *model, options);
}

}  // namespace
}  // namespace estuary

int main(int argc, char** argv) {
  return estuary::process::ProcessMain(argc, argv, estuary::cli::DecodeWorkerCommand(),
                                      estuary::Run, estuary::cli::ServerCommands());
}
