#include "decode/eval_exit.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/forward_batch.h"
#include "core/model/generator.h"
#include "core/model/kv_cache.h"
#include "nlohmann/json.hpp"

namespace estuary {
namespace {

// -log softmax(logits)[target], in double.
double Nll(absl::Span<const float> logits, int32_t target) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  return std::log(sum) - (static_cast<double>(logits[static_cast<size_t>(target)]) - max_logit);
}

// For every layer a river token ran: the cosine between the K (and V) the river wrote and the
// K (and V) the backbone layer writes for the same normalized input.
class KvFidelityProbe final : public ForwardProbe {
 public:
  explicit KvFidelityProbe(const LlamaModel& model)
      : model_(model),
        k_sum_(static_cast<size_t>(model.config().n_layers)),
        v_sum_(k_sum_.size()),
        count_(k_sum_.size()) {}

  void OnRiverLayer(int layer, int entry, int n_tokens, int start_pos, const float* normed,
                    const float* k, const float* v) override {
    const LlamaConfig& c = model_.config();
    const LlamaLayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
    const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
    std::vector<float> kb(n_tokens * kv_dim), vb(n_tokens * kv_dim);
    if (!kernels::cpu::MatMul(w.wk, normed, n_tokens, kb.data()).ok() ||
        !kernels::cpu::MatMul(w.wv, normed, n_tokens, vb.data()).ok()) {
      return;
    }
    for (int t = 0; t < n_tokens; ++t) {
      kernels::cpu::ApplyRope(kb.data() + t * kv_dim, c.n_kv_heads, c.head_dim, start_pos + t,
                              model_.rope_inv_freq(), c.rope_style);
      const size_t l = static_cast<size_t>(layer);
      k_sum_[l] += kernels::cpu::CosineSimilarity(k + t * kv_dim, kb.data() + t * kv_dim, kv_dim);
      v_sum_[l] += kernels::cpu::CosineSimilarity(v + t * kv_dim, vb.data() + t * kv_dim, kv_dim);
      ++count_[l];
    }
  }

  // Lowest per-layer mean over K and V; 1 when no layer ran on the river.
  double MinMeanCosine() const {
    double lowest = 1.0;
    for (size_t l = 0; l < count_.size(); ++l) {
      if (count_[l] == 0) continue;
      lowest = std::min({lowest, k_sum_[l] / count_[l], v_sum_[l] / count_[l]});
    }
    return lowest;
  }

 private:
  const LlamaModel& model_;
  std::vector<double> k_sum_, v_sum_;
  std::vector<int64_t> count_;
};

struct Continuation {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;  // the full model's greedy continuation
};

// Per-mode accumulators over every prompt.
struct ModeTotals {
  int64_t tokens = 0, exited = 0, agreed = 0;
  double backbone_layers = 0, nll = 0, bytes = 0;
  absl::Duration decode_time;
};

// Teacher-forces `c` through the model: prompt on the full backbone, then one decode step per
// continuation token, predicting the next one. `river` null = full depth.
absl::Status TeacherForce(const LlamaModel& model, const River* river, const ExitPolicy& policy,
                          float tau, const Continuation& c, ForwardProbe* probe,
                          ModeTotals& totals) {
  const LlamaConfig& config = model.config();
  const int total = static_cast<int>(c.prompt.size() + c.tokens.size());
  ESTUARY_ASSIGN_OR_RETURN(ContiguousKvCache cache, ContiguousKvCache::Create(config, total));
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  ESTUARY_RETURN_IF_ERROR(model.Forward(c.prompt, 0, cache, absl::MakeSpan(logits)));

  ForwardOptions options;
  options.river = river;
  options.policy = policy;
  options.probe = probe;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i + 1 < c.tokens.size(); ++i) {
    BatchEntry entry;
    entry.tokens = absl::MakeConstSpan(&c.tokens[i], 1);
    entry.start_pos = static_cast<int>(c.prompt.size() + i);
    entry.kv = &cache;
    entry.exit_threshold = tau;
    EntryOutcome outcome;
    ESTUARY_RETURN_IF_ERROR(ForwardBatch(model, absl::MakeConstSpan(&entry, 1), options,
                                         absl::MakeSpan(logits), absl::MakeSpan(&outcome, 1)));
    const int32_t target = c.tokens[i + 1];
    ++totals.tokens;
    totals.exited += outcome.backbone_layers < config.n_layers;
    totals.backbone_layers += outcome.backbone_layers;
    totals.agreed += Argmax(logits) == target;
    totals.nll += Nll(logits, target);
    totals.bytes +=
        static_cast<double>(DecodeStepWeightBytes(model, river, outcome.backbone_layers));
  }
  totals.decode_time += absl::Now() - start;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<EvalExitRow>> RunEvalExit(const LlamaModel& model,
                                                     const Tokenizer& tokenizer,
                                                     const River& river,
                                                     const EvalExitOptions& options) {
  const LlamaConfig& config = model.config();
  if (options.prompts.empty()) return absl::InvalidArgumentError("no prompts");
  if (options.max_tokens < 2) return absl::InvalidArgumentError("--max-tokens must be >= 2");
  ESTUARY_RETURN_IF_ERROR(options.policy.Validate(config.n_layers));
  if (river.first_layer() != 0) {
    return absl::InvalidArgumentError("eval-exit needs a river over every layer");
  }

  // Full-depth greedy continuations.
  std::vector<Continuation> continuations;
  for (const std::string& text : options.prompts) {
    Continuation c;
    ESTUARY_ASSIGN_OR_RETURN(c.prompt, tokenizer.Encode(text, /*add_bos=*/true));
    GenerateRequest request;
    request.prompt_ids = c.prompt;
    request.max_tokens = std::min(options.max_tokens,
                                  config.max_seq_len - static_cast<int>(c.prompt.size()));
    request.sampling.temperature = 0.0f;
    ESTUARY_ASSIGN_OR_RETURN(GenerateResult result, Generate(model, request));
    c.tokens = std::move(result.completion_ids);
    if (c.tokens.size() >= 2) continuations.push_back(std::move(c));
  }
  if (continuations.empty()) return absl::InvalidArgumentError("no continuation of 2+ tokens");

  // Full depth: the reference NLL and time.
  ModeTotals full;
  for (const Continuation& c : continuations) {
    ESTUARY_RETURN_IF_ERROR(TeacherForce(model, nullptr, options.policy, 2.0f, c, nullptr, full));
  }

  struct Mode {
    std::string name;
    float tau;
    ExitPolicy policy;
  };
  std::vector<Mode> modes;
  for (float tau : options.taus) modes.push_back({absl::StrCat(tau), tau, options.policy});
  ExitPolicy all_river = options.policy;
  all_river.min_backbone_layers = 0;
  all_river.max_backbone_layers = 0;
  modes.push_back({"full-int4", -1.0f, all_river});

  std::vector<EvalExitRow> rows;
  for (const Mode& mode : modes) {
    ModeTotals totals;
    KvFidelityProbe probe(model);
    for (const Continuation& c : continuations) {
      ESTUARY_RETURN_IF_ERROR(TeacherForce(model, &river, mode.policy, mode.tau, c, &probe, totals));
    }
    const double n = static_cast<double>(totals.tokens);
    EvalExitRow row;
    row.tau = mode.name;
    row.tokens = totals.tokens;
    row.mean_backbone_layers = totals.backbone_layers / n;
    row.exit_rate = static_cast<double>(totals.exited) / n;
    row.top1_agreement = static_cast<double>(totals.agreed) / n;
    row.nll_delta = totals.nll / n - full.nll / static_cast<double>(full.tokens);
    row.kv_cosine_min = probe.MinMeanCosine();
    row.modeled_bytes_ratio = totals.bytes / full.bytes;
    row.measured_speedup = absl::ToDoubleSeconds(full.decode_time) /
                           std::max(1e-12, absl::ToDoubleSeconds(totals.decode_time));
    rows.push_back(row);
  }
  return rows;
}

std::string EvalExitJson(const std::vector<EvalExitRow>& rows) {
  nlohmann::ordered_json out;
  out["rows"] = nlohmann::ordered_json::array();
  for (const EvalExitRow& r : rows) {
    nlohmann::ordered_json row;
    char* end = nullptr;
    const double tau = std::strtod(r.tau.c_str(), &end);
    if (end != nullptr && *end == '\0') {
      row["tau"] = tau;
    } else {
      row["tau"] = r.tau;
    }
    row["mean_backbone_layers"] = r.mean_backbone_layers;
    row["exit_rate"] = r.exit_rate;
    row["top1_agreement"] = r.top1_agreement;
    row["nll_delta"] = r.nll_delta;
    row["kv_cosine_min"] = r.kv_cosine_min;
    row["modeled_bytes_ratio"] = r.modeled_bytes_ratio;
    row["measured_speedup"] = r.measured_speedup;
    row["tokens"] = r.tokens;
    out["rows"].push_back(row);
  }
  return out.dump();
}

std::string EvalExitTable(const std::vector<EvalExitRow>& rows) {
  std::string table = absl::StrFormat("%-10s %9s %9s %9s %10s %9s %9s %9s\n", "tau",
                                      "backbone", "exit", "top1", "nll_delta", "kv_cos",
                                      "bytes", "speedup");
  for (const EvalExitRow& r : rows) {
    absl::StrAppendFormat(&table, "%-10s %9.2f %9.3f %9.3f %10.4f %9.4f %9.3f %9.2f\n", r.tau,
                          r.mean_backbone_layers, r.exit_rate, r.top1_agreement, r.nll_delta,
                          r.kv_cosine_min, r.modeled_bytes_ratio, r.measured_speedup);
  }
  return table;
}

}  // namespace estuary
