#include "decode/bench_decode.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/common/worker_pool.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/forward_batch.h"
#include "core/model/generator.h"
#include "core/model/kv_cache.h"
#include "core/model/paged_kv_view.h"
#include "core/model/sharded_model.h"
#include "core/sampling/sampler.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

// Alternating runs of the lossless row and its full-depth baseline (pairs; the median counts).
constexpr int kLosslessTimingPairs = 3;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The acceptance rates the lossless speedup model is evaluated at.
constexpr double kModelAcceptances[] = {0.7, 0.8, 0.9, 0.95, 1.0};

struct Mode {
  const char* name;
  bool use_river;
  int max_backbone_layers;  // forced exit (-1: none)
};

// The decode sequences of one batch size: their KV pages, views and random prompts.
struct BatchState {
  std::unique_ptr<KvPool> pool;
  std::vector<SequenceKv> sequences;
  std::vector<PagedKvView> views;
  std::vector<std::vector<int32_t>> prompts;
};

int64_t KvBytesPerPosition(const LlamaConfig& c) {
  return int64_t{2} * c.n_layers * c.n_kv_heads * c.head_dim * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<BatchState> MakeBatch(const LlamaConfig& c, int batch, int positions) {
  BatchState state;
  ESTUARY_ASSIGN_OR_RETURN(
      state.pool, KvPool::Create(KvLayout::FromConfig(c, 16),
                                 (int64_t{batch} * (positions + 16)) * KvBytesPerPosition(c)));
  state.sequences.reserve(static_cast<size_t>(batch));
  state.views.reserve(static_cast<size_t>(batch));
  state.prompts.resize(static_cast<size_t>(batch));
  return state;
}

// Fills `state` with `batch` sequences and prefills their prompts (full backbone, not timed);
// every mode then decodes from there.
absl::Status PrefillBatch(const LlamaModel& model, const BenchDecodeOptions& options, int batch,
                          int positions, const kernels::cpu::MatMulOptions& matmul,
                          std::mt19937& rng, BatchState& state) {
  const LlamaConfig& c = model.config();
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  for (int b = 0; b < batch; ++b) {
    state.sequences.emplace_back(state.pool.get());
    ESTUARY_RETURN_IF_ERROR(state.sequences.back().Reserve(positions));
    state.views.emplace_back(&state.sequences.back());
    for (int t = 0; t < options.prompt_len; ++t) state.prompts[b].push_back(token(rng));
  }
  std::vector<BatchEntry> entries(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    entries[b].tokens = state.prompts[b];
    entries[b].kv = &state.views[b];
  }
  ForwardOptions forward;
  forward.matmul = matmul;
  std::vector<float> logits(static_cast<size_t>(batch) * static_cast<size_t>(c.vocab_size));
  std::vector<EntryOutcome> outcomes(static_cast<size_t>(batch));
  return ForwardBatch(model, entries, forward, absl::MakeSpan(logits), absl::MakeSpan(outcomes));
}

// Times options.steps decode steps of every mode (after one warm-up step each) on the
// prefilled batch, interleaved: each step runs every mode once, in an order that rotates from
// step to step, so that a shared machine's drift over the bench slows every mode alike; a
// mode's step time is the median of its steps. The modes rewrite the same positions.
absl::StatusOr<std::vector<BenchDecodeRow>> TimeModes(const LlamaModel& model, const River& river,
                                                      const BenchDecodeOptions& options,
                                                      absl::Span<const Mode> modes, int batch,
                                                      const kernels::cpu::MatMulOptions& matmul,
                                                      BatchState& state) {
  const LlamaConfig& c = model.config();
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  struct Run {
    ForwardOptions forward;
    std::vector<int32_t> next;
    std::vector<EntryOutcome> outcomes;
    std::vector<double> step_seconds;
  };
  std::vector<Run> runs(modes.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    Run& run = runs[m];
    run.forward.matmul = matmul;
    if (modes[m].use_river) {
      run.forward.river = &river;
      run.forward.policy.max_backbone_layers = modes[m].max_backbone_layers;
      run.forward.policy.min_backbone_layers = std::min(1, modes[m].max_backbone_layers);
    }
    run.next.assign(static_cast<size_t>(batch), 1);
    run.outcomes.resize(static_cast<size_t>(batch));
  }
  std::vector<float> logits(static_cast<size_t>(batch) * vocab);
  for (int step = 0; step <= options.steps; ++step) {  // step 0 warms up
    for (size_t i = 0; i < modes.size(); ++i) {
      Run& run = runs[(i + static_cast<size_t>(step)) % modes.size()];
      std::vector<BatchEntry> entries(static_cast<size_t>(batch));
      for (int b = 0; b < batch; ++b) {
        entries[b].tokens = absl::MakeConstSpan(&run.next[b], 1);
        entries[b].start_pos = options.prompt_len + step;
        entries[b].kv = &state.views[b];
        entries[b].exit_threshold = 2.0f;  // no early exit: only the forced one
      }
      const absl::Time start = absl::Now();
      ESTUARY_RETURN_IF_ERROR(ForwardBatch(model, entries, run.forward, absl::MakeSpan(logits),
                                           absl::MakeSpan(run.outcomes)));
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      for (int b = 0; b < batch; ++b) {
        run.next[b] = Argmax(absl::MakeConstSpan(logits.data() + b * vocab, vocab));
      }
      if (step > 0) run.step_seconds.push_back(seconds);
    }
  }
  std::vector<BenchDecodeRow> rows;
  for (size_t m = 0; m < modes.size(); ++m) {
    BenchDecodeRow row;
    row.mode = modes[m].name;
    row.batch = batch;
    row.backbone_layers = runs[m].outcomes[0].backbone_layers;
    const double step_seconds = Median(runs[m].step_seconds);
    const double mean_positions = options.prompt_len + 1 + options.steps / 2.0;
    const double weight_bytes =
        static_cast<double>(DecodeStepWeightBytes(model, &river, row.backbone_layers));
    const double step_bytes =
        weight_bytes + batch * mean_positions * static_cast<double>(KvBytesPerPosition(c));
    row.tokens_per_second = batch / step_seconds;
    row.bytes_per_token = step_bytes / batch;
    row.effective_bytes_per_second = weight_bytes / step_seconds;
    rows.push_back(row);
  }
  return rows;
}

// Times options.steps verification passes (after one warm-up pass) on the prefilled batch, as
// GenerateLossless runs them (batch-invariant kernels): per sequence k tokens entering layer
// exit_after with logits for each, then the bonus row (one token through every layer). The
// positions are rewritten by every pass.
absl::StatusOr<BenchDecodeRow> TimeVerify(const LlamaModel& model,
                                          const BenchDecodeOptions& options, int batch,
                                          WorkerPool& pool, BatchState& state) {
  const LlamaConfig& c = model.config();
  const int k = options.lossless->max_draft_tokens;
  std::vector<int32_t> tokens(static_cast<size_t>(k), 1);
  // The residual stream entering the layer: any finite rows time the same; the embedding of
  // token 1 keeps the norms away from zero.
  std::vector<float> hidden(static_cast<size_t>(k) * c.dim);
  ESTUARY_RETURN_IF_ERROR(kernels::cpu::Embedding(model.weights().embedding, tokens, hidden.data()));
  ForwardOptions forward;
  forward.matmul = {kernels::cpu::MatMulPath::kBatchInvariant, &pool};
  std::vector<float> logits(static_cast<size_t>(batch) * (k + 1) *
                            static_cast<size_t>(c.vocab_size));
  std::vector<EntryOutcome> outcomes(static_cast<size_t>(batch) * 2);
  std::vector<BatchEntry> entries;
  for (int b = 0; b < batch; ++b) {
    BatchEntry drafts;
    drafts.tokens = tokens;
    drafts.start_pos = options.prompt_len;
    drafts.kv = &state.views[b];
    drafts.logits_every_token = true;
    if (options.exit_after > 0) {
      drafts.start_layer = std::min(options.exit_after, c.n_layers - 1);
      drafts.start_hidden = hidden.data();
    }
    entries.push_back(drafts);
    BatchEntry bonus;
    bonus.tokens = absl::MakeConstSpan(tokens.data(), 1);
    bonus.start_pos = options.prompt_len + k;
    bonus.kv = &state.views[b];
    entries.push_back(bonus);
  }
  absl::Duration timed;
  for (int step = 0; step <= options.steps; ++step) {  // step 0 warms up
    const absl::Time start = absl::Now();
    ESTUARY_RETURN_IF_ERROR(ForwardBatch(model, entries, forward, absl::MakeSpan(logits),
                                         absl::MakeSpan(outcomes)));
    if (step > 0) timed += absl::Now() - start;
  }
  BenchDecodeRow row;
  row.mode = "verify";
  row.batch = batch;
  row.backbone_layers = c.n_layers - entries[0].start_layer;
  const double step_seconds = absl::ToDoubleSeconds(timed) / options.steps;
  row.tokens_per_second = batch * k / step_seconds;
  return row;
}

// Full-depth greedy decoding of `requests` together, the baseline of the lossless row in the
// same harness: one prefill pass, then one forward step over every sequence per token (the
// fastest kernels, as the engine decodes). Decode seconds, after the first token.
absl::StatusOr<double> FullDepthDecodeSeconds(ShardedModel& sharded,
                                              const std::vector<GenerateRequest>& requests) {
  const LlamaConfig& c = sharded.config();
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const size_t batch = requests.size();
  std::vector<std::vector<ContiguousKvCache>> caches(batch);  // [sequence][rank]
  for (size_t b = 0; b < batch; ++b) {
    for (int r = 0; r < sharded.tp_size(); ++r) {
      ESTUARY_ASSIGN_OR_RETURN(
          ContiguousKvCache cache,
          ContiguousKvCache::Create(c, GenerateCacheCapacity(c, requests[b]), sharded.tp_size()));
      caches[b].push_back(std::move(cache));
    }
  }
  const ShardedModel::KvResolver kv = [&](int rank, size_t e) -> KvView* {
    return &caches[e][static_cast<size_t>(rank)];
  };
  std::vector<BatchEntry> entries(batch);
  for (size_t b = 0; b < batch; ++b) entries[b].tokens = requests[b].prompt_ids;
  std::vector<float> logits(batch * vocab);
  std::vector<EntryOutcome> outcomes(batch);
  ESTUARY_RETURN_IF_ERROR(sharded.Forward(entries, kv, {}, absl::MakeSpan(logits),
                                          absl::MakeSpan(outcomes)));
  std::vector<int32_t> next(batch);
  const absl::Time start = absl::Now();
  for (int step = 1; step < requests[0].max_tokens; ++step) {
    for (size_t b = 0; b < batch; ++b) {
      next[b] = Argmax(absl::MakeConstSpan(logits.data() + b * vocab, vocab));
      entries[b].tokens = absl::MakeConstSpan(&next[b], 1);
      entries[b].start_pos = static_cast<int>(requests[b].prompt_ids.size()) + step - 1;
    }
    ESTUARY_RETURN_IF_ERROR(sharded.Forward(entries, kv, {}, absl::MakeSpan(logits),
                                            absl::MakeSpan(outcomes)));
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// GenerateLosslessBatch end to end on `batch` random prompts against full-depth decoding of the
// same prompts, in kLosslessTimingPairs alternating pairs: two rows, "full-gen" (the baseline)
// and "lossless" (with acceptance, tokens per verification and the median of the pairs'
// speedups: a shared machine's speed drifts over a bench, and pairing keeps the ratio honest).
// Each row's tokens/s is from its median run.
absl::StatusOr<std::vector<BenchDecodeRow>> TimeLossless(ShardedModel& sharded,
                                                         const BenchDecodeOptions& options,
                                                         int batch, std::mt19937& rng) {
  const LlamaConfig& c = sharded.config();
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  std::vector<GenerateRequest> requests(static_cast<size_t>(batch));
  for (GenerateRequest& request : requests) {
    for (int t = 0; t < options.prompt_len; ++t) request.prompt_ids.push_back(token(rng));
    request.max_tokens = options.lossless_tokens;
    request.ignore_eos = true;
    request.sampling.temperature = 0.0f;
  }
  std::vector<double> full_seconds, lossless_seconds, speedups;
  std::vector<GenerateResult> results;
  for (int pair = 0; pair < kLosslessTimingPairs; ++pair) {
    ESTUARY_ASSIGN_OR_RETURN(const double full, FullDepthDecodeSeconds(sharded, requests));
    ESTUARY_ASSIGN_OR_RETURN(results, GenerateLosslessBatch(sharded, requests, *options.lossless));
    double lossless = 0;
    for (const GenerateResult& r : results) lossless = std::max(lossless, r.decode_seconds);
    full_seconds.push_back(full);
    lossless_seconds.push_back(lossless);
    speedups.push_back(full / std::max(lossless, 1e-12));
  }
  const double decoded_tokens = static_cast<double>(batch) * (options.lossless_tokens - 1);
  BenchDecodeRow full_row;
  full_row.mode = "full-gen";
  full_row.batch = batch;
  full_row.backbone_layers = c.n_layers;
  full_row.tokens_per_second = decoded_tokens / Median(full_seconds);
  int64_t drafts = 0, accepted = 0, verifications = 0;
  for (const GenerateResult& r : results) {
    drafts += r.draft_tokens;
    accepted += r.accepted_tokens;
    verifications += r.verifications;
  }
  BenchDecodeRow row;
  row.mode = "lossless";
  row.batch = batch;
  row.backbone_layers = options.exit_after;
  row.tokens_per_second = decoded_tokens / Median(lossless_seconds);
  row.paired_speedup = Median(speedups);
  row.acceptance = drafts > 0 ? static_cast<double>(accepted) / static_cast<double>(drafts) : 0;
  row.tokens_per_verification =
      verifications > 0 ? decoded_tokens / static_cast<double>(verifications) : 0;
  return std::vector<BenchDecodeRow>{full_row, row};
}

const BenchDecodeRow* FindRow(const std::vector<BenchDecodeRow>& rows, const std::string& mode,
                              int batch) {
  for (const BenchDecodeRow& r : rows) {
    if (r.mode == mode && r.batch == batch) return &r;
  }
  return nullptr;
}

// tokens/s of `mode` over full depth's at `batch`; 0 without both rows. The lossless row's is
// its paired speedup over its own harness's full depth ("full-gen"), every other row's is over
// the forward-step "full".
double SpeedupOverFull(const std::vector<BenchDecodeRow>& rows, const std::string& mode,
                       int batch) {
  const BenchDecodeRow* row = FindRow(rows, mode, batch);
  if (row != nullptr && mode == "lossless") return row->paired_speedup;
  const BenchDecodeRow* full = FindRow(rows, "full", batch);
  if (row == nullptr || full == nullptr || full->tokens_per_second <= 0) return 0;
  return row->tokens_per_second / full->tokens_per_second;
}

nlohmann::ordered_json VariantJson(const kernels::cpu::StreamReadVariant& v) {
  return {{"threads", v.threads},
          {"huge_pages", v.huge_pages},
          {"prefetch_bytes", v.prefetch_bytes},
          {"gbytes_per_second", v.bytes_per_second / 1e9}};
}

std::string VariantLabel(const kernels::cpu::StreamReadVariant& v) {
  return absl::StrFormat("%s pages, %s", v.huge_pages ? "2 MiB" : "4 KiB",
                         v.prefetch_bytes > 0 ? absl::StrFormat("prefetch %zu B", v.prefetch_bytes)
                                              : std::string("no prefetch"));
}

std::string HugeFraction(double fraction) {
  return fraction < 0 ? std::string("unknown") : absl::StrFormat("%.0f%%", 100 * fraction);
}

// Step time of `mode` at `batch` over full depth's: the inverse tokens/s ratio per step.
double StepCost(const std::vector<BenchDecodeRow>& rows, const std::string& mode, int batch,
                int tokens_per_sequence) {
  const BenchDecodeRow* row = FindRow(rows, mode, batch);
  const BenchDecodeRow* full = FindRow(rows, "full", batch);
  if (row == nullptr || full == nullptr || row->tokens_per_second <= 0) return 0;
  return full->tokens_per_second * tokens_per_sequence / row->tokens_per_second;
}

}  // namespace

double LosslessSpeedupModel::Predict(double acceptance) const {
  const double k = draft_tokens;
  const double tokens =
      acceptance >= 1.0 ? k + 1 : (1.0 - std::pow(acceptance, k + 1)) / (1.0 - acceptance);
  const double cost = k * river_cost + verify_cost;
  return cost > 0 ? tokens / cost : 0;
}

std::vector<BenchDecodeTarget> Issue18DecodeTargets(const std::vector<BenchDecodeRow>& rows) {
  std::vector<BenchDecodeTarget> targets;
  if (const BenchDecodeRow* full = FindRow(rows, "full", 1)) {
    targets.push_back({"full b1 effective", "GB/s", 30.0, full->effective_bytes_per_second / 1e9});
  }
  struct Ratio {
    const char* mode;
    int batch;
    double target;
  };
  for (const Ratio& r : {Ratio{"river", 1, 1.9}, Ratio{"river", 4, 1.4}, Ratio{"river", 16, 1.2},
                         Ratio{"int4", 1, 2.7}, Ratio{"int4", 4, 1.5}}) {
    const double measured = SpeedupOverFull(rows, r.mode, r.batch);
    if (measured <= 0) continue;  // that batch was not run
    targets.push_back(
        {absl::StrFormat("%s / full b%d", r.mode, r.batch), "x full", r.target, measured});
  }
  return targets;
}

absl::StatusOr<BenchDecodeReport> RunBenchDecode(const LlamaModel& model, const River& river,
                                                 const BenchDecodeOptions& options) {
  const LlamaConfig& c = model.config();
  if (options.exit_after < 0 || options.exit_after > c.n_layers) {
    return absl::InvalidArgumentError(absl::StrFormat("--exit-after = %d must be in [0, %d]",
                                                      options.exit_after, c.n_layers));
  }
  if (options.steps < 1 || options.prompt_len < 1 ||
      options.prompt_len + options.steps + 1 > c.max_seq_len) {
    return absl::InvalidArgumentError("prompt length and steps must fit the context");
  }
  for (int batch : options.batches) {
    if (batch < 1) return absl::InvalidArgumentError("batch sizes must be >= 1");
  }
  BenchDecodeReport report;
  report.threads = options.threads > 0
                       ? options.threads
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  report.weight_dtype = std::string(DTypeName(model.weights().lm_head.dtype()));
  // The ceiling is measured before the decode (its buffer freed before the model runs) and again
  // after it, each variant keeping its faster figure: on a shared machine a neighbour's burst
  // during one measurement must not lower the ceiling the rows are judged against.
  kernels::cpu::StreamReadOptions stream;
  stream.bytes = options.stream_bytes;
  stream.repetitions = options.stream_repetitions;
  stream.max_threads = report.threads;
  const kernels::cpu::StreamReadResult before = kernels::cpu::MeasureStreamRead(stream);

  WorkerPool pool(report.threads);  // the rank's pool, as ShardedModel gives each rank
  const kernels::cpu::MatMulOptions matmul{kernels::cpu::MatMulPath::kFastest, &pool};
  const Mode modes[] = {{"full", false, -1},
                        {"river", true, options.exit_after},
                        {"int4", true, 0}};
  std::mt19937 rng(7);
  std::unique_ptr<ShardedModel> sharded;
  if (options.lossless) {
    ESTUARY_RETURN_IF_ERROR(options.lossless->Validate(c.n_layers));
    if (options.lossless_tokens < 2 || options.prompt_len + options.lossless_tokens > c.max_seq_len) {
      return absl::InvalidArgumentError("lossless: prompt length and new tokens must fit the context");
    }
    sharded = ShardedModel::Borrow(model, &river, report.threads);
  }
  const int verify_tokens = options.lossless ? options.lossless->max_draft_tokens : 0;
  for (int batch : options.batches) {
    const int positions = options.prompt_len + std::max(options.steps, verify_tokens + 1) + 2;
    ESTUARY_ASSIGN_OR_RETURN(BatchState state, MakeBatch(c, batch, positions));
    ESTUARY_RETURN_IF_ERROR(PrefillBatch(model, options, batch, positions, matmul, rng, state));
    ESTUARY_ASSIGN_OR_RETURN(std::vector<BenchDecodeRow> rows,
                             TimeModes(model, river, options, modes, batch, matmul, state));
    report.rows.insert(report.rows.end(), rows.begin(), rows.end());
    if (!options.lossless) continue;
    ESTUARY_ASSIGN_OR_RETURN(BenchDecodeRow verify, TimeVerify(model, options, batch, pool, state));
    report.rows.push_back(std::move(verify));
    ESTUARY_ASSIGN_OR_RETURN(std::vector<BenchDecodeRow> lossless,
                             TimeLossless(*sharded, options, batch, rng));
    report.rows.insert(report.rows.end(), lossless.begin(), lossless.end());
    LosslessSpeedupModel speedup_model;
    speedup_model.batch = batch;
    speedup_model.draft_tokens = verify_tokens;
    speedup_model.river_cost = StepCost(report.rows, "river", batch, 1);
    speedup_model.verify_cost = StepCost(report.rows, "verify", batch, verify_tokens);
    report.lossless_models.push_back(speedup_model);
  }
  report.stream = kernels::cpu::FasterOf(before, kernels::cpu::MeasureStreamRead(stream));
  const double ceiling = report.stream.ceiling_bytes_per_second();
  for (BenchDecodeRow& row : report.rows) {
    row.ceiling_fraction = ceiling > 0 ? row.effective_bytes_per_second / ceiling : 0;
  }
  report.targets = Issue18DecodeTargets(report.rows);
  if (const BenchDecodeRow* lossless = FindRow(report.rows, "lossless", 1)) {
    report.targets.push_back({absl::StrFormat("lossless / full-gen b1 (acceptance %.2f)",
                                              lossless->acceptance),
                              "x full", 1.5, SpeedupOverFull(report.rows, "lossless", 1)});
  }
  return report;
}

std::string BenchDecodeJson(const BenchDecodeReport& report) {
  const kernels::cpu::StreamReadResult& s = report.stream;
  nlohmann::ordered_json out;
  out["threads"] = report.threads;
  out["weight_dtype"] = report.weight_dtype;
  out["stream_read_gbytes_per_second"] = s.ceiling_bytes_per_second() / 1e9;  // the ceiling
  out["ceiling_threads"] = s.ceiling() != nullptr ? s.ceiling()->threads : 0;
  nlohmann::ordered_json stream;
  stream["bytes"] = s.bytes;
  stream["one_thread_gbytes_per_second"] = s.best.empty() ? 0.0 : s.best[0].bytes_per_second / 1e9;
  stream["huge_fraction_advised"] = s.huge_fraction_advised;
  stream["huge_fraction_not_advised"] = s.huge_fraction_not_advised;
  stream["best"] = nlohmann::ordered_json::array();
  for (const auto& v : s.best) stream["best"].push_back(VariantJson(v));
  stream["variants"] = nlohmann::ordered_json::array();
  for (const auto& v : s.variants) stream["variants"].push_back(VariantJson(v));
  out["stream_read"] = stream;
  out["rows"] = nlohmann::ordered_json::array();
  for (const BenchDecodeRow& r : report.rows) {
    out["rows"].push_back({{"mode", r.mode},
                           {"batch", r.batch},
                           {"backbone_layers", r.backbone_layers},
                           {"tokens_per_second", r.tokens_per_second},
                           {"vs_full", SpeedupOverFull(report.rows, r.mode, r.batch)},
                           {"bytes_per_token", r.bytes_per_token},
                           {"effective_gbytes_per_second", r.effective_bytes_per_second / 1e9},
                           {"ceiling_fraction", r.ceiling_fraction}});
    if (r.mode == "lossless") {
      out["rows"].back()["acceptance"] = r.acceptance;
      out["rows"].back()["tokens_per_verification"] = r.tokens_per_verification;
    }
  }
  out["lossless_models"] = nlohmann::ordered_json::array();
  for (const LosslessSpeedupModel& m : report.lossless_models) {
    nlohmann::ordered_json predicted;
    for (double a : kModelAcceptances) predicted[absl::StrFormat("%.2f", a)] = m.Predict(a);
    out["lossless_models"].push_back({{"batch", m.batch},
                                      {"draft_tokens", m.draft_tokens},
                                      {"river_cost", m.river_cost},
                                      {"verify_cost", m.verify_cost},
                                      {"predicted_speedup", predicted}});
  }
  out["targets"] = nlohmann::ordered_json::array();
  for (const BenchDecodeTarget& t : report.targets) {
    out["targets"].push_back({{"name", t.name},
                              {"unit", t.unit},
                              {"target", t.target},
                              {"measured", t.measured},
                              {"meets", t.meets()}});
  }
  return out.dump();
}

std::string BenchDecodeTable(const BenchDecodeReport& report) {
  const kernels::cpu::StreamReadResult& s = report.stream;
  std::string table = absl::StrFormat(
      "read ceiling (same run, %.2f GiB buffer, best pass before and after the decode): "
      "%.2f GB/s at %d of %d threads\n",
      s.bytes / double(size_t{1} << 30), s.ceiling_bytes_per_second() / 1e9,
      s.ceiling() != nullptr ? s.ceiling()->threads : 0, report.threads);
  for (const auto& v : s.best) {
    absl::StrAppendFormat(&table, "  %d thread%s: %6.2f GB/s (%s)\n", v.threads,
                          v.threads == 1 ? " " : "s", v.bytes_per_second / 1e9, VariantLabel(v));
  }
  absl::StrAppendFormat(&table, "  2 MiB pages granted: %s advised, %s not advised\n",
                        HugeFraction(s.huge_fraction_advised),
                        HugeFraction(s.huge_fraction_not_advised));
  absl::StrAppendFormat(&table, "decode on %d threads, %s weights\n", report.threads,
                        report.weight_dtype);
  absl::StrAppendFormat(&table, "%-8s %6s %9s %12s %9s %11s %10s %9s\n", "mode", "batch",
                        "backbone", "tokens/s", "vs full", "MB/token", "eff GB/s", "ceiling");
  for (const BenchDecodeRow& r : report.rows) {
    absl::StrAppendFormat(&table, "%-8s %6d %9d %12.2f %8.2fx %11.1f %10.2f %9.3f\n", r.mode,
                          r.batch, r.backbone_layers, r.tokens_per_second,
                          SpeedupOverFull(report.rows, r.mode, r.batch), r.bytes_per_token / 1e6,
                          r.effective_bytes_per_second / 1e9, r.ceiling_fraction);
  }
  for (const BenchDecodeRow& r : report.rows) {
    if (r.mode != "lossless") continue;
    absl::StrAppendFormat(&table, "lossless b%d: acceptance %.3f, %.2f tokens per verification\n",
                          r.batch, r.acceptance, r.tokens_per_verification);
  }
  for (const LosslessSpeedupModel& m : report.lossless_models) {
    absl::StrAppendFormat(&table,
                          "lossless model b%d (k %d, river step %.3f, verification %.3f of a full "
                          "step): predicted speedup",
                          m.batch, m.draft_tokens, m.river_cost, m.verify_cost);
    for (double a : kModelAcceptances) {
      absl::StrAppendFormat(&table, "  a=%.2f %.2fx", a, m.Predict(a));
    }
    table += "\n";
  }
  table += "targets:\n";
  for (const BenchDecodeTarget& t : report.targets) {
    absl::StrAppendFormat(&table, "  %-36s >= %5.2f %-6s measured %6.2f  %s\n", t.name, t.target,
                          t.unit, t.measured, t.meets() ? "meets" : "misses");
  }
  return table;
}

}  // namespace estuary
