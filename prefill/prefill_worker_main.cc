// estuary-prefill: the prefill worker process (design §1). Flags are parsed into options and
// validated before anything loads; then the model is loaded onto its TP ranks and the
// PrefillWorker service served until SIGINT / SIGTERM, pushing KV over UCX.
//
//   estuary-prefill --model PATH [--port P] [--tensor-parallel-size N]
//                   [--max-num-batched-tokens T] [--ucx-tls tcp] [--ready-file F]
//                  [--host 0.0.0.0 --advertise-address A] [--router HOST:PORT]
//                  [--shutdown-timeout 30s] [--engine-stall-timeout 60s] [--max-failed-steps 3]
//                  [--engine-watchdog-timeout 600s]
//                  [--max-model-len L] [--kv-cache-memory 2GiB] [--dtype f32|bf16]
//                  [--cluster-token T] [--cluster-ca-file F --cluster-cert-file F --cluster-key-file F]
//                  [--debug-step-delay D]
// Its flags: cli/command_tables.cc (PrefillWorkerCommand); `estuary-prefill --help` lists them.

#include "absl/flags/flag.h"
#include "cli/command_tables.h"
#include "cli/kernel_flags.h"
#include "core/common/status_macros.h"
#include "prefill/prefill_service.h"
#include "process/process_main.h"
#include "rpc/cluster_flags.h"
#include "worker/worker_flags.h"
#include "worker/worker_process.h"

namespace estuary {
namespace {

absl::Status Run() {
  worker::WorkerProcessOptions process = worker::WorkerProcessOptionsFromFlags();
  ESTUARY_RETURN_IF_ERROR(worker::ValidateWorkerProcessOptions(process));
  ESTUARY_RETURN_IF_ERROR(rpc::ConfigureClusterSecurityFromFlags());
  ESTUARY_RETURN_IF_ERROR(cli::ApplyKernelFlags());
  PrefillServiceOptions options;
  options.model_id = process.model_id;
  options.max_requests_in_flight = process.max_requests_in_flight;
  ESTUARY_ASSIGN_OR_RETURN(options.descriptor_key, worker::KvDescriptorKey());
  options.debug_step_delay = process.debug_step_delay;
  ESTUARY_ASSIGN_OR_RETURN(options.engine.kv_cache_bytes, worker::KvCacheBytesFromFlags(process));
  options.engine.gpu_memory_utilization = worker::GpuMemoryUtilizationFlag();
  options.engine.block_size = absl::GetFlag(FLAGS_block_size);
  options.engine.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  options.engine.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  ESTUARY_ASSIGN_OR_RETURN(const Device device, worker::WorkerDevice(process));
  options.engine.cuda_device = device.is_cpu() ? -1 : device.ordinal;

  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<ShardedModel> model, worker::LoadShardedModel(process));
  ESTUARY_RETURN_IF_ERROR(options.engine.Validate(model->config()));
  return worker::ServeRoleService<PrefillService>(process, estuary::v1::WORKER_ROLE_PREFILL,
                                                  "prefill", *model, options);
}

}  // namespace
}  // namespace estuary

int main(int argc, char** argv) {
  return estuary::process::ProcessMain(argc, argv, estuary::cli::PrefillWorkerCommand(),
                                      estuary::Run, estuary::cli::ServerCommands());
}
