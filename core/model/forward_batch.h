#pragma once
// ForwardBatch: one forward step over several sequences at once, each contributing a run of
// consecutive tokens (one token for a decode step, many for a prefill chunk), with the exit river
// (design §5). This is the only implementation of the Llama forward pass: LlamaModel::Forward,
// the decode engine and `estuary eval-exit` all call it.
//
// Per layer, every sequence runs either the backbone (dense weights) or, once it has exited, the
// river (int4). After each backbone layer the state-transition similarity s = cos(h_in, h_out)
// of each token decides exits under ExitPolicy. A sequence's similarity is the minimum over its
// tokens, so a prefill chunk exits only when all its tokens would. KV of every layer is written
// through the sequence's KvView, whichever path computed it, and each position's provenance
// records its last backbone layer.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/exit_policy.h"
#include "core/model/kv_view.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/parallel/communicator.h"

namespace estuary {

struct BatchEntry {
  absl::Span<const int32_t> tokens;  // non-empty; ids inside the vocabulary
  int start_pos = 0;                 // position of tokens[0]
  KvView* kv = nullptr;              // the sequence's cache; capacity >= start_pos + size
  float exit_threshold = 2.0f;       // τ of this request; above 1 never exits
  // This entry leaves the backbone after at most this many layers (a forced exit, as
  // ExitPolicy::max_backbone_layers but for this entry alone; needs a river); -1: the policy's
  // only. The lossless mode's drafts (LosslessOptions::draft_backbone_layers).
  int max_backbone_layers = -1;
  bool want_logits = true;           // logits of the last token
  // With want_logits: logits of every token of the entry (tokens.size() rows, in token order)
  // instead of the last one's. Lossless verification (core/model/self_speculative.h) reads them.
  bool logits_every_token = false;
  // Resume: the tokens enter layer `start_layer` with the hidden states `start_hidden`
  // ([tokens][dim], the residual stream entering that layer) instead of their embeddings, and
  // the layers below are not run for this entry: their KV must already be the backbone's (the
  // draft steps of self-speculative decoding wrote it). Runs on the backbone only (no river in
  // the step). 0 / null: from the embedding.
  int start_layer = 0;
  const float* start_hidden = nullptr;
  // For an entry of one token: when set, receives ([n_layers][dim] floats) the residual stream
  // entering every layer l <= min(backbone_layers, n_layers - 1), i.e. each layer the token ran
  // on the backbone and the first one after its exit; later rows are left as they are. What a
  // later resumed step starts from.
  float* layer_inputs = nullptr;
};

struct EntryOutcome {
  int backbone_layers = 0;  // layers run on the backbone (n_layers when it never exited)
  // Argmax of the last token's logits, when the forward computed it (the GPU path does, also for
  // entries without want_logits, so greedy requests need no logits download); -1 otherwise.
  int32_t argmax = -1;
};

// Optional observer for evaluation (eval-exit): sees each layer's result per entry. Not called
// on the serving path unless set.
class ForwardProbe {
 public:
  virtual ~ForwardProbe() = default;
  // After `layer` ran on the river for entry `e`: the river's K and V of its tokens, and the
  // layer input (normalized) so the probe can compute what the backbone would have written.
  virtual void OnRiverLayer(int layer, int entry, int n_tokens, int start_pos,
                            const float* normed_input, const float* k, const float* v) {}
  // After a backbone layer: per-entry similarity (min over the entry's tokens).
  virtual void OnBackboneLayer(int layer, absl::Span<const float> similarity) {}
};

struct ForwardOptions {
  const River* river = nullptr;  // no river: every layer on the backbone
  ExitPolicy policy;
  ForwardProbe* probe = nullptr;
  // Dense projection kernels (prefill asks for kBatchInvariant; decode keeps kFastest).
  kernels::cpu::MatMulOptions matmul;
  // Tensor parallelism: when set, `model` (and `river`) are this rank's shard and the partial
  // outputs of the o and down projections are all-reduced over `comm`, each collective waiting
  // at most `collective_timeout`. A failed collective fails the step.
  parallel::Communicator* comm = nullptr;
  absl::Duration collective_timeout = absl::Seconds(30);
  // Called after layer `layer` has written the KV of every entry (both paths), in layer order:
  // the per-layer completion event that KV transfer pushes on.
  std::function<void(int layer)> on_layer_done;
};

// Weight bytes one decode step reads when its tokens run `backbone_layers` layers on the
// backbone and the rest on `river` (null only with backbone_layers == n_layers): every layer's
// projections on their path plus the LM head they read (the river's own when it has one and the
// tokens exited). The cost model of eval-exit and bench-decode.
int64_t DecodeStepWeightBytes(const LlamaModel& model, const River* river, int backbone_layers);

// Runs the step. `logits` holds vocab_size floats per entry with want_logits, in entry order
// (per token with logits_every_token); an entry that exited gets them from the river's LM head
// when the river has one (River::lm_head), else from the backbone's.
// `outcomes` has one element per entry. INVALID_ARGUMENT for bad ids, positions or sizes;
// FAILED_PRECONDITION when a forced exit needs a river layer the river lacks.
absl::Status ForwardBatch(const LlamaModel& model, absl::Span<const BatchEntry> entries,
                          const ForwardOptions& options, absl::Span<float> logits,
                          absl::Span<EntryOutcome> outcomes);

}  // namespace estuary
