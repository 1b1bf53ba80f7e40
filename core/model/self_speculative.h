#pragma once
// The lossless exit river (issue 16): self-speculative decoding of one sequence on a
// ShardedModel. The river path (backbone until the exit, then the int4 remainder) drafts up to
// k tokens one step at a time; one batched backbone pass over the drafted positions verifies
// them, so the output is the full model's: token for token under greedy decoding, in
// distribution under sampling (speculative sampling: accept a draft d with probability
// min(1, p(d) / q(d)), otherwise draw from the normalised residual max(0, p - q)).
//
// Verification reuses what the drafts already computed exactly. Every draft ran layers below its
// exit on the backbone, reading KV that earlier drafts also wrote on the backbone below their
// exits, so below m = the smallest exit of the round both the KV and the residual stream are
// the full model's. The verification pass therefore resumes at layer m from the residual stream
// each draft saved there (BatchEntry::start_layer / layer_inputs), runs the layers above on the
// backbone and overwrites the river-written KV of every drafted position. Rejected positions
// are simply written again by the next round (one contiguous cache per rank).
//
// Exactness: every step runs the batch-invariant kernels (StepOptions::chunk_invariant), so a
// token's row is bitwise what it would be in a one-token step: the output equals full-depth
// decoding with those kernels bit for bit, and the fastest kernels' full depth wherever their
// rounding does not flip an argmax (the tests check both on every golden case).
//
// A round verifies the pending token and the drafts but the last (resumed at m), and the last
// draft from layer 0 (no draft step ran it; one row through m layers), in one forward pass:
// when every draft is accepted, the full model's token after the last draft is the bonus
// token, so a round of k drafts emits between 1 and k + 1 tokens. Where max_tokens or the
// context leaves no room for a bonus token (or the last draft ends the sequence), the last
// draft's row is left out: an accepted last draft becomes the next round's pending token.
//
// Dynamic draft length: drafting stops after a draft whose own probability under the river is
// below min_draft_confidence, or that would end the sequence; with adapt_draft_length, k grows
// by 2 after a fully accepted round and shrinks by 1 otherwise, within [1, max_draft_tokens].
// Rounds without drafts (LosslessOptions::drafting): the pending token at full depth; with
// Drafting::kAuto each call times its rounds and drafts while that is cheaper per token
// (DraftPayoff, one for the call's batch).

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

#include "absl/status/statusor.h"
#include "core/model/exit_policy.h"
#include "core/model/generator.h"
#include "core/model/lossless_round.h"
#include "core/model/sharded_model.h"

namespace estuary {

// Generates like Generate(ShardedModel&, ...) but losslessly through the river; fills
// GenerateResult's draft_tokens, accepted_tokens and verifications (backbone_layers stays
// empty: every kept token is the backbone's). FAILED_PRECONDITION without a river
// (ShardedModel::BuildRiver); INVALID_ARGUMENT as Generate and LosslessOptions::Validate.
absl::StatusOr<GenerateResult> GenerateLossless(ShardedModel& model, const GenerateRequest& request,
                                                const LosslessOptions& options,
                                                const TokenCallback& on_token = nullptr);

// The same for several independent sequences decoded together: their prefill is one pass, and
// each round's draft steps and verification are one forward pass over the sequences still in
// them (each with its own draft length and resume layer), so the weights are read once per
// step for the whole batch. Results in request order; the error names the request. Greedy output
// is each sequence's full-model output whatever the batch; under a batch-wide exit rule
// (batch_min, all_passed) the drafts' exits depend on the batch, so a seeded sampled sequence
// draws the same distribution but not the same tokens as alone (kSplit keeps them equal).
absl::StatusOr<std::vector<GenerateResult>> GenerateLosslessBatch(
    ShardedModel& model, absl::Span<const GenerateRequest> requests,
    const LosslessOptions& options);

}  // namespace estuary
