#include "core/model/forward_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/decoder_layer.h"
#include "core/model/linear.h"

namespace estuary {
namespace {

absl::Status ValidateEntries(const LlamaModel& model, const River* river,
                             absl::Span<const BatchEntry> entries, absl::Span<float> logits,
                             absl::Span<EntryOutcome> outcomes) {
  const LlamaConfig& c = model.config();
  if (entries.empty()) return absl::InvalidArgumentError("empty batch");
  if (outcomes.size() != entries.size()) {
    return absl::InvalidArgumentError("one outcome per batch entry is needed");
  }
  size_t with_logits = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    const BatchEntry& entry = entries[e];
    if (entry.tokens.empty() || entry.kv == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, " has no tokens or KV"));
    }
    const int64_t end = int64_t{entry.start_pos} + static_cast<int64_t>(entry.tokens.size());
    if (entry.start_pos < 0 || end > entry.kv->capacity() || end > c.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch entry ", e, ": positions [", entry.start_pos, ", ", end,
          ") exceed the KV capacity ", entry.kv->capacity(), " or the context ", c.max_seq_len));
    }
    if (entry.start_layer < 0 || entry.start_layer >= c.n_layers ||
        (entry.start_layer > 0) != (entry.start_hidden != nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch entry ", e, ": start layer ", entry.start_layer, " must be in [0, ", c.n_layers,
          ") and come with its hidden states exactly when above 0"));
    }
    if (entry.start_layer > 0 && river != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry ", e, " resumes at a layer: such a step runs no river"));
    }
    if (entry.max_backbone_layers < -1 || entry.max_backbone_layers > c.n_layers ||
        (entry.max_backbone_layers >= 0 && river == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch entry ", e, ": max backbone layers ", entry.max_backbone_layers,
          " must be -1 or in [0, ", c.n_layers, "], and a cap needs a river"));
    }
    if (entry.layer_inputs != nullptr && entry.tokens.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry ", e, " saves its layer inputs but has ",
                       entry.tokens.size(), " tokens (one is needed)"));
    }
    if (entry.want_logits) with_logits += entry.logits_every_token ? entry.tokens.size() : 1;
  }
  if (logits.size() != with_logits * static_cast<size_t>(c.vocab_size)) {
    return absl::InvalidArgumentError("logits buffer does not match the entries wanting logits");
  }
  return absl::OkStatus();
}

// The rows of `x` ([rows][dim]) that belong to the selected entries, gathered contiguously.
struct Group {
  std::vector<const BatchEntry*> entries;
  std::vector<size_t> entry_index;  // into the batch
  std::vector<float> x;             // [group rows][dim]
  int64_t rows = 0;
};

void Gather(absl::Span<const BatchEntry> entries, const std::vector<int64_t>& row_offset,
            const std::vector<bool>& select, const std::vector<float>& x, int64_t dim,
            Group& group) {
  group = Group();
  for (size_t e = 0; e < entries.size(); ++e) {
    if (!select[e]) continue;
    const int64_t n = static_cast<int64_t>(entries[e].tokens.size());
    group.entries.push_back(&entries[e]);
    group.entry_index.push_back(e);
    group.x.insert(group.x.end(), x.begin() + row_offset[e] * dim,
                   x.begin() + (row_offset[e] + n) * dim);
    group.rows += n;
  }
}

void Scatter(const Group& group, const std::vector<int64_t>& row_offset, int64_t dim,
             std::vector<float>& x) {
  int64_t row = 0;
  for (size_t g = 0; g < group.entries.size(); ++g) {
    const int64_t n = static_cast<int64_t>(group.entries[g]->tokens.size());
    std::copy_n(group.x.begin() + row * dim, n * dim,
                x.begin() + row_offset[group.entry_index[g]] * dim);
    row += n;
  }
}

// Whether a token that ran `backbone_layers` of `n_layers` on the backbone reads the river's LM
// head (it left the backbone, and the river has a head of its own) rather than the backbone's.
bool ReadsRiverLmHead(const River* river, int backbone_layers, int n_layers) {
  return river != nullptr && river->lm_head() != nullptr && backbone_layers < n_layers;
}

// The final norm and LM head over the rows `rows` of x ([rows][dim]), in order, into logits
// ([rows.size()][vocab]): rows with on_river_head[i] through the river's int4 head, the others
// through the backbone's; one matmul per head.
absl::Status ApplyLmHeads(const LlamaModel& model, const River* river, const std::vector<float>& x,
                          const std::vector<int64_t>& rows, const std::vector<bool>& on_river_head,
                          const kernels::cpu::MatMulOptions& matmul, absl::Span<float> logits) {
  const LlamaConfig& c = model.config();
  const int64_t dim = c.dim;
  const int64_t vocab = c.vocab_size;
  for (const bool river_head : {false, true}) {
    std::vector<int64_t> picked;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (on_river_head[i] == river_head) picked.push_back(static_cast<int64_t>(i));
    }
    if (picked.empty()) continue;
    const int64_t n = static_cast<int64_t>(picked.size());
    std::vector<float> gathered(static_cast<size_t>(n * dim));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x.begin() + rows[static_cast<size_t>(picked[i])] * dim, dim,
                  gathered.begin() + i * dim);
    }
    std::vector<float> normed(gathered.size());
    kernels::cpu::RmsNorm(gathered.data(), model.weights().final_norm, n, dim, c.rms_eps,
                          normed.data());
    const Linear head = river_head ? Linear::Int4(*river->lm_head())
                                   : Linear::Dense(model.weights().lm_head);
    // Straight into logits when this head serves every row (the usual case), else row by row.
    const bool all_rows = n == static_cast<int64_t>(rows.size());
    std::vector<float> own(all_rows ? 0 : static_cast<size_t>(n * vocab));
    float* out = all_rows ? logits.data() : own.data();
    ESTUARY_RETURN_IF_ERROR(head.Apply(normed.data(), n, out, matmul));
    if (!all_rows) {
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(own.begin() + i * vocab, vocab, logits.begin() + picked[i] * vocab);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DecodeStepWeightBytes(const LlamaModel& model, const River* river, int backbone_layers) {
  int64_t bytes = ReadsRiverLmHead(river, backbone_layers, model.config().n_layers)
                      ? river->lm_head()->bytes()
                      : static_cast<int64_t>(model.weights().lm_head.nbytes());
  for (int l = 0; l < model.config().n_layers; ++l) {
    bytes += l < backbone_layers ? model.layer_bytes(l) : river->layer_bytes(l);
  }
  return bytes;
}

absl::Status ForwardBatch(const LlamaModel& model, absl::Span<const BatchEntry> entries,
                          const ForwardOptions& options, absl::Span<float> logits,
                          absl::Span<EntryOutcome> outcomes) {
  namespace k = kernels::cpu;
  const River* river = options.river;
  ESTUARY_RETURN_IF_ERROR(ValidateEntries(model, river, entries, logits, outcomes));
  const LlamaConfig& c = model.config();
  const int n_layers = c.n_layers;
  const int64_t dim = c.dim;
  if (river != nullptr) ESTUARY_RETURN_IF_ERROR(options.policy.Validate(n_layers));
  const int forced_exit = std::min(
      river != nullptr ? options.policy.ForcedExitAfter(n_layers) : n_layers,
      model.resident_layers());
  if (forced_exit < n_layers && river == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "only ", model.resident_layers(), " of ", n_layers,
        " backbone layers are resident and no exit river was given"));
  }

  // Embed every token of the batch: x is [rows][dim], entries' tokens in order.
  std::vector<int64_t> row_offset(entries.size());
  std::vector<int32_t> all_tokens;
  for (size_t e = 0; e < entries.size(); ++e) {
    row_offset[e] = static_cast<int64_t>(all_tokens.size());
    all_tokens.insert(all_tokens.end(), entries[e].tokens.begin(), entries[e].tokens.end());
  }
  const int64_t rows = static_cast<int64_t>(all_tokens.size());
  std::vector<float> x(rows * dim);
  // Every layer's scratch, for this pass only.
  ESTUARY_ASSIGN_OR_RETURN(LayerActivations activations, LayerActivations::Allocate(model, rows));
  ESTUARY_RETURN_IF_ERROR(k::Embedding(model.weights().embedding, all_tokens, x.data()));
  for (size_t e = 0; e < entries.size(); ++e) {
    if (entries[e].start_hidden == nullptr) continue;
    std::copy_n(entries[e].start_hidden, static_cast<int64_t>(entries[e].tokens.size()) * dim,
                x.begin() + row_offset[e] * dim);
  }

  std::vector<bool> on_river(entries.size(), false);
  std::vector<bool> passed(entries.size(), false);  // kAllPassed: passed τ at some layer
  for (EntryOutcome& o : outcomes) o.backbone_layers = n_layers;
  std::vector<float> similarity(entries.size());
  Group group;

  for (int l = 0; l < n_layers; ++l) {
    // Exit decisions before layer l, from the similarity of layer l - 1 (absorbing).
    const bool forced = l >= forced_exit;
    const bool may_exit = river != nullptr && l >= std::max(1, options.policy.min_backbone_layers);
    const ExitRule rule = options.policy.rule;
    float batch_margin = std::numeric_limits<float>::infinity();
    if (may_exit && rule == ExitRule::kBatchMin) {
      for (size_t e = 0; e < entries.size(); ++e) {
        if (!on_river[e]) {
          batch_margin = std::min(batch_margin, similarity[e] - entries[e].exit_threshold);
        }
      }
    }
    if (may_exit && rule == ExitRule::kAllPassed) {
      bool all = true;
      for (size_t e = 0; e < entries.size(); ++e) {
        if (on_river[e]) continue;
        if (similarity[e] - entries[e].exit_threshold > 0.0f) passed[e] = true;  // NaN: not
        all = all && passed[e];
      }
      batch_margin = all ? 1.0f : -1.0f;
    }
    for (size_t e = 0; e < entries.size(); ++e) {
      if (on_river[e]) continue;
      const float margin = rule == ExitRule::kSplit ? similarity[e] - entries[e].exit_threshold
                                                    : batch_margin;
      const bool capped =
          entries[e].max_backbone_layers >= 0 && l >= entries[e].max_backbone_layers;
      if (forced || capped || (may_exit && margin > 0.0f)) {
        on_river[e] = true;
        outcomes[e].backbone_layers = l;
      }
    }
    if (river != nullptr && !river->has_layer(l) &&
        std::any_of(on_river.begin(), on_river.end(), [](bool b) { return b; })) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l, " has no river copy (river starts at layer ",
                       river->first_layer(), ")"));
    }

    // Backbone group (the entries that have reached their start layer): keep the input for the
    // similarity.
    std::vector<bool> backbone(entries.size());
    for (size_t e = 0; e < entries.size(); ++e) {
      backbone[e] = !on_river[e] && l >= entries[e].start_layer;
      if (entries[e].layer_inputs != nullptr && (backbone[e] || outcomes[e].backbone_layers == l)) {
        std::copy_n(x.begin() + row_offset[e] * dim, dim, entries[e].layer_inputs + l * dim);
      }
    }
    Gather(entries, row_offset, backbone, x, dim, group);
    if (group.rows > 0) {
      const std::vector<float> h_in = group.x;
      ESTUARY_RETURN_IF_ERROR(RunDecoderLayer(model, l, model.backbone_projections(l), options,
                                              group.entries, group.x.data(), group.rows,
                                              activations));
      int64_t row = 0;
      for (size_t g = 0; g < group.entries.size(); ++g) {
        const int64_t n = static_cast<int64_t>(group.entries[g]->tokens.size());
        float s = std::numeric_limits<float>::infinity();
        for (int64_t t = row; t < row + n; ++t) {
          s = std::min(s, static_cast<float>(k::CosineSimilarity(h_in.data() + t * dim,
                                                                  group.x.data() + t * dim, dim)));
        }
        similarity[group.entry_index[g]] = s;
        row += n;
      }
      Scatter(group, row_offset, dim, x);
      if (options.probe != nullptr) options.probe->OnBackboneLayer(l, similarity);
    }

    // River group.
    Gather(entries, row_offset, on_river, x, dim, group);
    if (group.rows > 0) {
      KvTap tap;
      if (options.probe != nullptr) {
        tap = [&](int g, const float* normed, const float* kk, const float* vv) {
          const BatchEntry& e = *group.entries[static_cast<size_t>(g)];
          options.probe->OnRiverLayer(l, static_cast<int>(group.entry_index[static_cast<size_t>(g)]),
                                      static_cast<int>(e.tokens.size()), e.start_pos, normed, kk,
                                      vv);
        };
      }
      ESTUARY_RETURN_IF_ERROR(RunDecoderLayer(model, l, river->projections(l), options,
                                              group.entries, group.x.data(), group.rows,
                                              activations, tap));
      Scatter(group, row_offset, dim, x);
    }
    if (options.on_layer_done) options.on_layer_done(l);
  }

  // Provenance of every written position: its last backbone layer.
  for (size_t e = 0; e < entries.size(); ++e) {
    const int ran = outcomes[e].backbone_layers;
    const uint8_t provenance = ran == n_layers ? kProvenanceFullDepth
                               : ran == 0      ? kProvenanceNoBackbone
                                               : static_cast<uint8_t>(ran - 1);
    for (size_t t = 0; t < entries[e].tokens.size(); ++t) {
      entries[e].kv->SetProvenance(entries[e].start_pos + static_cast<int>(t), provenance);
    }
  }

  // Final norm and LM head for the last token (or every token) of each entry that wants logits.
  // An entry that left the backbone reads the river's head when the river has one (river.h).
  std::vector<int64_t> head_rows;
  std::vector<bool> on_river_head;
  for (size_t e = 0; e < entries.size(); ++e) {
    if (!entries[e].want_logits) continue;
    const int64_t end = row_offset[e] + static_cast<int64_t>(entries[e].tokens.size());
    const int64_t first = entries[e].logits_every_token ? row_offset[e] : end - 1;
    const bool river_head = ReadsRiverLmHead(river, outcomes[e].backbone_layers, n_layers);
    for (int64_t row = first; row < end; ++row) {
      head_rows.push_back(row);
      on_river_head.push_back(river_head);
    }
  }
  return ApplyLmHeads(model, river, x, head_rows, on_river_head, options.matmul, logits);
}

}  // namespace estuary
