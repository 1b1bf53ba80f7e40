// CreateCudaDeviceStep with ESTUARY_CUDA: an engine's steps on DeviceDecoder.
#include "core/model/device_step.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/backend.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kvcache/kv_layout.h"
#include "core/model/cuda/device_decoder.h"
#include "core/model/cuda/device_model.h"

namespace estuary {
namespace {

class CudaDeviceStep final : public StepRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDeviceStep>> Create(const LlamaModel& model,
                                                                const River* river,
                                                                const DeviceStepOptions& options) {
    const int count = CudaDeviceCount();
    if (options.device < 0 || options.device >= count) {
      return absl::UnavailableError(
          absl::StrCat("CUDA device ", options.device, " not found (", count, " visible)"));
    }
    ESTUARY_RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
    auto step = std::unique_ptr<CudaDeviceStep>(new CudaDeviceStep());
    step->device_ = options.device;
    step->config_ = model.config();
    step->has_river_ = river != nullptr;
    ESTUARY_ASSIGN_OR_RETURN(step->model_, cuda::DeviceModel::Create(model, river));
    int64_t kv_cache_bytes = options.kv_cache_bytes;
    if (options.gpu_memory_utilization > 0) {
      size_t free = 0, total = 0;
      ESTUARY_RETURN_IF_ERROR(cuda::CudaStatus(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
      ESTUARY_ASSIGN_OR_RETURN(kv_cache_bytes,
                               KvBytesForUtilization(options.gpu_memory_utilization,
                                                     static_cast<int64_t>(free),
                                                     static_cast<int64_t>(total)));
      ESTUARY_LOG(INFO) << "--gpu-memory-utilization " << options.gpu_memory_utilization
                        << ": " << (kv_cache_bytes >> 20) << " MiB of KV cache on CUDA device "
                        << options.device << " (" << (free >> 20) << " of " << (total >> 20)
                        << " MiB free after the weights)";
    }
    ESTUARY_ASSIGN_OR_RETURN(
        std::unique_ptr<KvPool> pool,
        KvPool::Create(KvLayout::FromConfig(model.config(), options.block_size),
                       kv_cache_bytes, 1, cuda::DeviceKvRegionAllocator()));
    step->pool_ = std::move(pool);
    cuda::DeviceDecoderOptions decoder;
    decoder.max_rows = options.max_rows;
    decoder.block_size = options.block_size;
    decoder.max_seq_len = model.config().max_seq_len;
    decoder.shared_pool = step->pool_.get();
    // No exit (every backbone layer is resident on the device): prefill chunks, on cuBLAS when
    // the weights are bf16.
    decoder.exits = false;
    ESTUARY_ASSIGN_OR_RETURN(step->no_exit_, cuda::DeviceDecoder::Create(*step->model_, decoder));
    decoder.exits = true;
    decoder.policy = options.policy;
    ESTUARY_ASSIGN_OR_RETURN(step->with_policy_,
                             cuda::DeviceDecoder::Create(*step->model_, decoder));
    step->vocab_ = static_cast<size_t>(model.config().vocab_size);
    return step;
  }

  ~CudaDeviceStep() override { cudaSetDevice(device_); }

  const LlamaConfig& config() const override { return config_; }
  int tp_size() const override { return 1; }
  bool has_river() const override { return has_river_; }
  bool argmax_in_outcome() const override { return true; }
  std::shared_ptr<KvPool> pool() override { return pool_; }

  absl::Status Forward(absl::Span<const BatchEntry> entries, absl::Span<SequenceKv* const> kvs,
                       const StepOptions& options, absl::Span<float> logits,
                       absl::Span<EntryOutcome> outcomes) override {
    if (kvs.size() != entries.size() || outcomes.size() != entries.size()) {
      return absl::InvalidArgumentError("one sequence and one outcome per entry");
    }
    for (const BatchEntry& entry : entries) {
      if (entry.logits_every_token || entry.start_layer > 0 || entry.layer_inputs != nullptr) {
        return absl::UnimplementedError(
            "the GPU step does not run lossless verification steps (every token's logits, "
            "resumed layers, saved layer inputs) yet");
      }
    }
    ESTUARY_RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    // use_river needs nothing here: the device model carries the river it was built with.
    cuda::DeviceDecoder& decoder = options.exit_policy ? *with_policy_ : *no_exit_;
    std::function<void(int layer)> on_layer_done;
    if (options.on_layer_done) {
      on_layer_done = [&options](int layer) { options.on_layer_done(0, layer); };
    }
    const size_t max_rows = static_cast<size_t>(decoder.max_rows());
    // Rows of all entries in order, cut into device steps of at most max_rows rows; an entry
    // longer than that spans several steps (its KV is written before the next one reads it).
    struct RowOrigin {
      size_t entry;
      bool last;  // the entry's last token: its result is the entry's
    };
    std::vector<cuda::DeviceStepRow> rows;
    std::vector<RowOrigin> origins;
    std::vector<size_t> logit_index(entries.size(), SIZE_MAX);
    size_t with_logits = 0;
    for (size_t e = 0; e < entries.size(); ++e) {
      if (entries[e].want_logits) logit_index[e] = with_logits++;
    }
    if (logits.size() != with_logits * vocab_) {
      return absl::InvalidArgumentError("logits must hold vocab floats per entry with logits");
    }
    std::vector<cuda::DeviceRowResult> results;
    auto flush = [&](bool final_run) -> absl::Status {
      if (rows.empty()) return absl::OkStatus();
      results.assign(rows.size(), {});
      // Entries' logits are in entry order, and an entry's last row is its only wanted one, so
      // this run's wanted rows land at the first of their entries' slots, back to back.
      size_t first_slot = SIZE_MAX, wanted = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!rows[i].want_logits) continue;
        if (wanted++ == 0) first_slot = logit_index[origins[i].entry];
      }
      const absl::Span<float> run_logits =
          wanted == 0 ? absl::Span<float>() : logits.subspan(first_slot * vocab_, wanted * vocab_);
      // Only the last run's layer events mean "every entry's KV of this layer is written".
      ESTUARY_RETURN_IF_ERROR(decoder.Run(rows, absl::MakeSpan(results), run_logits,
                                          final_run ? on_layer_done : nullptr));
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!origins[i].last) continue;
        outcomes[origins[i].entry].backbone_layers = results[i].backbone_layers;
        outcomes[origins[i].entry].argmax = results[i].next_token;
      }
      rows.clear();
      origins.clear();
      return absl::OkStatus();
    };
    for (size_t e = 0; e < entries.size(); ++e) {
      const BatchEntry& entry = entries[e];
      for (size_t t = 0; t < entry.tokens.size(); ++t) {
        if (rows.size() == max_rows) ESTUARY_RETURN_IF_ERROR(flush(/*final_run=*/false));
        const bool last = t + 1 == entry.tokens.size();
        rows.push_back({kvs[e], entry.tokens[t], entry.start_pos + static_cast<int32_t>(t),
                        entry.exit_threshold, last && entry.want_logits});
        origins.push_back({e, last});
      }
    }
    return flush(/*final_run=*/true);
  }

 private:
  CudaDeviceStep() = default;

  int device_ = 0;
  size_t vocab_ = 0;
  LlamaConfig config_;
  bool has_river_ = false;
  std::unique_ptr<cuda::DeviceModel> model_;
  // Shared by both decoders and by the engine's consumers. Its regions are freed when the last
  // holder lets go; the decoders only borrow it and go first.
  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<cuda::DeviceDecoder> no_exit_;
  std::unique_ptr<cuda::DeviceDecoder> with_policy_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepRunner>> CreateCudaDeviceStep(const LlamaModel& model,
                                                                 const River* river,
                                                                 const DeviceStepOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceStep> step,
                           CudaDeviceStep::Create(model, river, options));
  return step;
}

}  // namespace estuary
