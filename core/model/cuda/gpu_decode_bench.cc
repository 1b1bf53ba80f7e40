// estuary-gpu-bench: decode steps on one GPU against the memory-bandwidth roofline measured in
// the same run. Modes: the full bf16 backbone, the river at a fixed exit (every token leaves after
// --exit_after backbone layers) and the whole model on the int4 river. For each batch size the
// sequences get a random prompt, then --steps decode steps are timed end to end (input upload,
// graph replay, token download). Roofline: the weight and KV bytes one step reads divided by the
// bandwidth of a device-to-device copy (bytes read + written per second).
//
// Without --model it synthesizes the llama-3.2-1b preset (random bf16 weights) in a temporary
// folder, so it runs on a machine that has nothing but this binary.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/backend/cuda/cuda_resources.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_writer.h"
#include "core/model/cuda/device_decoder.h"
#include "core/model/cuda/device_model.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"

ABSL_FLAG(std::string, model, "", "model folder or file; empty: synthesize llama-3.2-1b");
ABSL_FLAG(std::string, batches, "1,8,32", "comma-separated batch sizes");
ABSL_FLAG(int, steps, 64, "timed decode steps per configuration");
ABSL_FLAG(int, warmup, 8, "untimed decode steps first (graph capture, clocks)");
ABSL_FLAG(int, prompt, 128, "prompt tokens per sequence before timing");
ABSL_FLAG(int, exit_after, 4, "backbone layers before the forced exit of the river mode");
ABSL_FLAG(int, group_size, 64, "int4 group size of the river (64 or 128)");
ABSL_FLAG(int64_t, copy_bytes, int64_t{2} << 30, "bytes of the bandwidth-measuring copy");

namespace estuary::cuda {
namespace {

// Bandwidth of a device-to-device copy, counting bytes read and written.
absl::StatusOr<double> MeasureCopyBandwidth(int64_t bytes) {
  ESTUARY_ASSIGN_OR_RETURN(auto src, DeviceArray<uint8_t>::Create(static_cast<size_t>(bytes)));
  ESTUARY_ASSIGN_OR_RETURN(auto dst, DeviceArray<uint8_t>::Create(static_cast<size_t>(bytes)));
  ESTUARY_ASSIGN_OR_RETURN(auto start, EventHandle::Create());
  ESTUARY_ASSIGN_OR_RETURN(auto stop, EventHandle::Create());
  constexpr int kReps = 10;
  for (int i = 0; i < 3; ++i) {
    ESTUARY_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice), "warm-up copy"));
  }
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start.get()), "event"));
  for (int i = 0; i < kReps; ++i) {
    ESTUARY_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice), "copy"));
  }
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop.get()), "event"));
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop.get()), "copy"));
  float ms = 0;
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "time"));
  return 2.0 * static_cast<double>(bytes) * kReps / (ms * 1e-3);
}

struct Mode {
  const char* name;
  bool river;
  int exit_after;  // forced exit; -1: none (full backbone)
};

struct Measurement {
  double seconds_per_step = 0;
  double bytes_per_step = 0;
  size_t graph_nodes = 0;  // of the decode step's graph
};

// Weight bytes a step reads (every layer on its path, plus the LM head) and the KV it attends.
double StepBytes(const DeviceModel& model, const Mode& mode, int batch, int context) {
  const LlamaConfig& c = model.config();
  double bytes = static_cast<double>(model.lm_head_bytes());
  for (int l = 0; l < c.n_layers; ++l) {
    const bool on_river = mode.river && l >= mode.exit_after;
    bytes +=
        static_cast<double>(on_river ? model.river_layer_bytes(l) : model.backbone_layer_bytes(l));
  }
  const double kv_per_token = 2.0 * c.n_kv_heads * c.head_dim * sizeof(float) * c.n_layers;
  return bytes + kv_per_token * context * batch;
}

absl::StatusOr<Measurement> Run(const DeviceModel& model, const Mode& mode, int batch,
                                bool use_graphs = true) {
  const LlamaConfig& c = model.config();
  const int prompt = absl::GetFlag(FLAGS_prompt), steps = absl::GetFlag(FLAGS_steps),
            warmup = absl::GetFlag(FLAGS_warmup);
  DeviceDecoderOptions options;
  options.max_rows = std::max(batch, 64);
  options.max_seq_len = std::min(c.max_seq_len, prompt + warmup + steps + 16);
  options.kv_cache_bytes = static_cast<int64_t>(batch) * options.max_seq_len * 2 * c.n_kv_heads *
                               c.head_dim * sizeof(float) * c.n_layers +
                           (int64_t{256} << 20);
  if (mode.river) options.policy.max_backbone_layers = mode.exit_after;
  options.use_graphs = use_graphs;
  ESTUARY_ASSIGN_OR_RETURN(auto decoder, DeviceDecoder::Create(model, options));

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  std::vector<DeviceRow> rows;
  for (int b = 0; b < batch; ++b) {
    ESTUARY_ASSIGN_OR_RETURN(const int32_t seq, decoder->AddSequence());
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (int32_t& id : ids) id = token(rng);
    DeviceRowResult last;
    ESTUARY_RETURN_IF_ERROR(decoder->Prefill(seq, ids, 0, 2.0f, last));
    rows.push_back({seq, last.next_token, prompt, 2.0f});
  }
  std::vector<DeviceRowResult> results(rows.size());
  auto step = [&]() -> absl::Status {
    ESTUARY_RETURN_IF_ERROR(decoder->Step(rows, absl::MakeSpan(results)));
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].token = results[i].next_token;
      ++rows[i].position;
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < warmup; ++i) ESTUARY_RETURN_IF_ERROR(step());
  const int context_mid = prompt + warmup + steps / 2;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) ESTUARY_RETURN_IF_ERROR(step());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return Measurement{seconds / steps, StepBytes(model, mode, batch, context_mid),
                     decoder->graph_nodes(batch)};
}

absl::Status Main() {
  std::vector<int> batches;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1 || b > 1024) {
      return absl::InvalidArgumentError(absl::StrCat("--batches: bad batch size '", part, "'"));
    }
    batches.push_back(b);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::UnavailableError("no CUDA device");
  }
  cudaDeviceProp prop{};
  ESTUARY_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, 0), "device properties"));

  std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) {
    path = (std::filesystem::temp_directory_path() / "estuary-gpu-bench-llama-3.2-1b").string();
    if (!std::filesystem::exists(path + "/config.json")) {
      std::printf("synthesizing llama-3.2-1b (random bf16 weights) in %s\n", path.c_str());
      std::fflush(stdout);
      ESTUARY_RETURN_IF_ERROR(SynthesizeModel("llama-3.2-1b", path, 1));
    }
  }
  LoadOptions load;
  load.copy_mapped_weights = false;  // uploaded to the GPU from the mapping
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(path, load));
  const LlamaModel& model = *loaded.model;
  Int4QuantOptions quant;
  quant.group_size = absl::GetFlag(FLAGS_group_size);
  quant.refine = false;  // round to nearest: the bench measures speed, not quality
  ESTUARY_ASSIGN_OR_RETURN(auto river, River::Build(model.weights(), quant));
  ESTUARY_ASSIGN_OR_RETURN(auto backbone_only, DeviceModel::Create(model, nullptr));
  ESTUARY_ASSIGN_OR_RETURN(auto with_river, DeviceModel::Create(model, river.get()));
  ESTUARY_ASSIGN_OR_RETURN(const double bandwidth,
                           MeasureCopyBandwidth(absl::GetFlag(FLAGS_copy_bytes)));

  const LlamaConfig& c = model.config();
  const int exit_after = absl::GetFlag(FLAGS_exit_after);
  const std::string river_name = absl::StrCat("river@", exit_after);
  const std::vector<Mode> modes = {
      {"bf16", false, -1}, {river_name.c_str(), true, exit_after}, {"int4", true, 0}};
  std::printf("device: %s, %d SMs; copy bandwidth %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, bandwidth / 1e9);
  std::printf("model: %s, %d layers, dim %d, dtype %s; river int4 g%d (RTN); prompt %d\n",
              path.c_str(), c.n_layers, c.dim, DTypeName(model.weights().layers[0].wq.dtype()),
              quant.group_size, absl::GetFlag(FLAGS_prompt));
  std::printf(
      "\n| mode | batch | ms/step | tokens/s | MB read/step | GB/s | roofline | vs bf16 | nodes "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int batch : batches) {
    double bf16_seconds = 0;
    for (const Mode& mode : modes) {
      const DeviceModel& device = mode.river ? *with_river : *backbone_only;
      ESTUARY_ASSIGN_OR_RETURN(Measurement m, Run(device, mode, batch));
      if (!mode.river) bf16_seconds = m.seconds_per_step;
      const double achieved = m.bytes_per_step / m.seconds_per_step;
      std::printf("| %s | %d | %.3f | %.0f | %.1f | %.0f | %.2f | %.2fx | %zu |\n", mode.name,
                  batch, m.seconds_per_step * 1e3, batch / m.seconds_per_step,
                  m.bytes_per_step / 1e6, achieved / 1e9, achieved / bandwidth,
                  bf16_seconds / m.seconds_per_step, m.graph_nodes);
      std::fflush(stdout);
    }
  }
  // What the graphs save: the same batch-1 bf16 step with every kernel launched from the host.
  ESTUARY_ASSIGN_OR_RETURN(Measurement direct, Run(*backbone_only, modes[0], 1, false));
  std::printf("\nbf16 batch 1 without graphs: %.3f ms/step (kernels launched one by one)\n",
              direct.seconds_per_step * 1e3);
  std::printf(
      "roofline = (weight + KV bytes one step reads / step time) / copy bandwidth; a step is "
      "timed end to end (upload, graph replay, download); nodes = kernels and copies in the "
      "step's graph.\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace estuary::cuda

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = estuary::cuda::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "estuary-gpu-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
