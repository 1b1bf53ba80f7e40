#include "decode/bench_decode.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/forward_batch.h"
#include "core/model/paged_kv_view.h"
#include "core/sampling/sampler.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

struct Mode {
  const char* name;
  bool use_river;
  int max_backbone_layers;  // forced exit (-1: none)
};

}  // namespace

absl::StatusOr<std::vector<BenchDecodeRow>> RunBenchDecode(const LlamaModel& model,
                                                           const River& river,
                                                           const BenchDecodeOptions& options,
                                                           double stream_bytes_per_second) {
  const LlamaConfig& c = model.config();
  if (options.exit_after < 0 || options.exit_after > c.n_layers) {
    return absl::InvalidArgumentError(absl::StrFormat("--exit-after = %d must be in [0, %d]",
                                                      options.exit_after, c.n_layers));
  }
  if (options.steps < 1 || options.prompt_len < 1 ||
      options.prompt_len + options.steps + 1 > c.max_seq_len) {
    return absl::InvalidArgumentError("prompt length and steps must fit the context");
  }
  const Mode modes[] = {{"full", false, -1},
                        {"river", true, options.exit_after},
                        {"int4", true, 0}};
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const int64_t kv_bytes_per_position =
      int64_t{2} * c.n_layers * c.n_kv_heads * c.head_dim * static_cast<int64_t>(sizeof(float));
  std::vector<BenchDecodeRow> rows;
  std::mt19937 rng(7);

  for (int batch : options.batches) {
    if (batch < 1) return absl::InvalidArgumentError("batch sizes must be >= 1");
    const int positions = options.prompt_len + options.steps + 2;
    ESTUARY_ASSIGN_OR_RETURN(
        std::unique_ptr<KvPool> pool,
        KvPool::Create(KvLayout::FromConfig(c, 16),
                       (int64_t{batch} * (positions + 16)) * kv_bytes_per_position));
    std::vector<SequenceKv> sequences;
    sequences.reserve(static_cast<size_t>(batch));
    std::vector<PagedKvView> views;
    views.reserve(static_cast<size_t>(batch));
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
    std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
    for (int b = 0; b < batch; ++b) {
      sequences.emplace_back(pool.get());
      ESTUARY_RETURN_IF_ERROR(sequences.back().Reserve(positions));
      views.emplace_back(&sequences.back());
      for (int t = 0; t < options.prompt_len; ++t) prompts[b].push_back(token(rng));
    }
    // Prefill every sequence once (full backbone, not timed); each mode then decodes from there.
    {
      std::vector<BatchEntry> entries(static_cast<size_t>(batch));
      for (int b = 0; b < batch; ++b) {
        entries[b].tokens = prompts[b];
        entries[b].kv = &views[b];
      }
      std::vector<float> logits(static_cast<size_t>(batch) * vocab);
      std::vector<EntryOutcome> outcomes(static_cast<size_t>(batch));
      ESTUARY_RETURN_IF_ERROR(ForwardBatch(model, entries, ForwardOptions(),
                                           absl::MakeSpan(logits), absl::MakeSpan(outcomes)));
    }

    for (const Mode& mode : modes) {
      ForwardOptions forward;
      if (mode.use_river) {
        forward.river = &river;
        forward.policy.max_backbone_layers = mode.max_backbone_layers;
        forward.policy.min_backbone_layers = std::min(1, mode.max_backbone_layers);
      }
      std::vector<int32_t> next(static_cast<size_t>(batch), 1);
      std::vector<float> logits(static_cast<size_t>(batch) * vocab);
      std::vector<EntryOutcome> outcomes(static_cast<size_t>(batch));
      absl::Duration timed;
      for (int step = 0; step <= options.steps; ++step) {  // step 0 warms up
        std::vector<BatchEntry> entries(static_cast<size_t>(batch));
        for (int b = 0; b < batch; ++b) {
          entries[b].tokens = absl::MakeConstSpan(&next[b], 1);
          entries[b].start_pos = options.prompt_len + step;
          entries[b].kv = &views[b];
          entries[b].exit_threshold = 2.0f;  // no early exit: only the forced one
        }
        const absl::Time start = absl::Now();
        ESTUARY_RETURN_IF_ERROR(ForwardBatch(model, entries, forward, absl::MakeSpan(logits),
                                             absl::MakeSpan(outcomes)));
        for (int b = 0; b < batch; ++b) {
          next[b] = Argmax(absl::MakeConstSpan(logits.data() + b * vocab, vocab));
        }
        if (step > 0) timed += absl::Now() - start;
      }
      const int backbone = outcomes[0].backbone_layers;
      const double step_seconds = absl::ToDoubleSeconds(timed) / options.steps;
      const double mean_positions = options.prompt_len + 1 + options.steps / 2.0;
      const double step_bytes =
          static_cast<double>(DecodeStepWeightBytes(model, &river, backbone)) +
          batch * mean_positions * static_cast<double>(kv_bytes_per_position);
      BenchDecodeRow row;
      row.mode = mode.name;
      row.batch = batch;
      row.tokens_per_second = batch / step_seconds;
      row.bytes_per_token = step_bytes / batch;
      row.roofline_fraction =
          stream_bytes_per_second > 0 ? step_bytes / step_seconds / stream_bytes_per_second : 0;
      rows.push_back(row);
    }
  }
  return rows;
}

std::string BenchDecodeJson(const std::vector<BenchDecodeRow>& rows, double stream_gbps) {
  nlohmann::ordered_json out;
  out["stream_read_gbytes_per_second"] = stream_gbps;
  out["rows"] = nlohmann::ordered_json::array();
  for (const BenchDecodeRow& r : rows) {
    out["rows"].push_back({{"mode", r.mode},
                           {"batch", r.batch},
                           {"tokens_per_second", r.tokens_per_second},
                           {"bytes_per_token", r.bytes_per_token},
                           {"roofline_fraction", r.roofline_fraction}});
  }
  return out.dump();
}

std::string BenchDecodeTable(const std::vector<BenchDecodeRow>& rows, double stream_gbps) {
  std::string table =
      absl::StrFormat("streaming read: %.2f GB/s (same run)\n%-6s %6s %12s %10s %14s %9s\n",
                      stream_gbps, "mode", "batch", "tokens/s", "vs full", "MB/token",
                      "roofline");
  for (const BenchDecodeRow& r : rows) {
    double full = 0;
    for (const BenchDecodeRow& f : rows) {
      if (f.mode == "full" && f.batch == r.batch) full = f.tokens_per_second;
    }
    absl::StrAppendFormat(&table, "%-6s %6d %12.2f %9.2fx %14.1f %9.3f\n", r.mode, r.batch,
                          r.tokens_per_second, full > 0 ? r.tokens_per_second / full : 0.0,
                          r.bytes_per_token / 1e6, r.roofline_fraction);
  }
  return table;
}

}  // namespace estuary
